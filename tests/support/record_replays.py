"""Re-record the example runs shipped in ``replays/`` against the local test LLM server.

Run by hand from the repository root::

    python -m tests.support.record_replays                  # every example
    python -m tests.support.record_replays ticket-triage    # some of them

Each example runs with the real ``graphrun`` command in a fresh database and config
directory; its LLM calls go to the fake server of ``tests/support/fake_llm.py`` on
127.0.0.1, which answers with the replies below (those the example's tests check).
The run is then exported with ``graphrun export RUN -o replays/NAME.run.jsonl``:
paths relative to the file, no host name, OS account or pid. The run ids, times and
the server's port change with every recording; the requests, answers and outputs do
not. ``replays/format-v1*`` are files in the old export format, kept as they are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.fake_llm import FakeLlm, RecordedRequest, Reply, last_user_text, text

ROOT = Path(__file__).resolve().parents[2]
REPLAYS = ROOT / "replays"


@dataclass(frozen=True)
class Example:
    """How one shipped recording is made: the command's arguments after ``run``."""

    args: tuple[str, ...]
    #: The fake server's replies, in order (None: the example makes no LLM call).
    replies: Callable[[], list[Reply]] | None = None
    #: Or a reply chosen by what each request asks (parallel branches, any order).
    answer: Callable[[RecordedRequest], Reply] | None = None
    env: dict[str, str] = field(default_factory=dict)


# --- file-triage: scripts only --------------------------------------------------------

FILE_TRIAGE = Example(("examples/file-triage",))

# --- handbook-qa: retrieval (offline embedder) and one llm call -----------------------

HANDBOOK_QUESTION = "How many days of annual leave do I get, and how many can I carry over?"
HANDBOOK_ANSWER = {
    "answer": "You get 25 days of paid annual leave per calendar year, plus public "
    "holidays. Up to 5 unused days carry over into the next year and expire on 31 March.",
    "confident": True,
}
HANDBOOK_QA = Example(
    ("examples/handbook-qa", HANDBOOK_QUESTION),
    replies=lambda: [text(json.dumps(HANDBOOK_ANSWER))],
)

# --- release-checklist: scripts and approvals, answered by alice -------------------------

RELEASE_CHECKLIST = Example(
    (
        "examples/release-checklist",
        "Prepare release 2.4.0",
        "--as",
        "alice",
        "--other",
        "review=Not yet: the config rename needs upgrade notes",
        "--answer",
        "clarify=add upgrade notes for cache.dir -> cache.path",
        "--answer",
        "review=approve",
    )
)

# --- research-desk and ticket-triage: the replies their tests check ----------------------


def _research_desk_replies() -> list[Reply]:
    from tests.integration.test_agents_example import replies

    return replies()


def _research_desk_request() -> str:
    from tests.integration.test_agents_example import REQUEST

    return REQUEST


def _ticket_triage_replies() -> list[Reply]:
    from tests.integration.test_llm_example import REPLIES

    return list(REPLIES)


def _ticket() -> str:
    from tests.integration.test_llm_example import PROMPT

    return PROMPT


# --- source-survey: a map whose answers arrive in any order -----------------------------

SURVEY_PROMPT = "Should a small bakery switch to an electric oven?"
SURVEY_ANSWERS = {
    "energy": "An electric deck oven uses about 30-40 kWh on a baking day; at today's "
    "tariffs that costs slightly more than gas but far less than it did in 2022.",
    "quality": "Bakers report crust and oven spring on par with gas deck ovens once the "
    "stone is fully heated; steam injection matters more than the fuel.",
    "cost": "A new three-deck electric oven costs 18,000-30,000 EUR installed, and many "
    "regions subsidise the switch away from gas for small businesses.",
    "grid": "A three-deck oven draws 20-30 kW, which usually needs a three-phase supply "
    "upgrade; ask the grid operator before ordering.",
}


def _survey_reply(request: RecordedRequest) -> Reply:
    """By what the request asks, so the recording is the same whatever order the
    branches run in."""
    body = request.body
    system = next(
        (m.get("content", "") for m in body.get("messages", []) if m.get("role") == "system"),
        "",
    )
    if "research editor" in system:
        questions = [
            "How much energy does an electric deck oven use compared with gas?",
            "Does an electric oven change bread quality?",
            "What does switching cost, and are there subsidies?",
            "What does the electricity grid connection need?",
        ]
        return text(json.dumps({"questions": questions}), delay=0.05)
    if "careful researcher" in system:
        asked = last_user_text(body).lower()
        key = next((k for k in ("energy", "quality", "cost") if k in asked), "grid")
        return text(SURVEY_ANSWERS[key], delay=0.05)
    return text(
        "Switching is practical: bread quality holds, running costs are close to gas, and "
        "subsidies cover part of the oven, but budget for a three-phase grid upgrade.",
        delay=0.05,
    )


def examples() -> dict[str, Example]:
    """Every shipped recording but the old-format ones, by file stem."""
    return {
        "file-triage": FILE_TRIAGE,
        "handbook-qa": HANDBOOK_QA,
        "release-checklist": RELEASE_CHECKLIST,
        "research-desk": Example(
            (
                "examples/research-desk",
                _research_desk_request(),
                "--agents-dir",
                "examples/research-desk/agents",
            ),
            replies=_research_desk_replies,
        ),
        "ticket-triage": Example(
            ("examples/ticket-triage", _ticket()), replies=_ticket_triage_replies
        ),
        "source-survey": Example(("examples/source-survey", SURVEY_PROMPT), answer=_survey_reply),
    }


def _env(tmp: Path) -> dict[str, str]:
    """The environment of one recording: nothing of the user's config, agents,
    database, keys or proxies."""
    env = dict(os.environ)
    for key in (
        "GRAPHRUN_AGENTS_DIR",
        "LOKI_CONFIG_DIR",
        "GRAPHRUN_LOG",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_BASE_URL",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ):
        env.pop(key, None)
    env["GRAPHRUN_CONFIG_DIR"] = str(tmp / "config")
    env["GRAPHRUN_DB"] = str(tmp / "events.db")
    env["GRAPHRUN_NO_TTY"] = "1"
    return env


def record(name: str, example: Example, out: Path) -> str:
    """Run ``example`` against a fresh fake server, export it to ``out``; the run id."""
    graphrun = [sys.executable, "-m", "graphrun.cli"]
    with FakeLlm() as fake, tempfile.TemporaryDirectory() as tmp:
        env = _env(Path(tmp))
        if example.replies is not None or example.answer is not None:
            env["OPENAI_BASE_URL"] = fake.url_openai
            env["OPENAI_API_KEY"] = "test-key"
        if example.replies is not None:
            fake.script(*example.replies())
        fake.default = example.answer
        done = subprocess.run(
            [*graphrun, "run", *example.args, "--json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"{name}: the run failed (exit {done.returncode}):\n{done.stderr}")
        if fake.pending:
            raise SystemExit(f"{name}: {fake.pending} scripted replies were not asked for")
        run_id = str(json.loads(done.stdout)["run_id"])
        subprocess.run(
            [*graphrun, "export", run_id, "-o", os.path.relpath(out, ROOT)],
            cwd=ROOT,
            env=env,
            check=True,
        )
    return run_id


def main(argv: list[str] | None = None) -> int:
    names = list(sys.argv[1:] if argv is None else argv)
    known = examples()
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"no such recording: {', '.join(unknown)} (known: {', '.join(known)})")
        return 2
    for name in names or list(known):
        out = REPLAYS / f"{name}.run.jsonl"
        run_id = record(name, known[name], out)
        print(f"recorded run {run_id} to {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
