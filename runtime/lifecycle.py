"""Run lifecycle operations outside the driver loop: cancel and fork."""

from __future__ import annotations

import msgspec

from graphrun.eventstore.events import ChildCancelled, Event, RunCancelled, RunResumed, RunStarted
from graphrun.eventstore.fold import fold
from graphrun.eventstore.ids import new_run_id
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.errors import AnswerError, UsageError
from graphrun.runtime.supervisor import whoami


def cancel_run(store: SqliteStore, run_id: str, *, reason: str, by: str | None = None) -> list[str]:
    """Cancel a run and, recursively, its still-running children. Returns the ids cancelled."""
    state = fold(store.read(run_id))
    if state.terminal:
        raise AnswerError(f"run {run_id} has already {state.status}")
    cancelled: list[str] = []
    with store.leased(run_id):
        for child, status in state.children.items():
            if status == "running" and store.has_run(child):
                child_state = fold(store.read(child))
                if not child_state.terminal:
                    cancelled += cancel_run(
                        store, child, reason=f"parent run {run_id} was cancelled", by=by
                    )
                store.append(run_id, [ChildCancelled(child_run_id=child, reason=reason)])
        store.append(run_id, [RunCancelled(reason=reason, by=whoami(by))], sync=True)
    cancelled.append(run_id)
    return cancelled


def fork_run(store: SqliteStore, run_id: str, at_seq: int, *, by: str | None = None) -> str:
    """A new run whose log is ``run_id``'s events ``1..at_seq`` (re-stamped)."""
    events = store.read(run_id, upto=at_seq)
    if at_seq < 1 or not events or events[-1].seq != at_seq:
        last = store.run(run_id).last_seq
        raise UsageError(f"--at {at_seq} is outside run {run_id} (it has events 1..{last})")
    first = events[0]
    assert isinstance(first, RunStarted)
    new_id = new_run_id()
    copied: list[Event] = [
        msgspec.structs.replace(first, forked_from=run_id, forked_at=at_seq, seq=0, ts=first.ts)
    ]
    copied += [msgspec.structs.replace(e, seq=0) for e in events[1:]]
    copied.append(RunResumed(by=whoami(by), reason=f"fork of {run_id} at seq {at_seq}"))
    store.append(new_id, copied)
    return new_id
