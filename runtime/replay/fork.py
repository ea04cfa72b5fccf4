"""Forking a run: a new run that continues another's log from a chosen event.

The prefix is replayed first (through the same driver as a live run), so a fork
never starts between decisions recorded together.
"""

from __future__ import annotations

import msgspec

from graphrun.eventstore.events import Event, RunStarted
from graphrun.eventstore.fold import RunState, fold
from graphrun.eventstore.ids import new_run_id
from graphrun.eventstore.store import Store
from graphrun.runtime.engine.runs import LoadedRun, load_run
from graphrun.runtime.errors import UsageError
from graphrun.runtime.replay.divergence import replay_events


def fork_run(
    store: Store,
    run_id: str,
    at_seq: int,
    *,
    by: str | None = None,
    source: LoadedRun | None = None,
) -> str:
    """A new run whose log is ``run_id``'s events ``1..at_seq``; returns its id.

    The copy keeps the events' times; its ``RunStarted`` records ``forked_from`` and
    ``forked_at``. Driving the new run continues it from there with today's code
    (live, or with other answers). Refused where the prefix cannot be continued:
    between decisions recorded together, inside an agent node whose child run is
    still going, or after the run ended. ``source``: ``run_id`` as the caller
    opened it (:func:`~graphrun.runtime.engine.runs.load_run`), not read again.
    """
    if source is None or source.run_id != run_id:
        source = load_run(store, run_id)  # a fork copies only a log that verifies
    last = source.state.last_seq
    if not 1 <= at_seq <= last:
        raise UsageError(f"--at {at_seq} is outside run {run_id} (it has events 1..{last})")
    events = list(source.events[:at_seq])
    first = events[0]
    assert isinstance(first, RunStarted)
    state: RunState = fold(events)
    if state.terminal:
        raise UsageError(
            f"run {run_id} has already {state.status} at seq {at_seq}: there is nothing to "
            "continue",
            hint="fork at an earlier seq (`graphrun events RUN` lists them)",
        )
    running = [c for c, status in state.children.items() if status == "running"]
    if running and state.current is not None:
        raise UsageError(
            f"seq {at_seq} is inside agent node '{state.current}' while its child run "
            f"{running[0]} is running; a fork cannot share that child",
            hint="fork before the node's ChildRunStarted or after its ChildRunFinished",
        )
    replayed = replay_events(events)
    if replayed.ends_mid_step:
        raise UsageError(
            f"seq {at_seq} splits the decisions of one step of run {run_id} "
            f"({replayed.notes[0] if replayed.notes else 'more follow'})",
            hint=f"fork where a step begins or ends (`graphrun events {run_id}` lists them)",
        )
    new_id = new_run_id()
    copied: list[Event] = [
        msgspec.structs.replace(first, forked_from=run_id, forked_at=at_seq, seq=0, ts=first.ts)
    ]
    copied += [msgspec.structs.replace(e, seq=0) for e in events[1:]]
    store.append(new_id, copied, sync=True)
    return new_id


__all__ = ["fork_run"]
