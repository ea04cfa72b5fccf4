"""Recorded runs as inputs: ``--llm-replay RUN|FILE``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graphrun.eventstore.events import LlmCalled


def load_llm_calls(source: str, store: Any) -> list[LlmCalled]:
    """The ``LlmCalled`` events of a recorded run (by id in ``store``) or an export file,
    including those of its child runs."""
    path = Path(source)
    if path.exists():
        from graphrun.runtime.replay.transfer import read_export

        runs = read_export(path)
        events = [e for run in runs.values() for e in run]
    else:
        run_id = store.resolve_run_id(source) if not store.has_run(source) else source
        events = []
        todo = [run_id]
        while todo:
            current = todo.pop()
            for row in store.runs(parent=current):
                todo.append(row.run_id)
            events.extend(store.read(current))
    return [e for e in events if isinstance(e, LlmCalled) and e.response is not None]
