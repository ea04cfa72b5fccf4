"""``graphrun tail``: watch a run another process drives, by polling its log."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from graphrun.eventstore.fold import fold

#: A run no process drives is given up on after this many looks at it...
IDLE_LOOKS = 3
#: ...and this many seconds at least, however often it is looked at: the process
#: that records a run's start takes its lease a moment later.
IDLE_GRACE_S = 2.0


class Liveness:
    """Whether a watched run is still driven by some process.

    A run is *orphaned* once no live process has held it, and nothing new was
    appended to it, for :data:`IDLE_LOOKS` consecutive looks spanning at least
    :data:`IDLE_GRACE_S` seconds (``tail`` and ``report --watch`` stop watching it)."""

    def __init__(self, store: Any, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.looks = 0
        self.since: float | None = None

    def live(self) -> bool:
        """Whether a live process holds the run now."""
        return bool(self.store.is_live(self.run_id))

    def orphaned(self, moved: bool) -> bool:
        """One more look at the run; ``moved``: something was appended since the last."""
        if moved or self.live():
            self.looks, self.since = 0, None
            return False
        self.looks += 1
        if self.since is None:
            self.since = time.monotonic()
        return self.looks >= IDLE_LOOKS and time.monotonic() - self.since >= IDLE_GRACE_S


def follow(
    store: Any,
    run_id: str,
    *,
    interval: float = 0.5,
    stream: TextIO | None = None,
) -> str:
    """Narrate ``run_id``'s events as they are appended until it ends, waits or is orphaned.

    Returns the status the watch ended on: ``completed``, ``failed``, ``cancelled``,
    ``waiting``, or ``interrupted`` (no process drives the run: see :class:`Liveness`).
    """
    from graphrun.runtime.narrate import Narrator

    narrator = Narrator(stream or sys.stderr)
    events = store.read(run_id)
    state = fold(events)
    narrator(events, state)
    liveness = Liveness(store, run_id)
    while True:
        if state.terminal:
            return state.status
        if state.status == "waiting" and not liveness.live():
            node = state.waiting.node_id if state.waiting else "?"
            narrator.line(f"▸ run {run_id} waits for an answer at {node}")
            return "waiting"
        time.sleep(interval)
        new = store.read(run_id, after=state.last_seq)
        if new:
            state = fold(new, state)
            narrator(new, state)
        if liveness.orphaned(bool(new)) and state.status != "waiting":
            narrator.line(
                f"▸ run {run_id} is interrupted: no process drives it; "
                f"`graphrun resume {run_id}` continues it"
            )
            return "interrupted"


__all__ = ["IDLE_GRACE_S", "IDLE_LOOKS", "Liveness", "follow"]
