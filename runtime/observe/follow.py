"""``graphrun tail``: watch a run another process drives, by polling its log."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from graphrun.eventstore.fold import fold


def follow(
    store: Any,
    run_id: str,
    *,
    interval: float = 0.5,
    stream: TextIO | None = None,
    idle_checks: int = 3,
) -> str:
    """Narrate ``run_id``'s events as they are appended until it ends, waits or is orphaned.

    Returns the status the watch ended on: ``completed``, ``failed``, ``cancelled``,
    ``waiting``, or ``interrupted`` (no live process has held the run for
    ``idle_checks`` consecutive looks and nothing new was appended).
    """
    from graphrun.runtime.narrate import Narrator

    narrator = Narrator(stream or sys.stderr)
    events = store.read(run_id)
    state = fold(events)
    narrator(events, state)
    idle = 0
    while True:
        if state.terminal:
            return state.status
        if state.status == "waiting" and not store.is_live(run_id):
            node = state.waiting.node_id if state.waiting else "?"
            narrator.line(f"▸ run {run_id} waits for an answer at {node}")
            return "waiting"
        time.sleep(interval)
        new = store.read(run_id, after=state.last_seq)
        if new:
            idle = 0
            state = fold(new, state)
            narrator(new, state)
            continue
        if store.is_live(run_id):
            idle = 0
            continue
        idle += 1
        if idle >= idle_checks and state.status != "waiting":
            narrator.line(f"▸ run {run_id} is interrupted: no process drives it")
            return "interrupted"


__all__ = ["follow"]
