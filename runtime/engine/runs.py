"""A run opened once: its log read and verified in one pass, its state folded once.

A command that continues a run (``resume``, ``approve``, ``answer``, ``upgrade``,
``fork``, a worker's claim) opens it with :func:`load_run` and hands the
:class:`LoadedRun` on: the answer checks, the configuration the run began with and
the :class:`~graphrun.runtime.engine.driver.Driver` all take it instead of reading
the log again. What a command appends itself extends it (:meth:`LoadedRun.extended`).

A loaded run is the log as it was when it was read: :func:`still_current` compares
its head with the runs table's (one indexed row, not a read of the log) once the
reader holds the run's lease, and a run another process extended meanwhile is read
again.

The fold starts from the run's snapshot when the store keeps one that the log,
verified as it was read, confirms (:mod:`graphrun.eventstore.snapshots`); a
drive that leaves a run to be continued later (waiting, interrupted) keeps a new
one (:func:`keep_snapshot`), folded from the stored events that follow the last.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from graphrun.eventstore import codec, snapshots
from graphrun.eventstore.errors import CorruptStoreError, GraphrunError
from graphrun.eventstore.events import Event, RunStarted
from graphrun.eventstore.fold import RunState, apply, fold
from graphrun.eventstore.store import Store, broken_log

__all__ = ["LoadedRun", "keep_snapshot", "load_run", "snapshot_problem", "still_current"]

#: Runs left to be continued later in these states keep a snapshot.
_CONTINUED_LATER = ("waiting", "interrupted")


@dataclass(frozen=True)
class LoadedRun:
    """One run's verified events, their fold and their chain hashes."""

    run_id: str
    events: Sequence[Event]
    state: RunState
    #: The chain hash of each seq (what signed decisions and signed heads name).
    hashes: Mapping[int, str] = field(default_factory=dict)

    @property
    def first(self) -> RunStarted:
        first = self.events[0]
        if not isinstance(first, RunStarted):  # a verified log always starts so
            raise CorruptStoreError(f"run {self.run_id} does not begin with RunStarted")
        return first

    @property
    def head(self) -> tuple[int, str | None]:
        """The last seq and its chain hash (None when this process appended it and
        the store did not say)."""
        seq = self.state.last_seq
        return seq, self.hashes.get(seq)

    def extended(self, events: Sequence[Event], *, head_hash: str | None = None) -> LoadedRun:
        """This run after ``events`` (stamped, as the store returned them) were
        appended to it; ``head_hash``: the chain hash of the last of them."""
        state = self.state
        for event in events:
            state = apply(state, event)
        hashes = dict(self.hashes)
        if head_hash is not None and events:
            hashes[events[-1].seq] = head_hash
        return LoadedRun(self.run_id, [*self.events, *events], state, hashes)


def load_run(store: Store, run_id: str) -> LoadedRun:
    """Read ``run_id``'s log once, verifying it as it is read, and fold it once.

    Raises:
        BrokenLogError: The log does not verify (a gap, an edited event, a head the
            store reported and lost, a runs row that disagrees with the events).
        UnknownRunError: There is no such run.
    """
    hashes: dict[int, str] = {}
    events, problem = store.read_verified(run_id, hashes=hashes)
    if problem is not None:
        raise broken_log(run_id, problem)
    kept = getattr(store, "snapshot", None)
    state = snapshots.state_from(kept(run_id), run_id, events, hashes) if kept else None
    return LoadedRun(run_id, events, state if state is not None else fold(events), hashes)


def keep_snapshot(store: Any, run_id: str, status: str) -> bool:
    """Keep a snapshot of ``run_id``'s state at its head when a drive leaves it
    ``status`` and that is one to be continued later (waiting, interrupted): the
    stored events after the last snapshot (all of them, when there is none or it
    no longer fits the log) are read back, each checked against the chain, and
    folded onto it. Whether one was kept; never raises for the store (a snapshot
    is only a shortcut)."""
    if status not in _CONTINUED_LATER or not hasattr(store, "keep_snapshot"):
        return False
    try:
        base = store.snapshot(run_id)
        folded = None
        if base is not None:
            folded = snapshots.fold_stored(run_id, base, store.stored_after(run_id, base[0]))
            if folded is not None and folded[0].last_seq == base[0]:
                return True  # nothing new since
        if folded is None:  # none, or it no longer fits the log: from the start
            folded = snapshots.fold_stored(run_id, None, store.stored_after(run_id, 0))
        if folded is None or folded[0].last_seq == 0:
            return False
        state, head = folded
        encoded = snapshots.encode_state(state, head)
        if encoded is None:
            return False
        body, check = encoded
        return bool(store.keep_snapshot(run_id, state.last_seq, head, body, check))
    except (GraphrunError, msgspec.MsgspecError, NotImplementedError, TypeError, ValueError):
        return False  # a state that does not encode, a store that cannot say


def snapshot_problem(store: Any, run_id: str) -> codec.ChainProblem | None:
    """Whether ``run_id``'s kept snapshot, one its log confirms (the chain hash at its
    seq), holds another state than the fold of the log up to that seq (it was
    edited outside graphrun): where and why, else ``None``. A snapshot the log does
    not confirm is never used, so it is no problem. ``audit --verify`` asks this
    after the chain verified."""
    kept = getattr(store, "snapshot", None)
    row = kept(run_id) if kept is not None else None
    if row is None:
        return None
    hashes: dict[int, str] = {}
    events, problem = store.read_verified(run_id, hashes=hashes)
    seq = row[0]
    if problem is not None or snapshots.state_from(row, run_id, events, hashes) is None:
        return None
    if snapshots.decode_state(row, run_id) == fold(events[:seq]):
        return None
    return codec.ChainProblem(
        seq,
        f"its state snapshot at seq {seq} does not match its events (edited outside "
        "graphrun?); a command that continues the run would start from it",
    )


def still_current(store: Any, loaded: LoadedRun) -> LoadedRun:
    """``loaded`` when the log still ends where it was read (call it holding the
    run's lease), else the run read again."""
    row = store.run(loaded.run_id)
    seq, digest = loaded.head
    if row.last_seq == seq and (digest is None or row.last_hash == digest):
        return loaded
    return load_run(store, loaded.run_id)
