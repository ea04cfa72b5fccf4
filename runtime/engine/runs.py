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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphrun.eventstore.errors import CorruptStoreError
from graphrun.eventstore.events import Event, RunStarted
from graphrun.eventstore.fold import RunState, apply, fold
from graphrun.eventstore.store import Store, broken_log

__all__ = ["LoadedRun", "load_run", "still_current"]


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
    return LoadedRun(run_id, events, fold(events), hashes)


def still_current(store: Any, loaded: LoadedRun) -> LoadedRun:
    """``loaded`` when the log still ends where it was read (call it holding the
    run's lease), else the run read again."""
    row = store.run(loaded.run_id)
    seq, digest = loaded.head
    if row.last_seq == seq and (digest is None or row.last_hash == digest):
        return loaded
    return load_run(store, loaded.run_id)
