"""Re-record ``replays/source-survey.run.jsonl`` against the local test LLM server.

Run by hand from the repository root: ``python -m tests.support.record_source_survey``
(the same as ``python -m tests.support.record_replays source-survey``; see that module).
The server answers by what each request asks (the map's answers arrive in any order),
so the recording is the same whatever order the branches run in.
"""

from __future__ import annotations

from tests.support.record_replays import main

if __name__ == "__main__":
    raise SystemExit(main(["source-survey"]))
