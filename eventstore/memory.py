"""An event store in memory, with the same contract as :class:`SqliteStore`.

It keeps the stored form (canonical bytes, ``prev_hash``, ``hash``) of every event,
so the hash chain, ``verify`` and the ``runs`` projection behave exactly as on
disk. Useful for fast tests and for tools that fold a log without a file.
Several instances can share one :class:`MemoryBackend` to play two processes.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from dataclasses import replace as _replace_lease

import msgspec

from graphrun.eventstore import codec
from graphrun.eventstore.errors import (
    ConcurrentAppendError,
    CorruptStoreError,
    LeaseHeldError,
    UnknownRunError,
)
from graphrun.eventstore.events import Event
from graphrun.eventstore.ids import Clock
from graphrun.eventstore.projections import RunRow, apply_run_row, rebuild_rows
from graphrun.eventstore.store import (
    LEASE_SECONDS,
    Lease,
    Store,
    _process_started,
    broken_log,
    damaged_run,
    holder_alive,
)


@dataclass
class MemoryBackend:
    """The shared "database": stored rows, the runs projection, the leases and
    the cancel requests."""

    # run id -> [(seq, body, prev_hash, hash)] in seq order
    events: dict[str, list[tuple[int, bytes, str, str]]] = field(default_factory=dict)
    runs: dict[str, RunRow] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)
    # run id -> (by, reason, when): requests to cancel a run its driver polls
    cancel_requests: dict[str, tuple[str, str, float]] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)


class MemoryStore:
    """An event store that lives in a :class:`MemoryBackend`.

    Args:
        backend: the storage to use; a new one when omitted.
        clock: the clock that stamps events and leases.
        pid: the process id this store claims in leases (lets a test play two
            processes in one).
    """

    path = ":memory:"

    def __init__(
        self,
        backend: MemoryBackend | None = None,
        *,
        clock: Clock | None = None,
        pid: int | None = None,
    ) -> None:
        self.backend = backend or MemoryBackend()
        self.clock = clock or Clock()
        self.pid = os.getpid() if pid is None else pid
        self.started = _process_started() if pid is None else 0.0
        self.owner = f"{socket.gethostname()}:{self.pid}:{uuid.uuid4().hex[:8]}"
        # What this store last saw of each run, like SqliteStore's cache: a stale
        # view means another writer got there first.
        self._seen: dict[str, int] = {}

    def close(self) -> None:
        """Nothing to release; kept for interface parity."""

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- appending -----------------------------------------------------------------

    def append(self, run_id: str, events: Sequence[Event], *, sync: bool = False) -> list[Event]:
        """Append events to a run atomically; returns them stamped."""
        if not events:
            return []
        b = self.backend
        with b.lock:
            row = b.runs.get(run_id)
            seq = row.last_seq if row else 0
            seen = self._seen.get(run_id)
            if seen is not None and seen != seq:
                self._seen.pop(run_id, None)
                raise ConcurrentAppendError(
                    f"run {run_id} was extended by another writer (seq {seen + 1} taken)",
                    hint="only one process may extend a run at a time",
                )
            prev = row.last_hash if row else codec.GENESIS
            now = self.clock.now()
            stamped: list[Event] = []
            stored: list[tuple[int, bytes, str, str]] = []
            for event in events:
                seq += 1
                if event.run_id == run_id and event.seq and event.seq != seq:
                    raise ConcurrentAppendError(
                        f"run {run_id} is at seq {seq - 1} here, not {event.seq - 1} "
                        "as its writer thought",
                        hint="only one process may extend a run at a time",
                    )
                event = msgspec.structs.replace(event, run_id=run_id, seq=seq, ts=event.ts or now)
                body = codec.encode(event)
                digest = codec.chain_hash(prev, body)
                row = apply_run_row(row, event, digest)
                stored.append((seq, body, prev, digest))
                prev = digest
                stamped.append(event)
            assert row is not None
            b.events.setdefault(run_id, []).extend(stored)
            b.runs[run_id] = row
            self._seen[run_id] = seq
            lease = b.leases.get(run_id)
            if lease is not None and lease.owner == self.owner:
                b.leases[run_id] = _replace_lease(lease, expires_at=now + LEASE_SECONDS)
            return stamped

    # -- reading -------------------------------------------------------------------

    def has_run(self, run_id: str) -> bool:
        return run_id in self.backend.runs

    def read(
        self, run_id: str, *, after: int = 0, upto: int | None = None, light: bool = False
    ) -> list[Event]:
        """The events of a run in seq order (``after < seq <= upto``); ``light``: LLM
        calls' wire bodies left undecoded (:data:`graphrun.eventstore.codec.LightLlmCalled`)."""
        with self.backend.lock:
            rows = list(self.backend.events.get(run_id, ()))
        if not rows and not self.has_run(run_id):
            raise self.unknown_run(run_id)
        out: list[Event] = []
        for seq, body, _p, _h in rows:
            if seq <= after or (upto is not None and seq > upto):
                continue
            try:
                out.append(codec.decode(body, light=light))
            except codec.DECODE_ERRORS as exc:
                raise damaged_run(
                    run_id, seq, f"event seq {seq} in {self.path} does not decode ({exc})"
                ) from None
        return out

    def raw_rows(self, run_id: str) -> Iterator[tuple[int, bytes, str, str]]:
        """Stored ``(seq, body, prev_hash, hash)`` rows, for verification."""
        with self.backend.lock:
            rows = list(self.backend.events.get(run_id, ()))
        yield from rows

    def verify(self, run_id: str) -> codec.ChainProblem | None:
        return self.read_verified(run_id)[1]

    def read_verified(
        self, run_id: str, *, hashes: dict[int, str] | None = None, light: bool = False
    ) -> tuple[list[Event], codec.ChainProblem | None]:
        """The run's events and :meth:`verify`'s answer, in one pass over the log (the
        events are the run's only when there is no problem); ``hashes``, if given,
        gets each verified event's chain hash by seq. ``light``: LLM calls'
        wire bodies are left undecoded (:data:`graphrun.eventstore.codec.LightLlmCalled`)."""
        if not self.has_run(run_id):
            raise self.unknown_run(run_id)
        rows = list(self.raw_rows(run_id))
        if not rows:
            return [], codec.ChainProblem(1, "the run has no events")
        events: list[Event] = []
        problem = codec.verify_chain(rows, run_id, into=events, hashes=hashes, light=light)
        return ([] if problem is not None else events), problem

    def lost_head(self, run_id: str) -> str | None:
        """Never behind a reported head here (nothing of it outlives the process)."""
        return None

    def lost_heads(self) -> dict[str, str]:
        return {}

    def require_intact(self, run_id: str) -> None:
        """Raise :class:`BrokenLogError` unless the run's log verifies."""
        problem = self.verify(run_id)
        if problem is not None:
            raise broken_log(run_id, problem)

    def run(self, run_id: str) -> RunRow:
        row = self.backend.runs.get(run_id)
        if row is None:
            raise self.unknown_run(run_id)
        return row

    def runs(
        self,
        *,
        status: str | None = None,
        parent: str | None = None,
        limit: int = 1000,
        offset: int = 0,
        damaged: list[CorruptStoreError] | None = None,
    ) -> list[RunRow]:
        with self.backend.lock:
            rows = list(self.backend.runs.values())
        rows = [
            r
            for r in rows
            if (not status or r.status == status) and (not parent or r.parent_run_id == parent)
        ]
        rows.sort(key=lambda r: (r.started_at, r.run_id), reverse=True)
        return rows[max(0, offset) :][:limit]

    def resolve_run_id(self, prefix: str) -> str:
        """A full run id from a unique prefix."""
        found = sorted(r for r in self.backend.runs if r.startswith(prefix))[:3]
        if len(found) == 1:
            return found[0]
        if not found:
            raise self.unknown_run(prefix)
        raise UnknownRunError(f"run id prefix {prefix!r} is ambiguous", hint="give more characters")

    def unknown_run(self, run_id: str) -> UnknownRunError:
        return UnknownRunError(
            f"no run {run_id!r} in memory", hint="`graphrun runs` lists the runs"
        )

    def rebuild_runs(self) -> int:
        """Rebuild the ``runs`` projection from the stored events; returns rows."""
        b = self.backend
        with b.lock:
            try:
                ordered = [
                    (codec.decode(body), digest)
                    for run_id in sorted(b.events)
                    for _seq, body, _p, digest in b.events[run_id]
                ]
            except codec.DECODE_ERRORS as exc:
                raise CorruptStoreError(
                    f"{self.path}: an event does not decode ({exc}); the runs were not rebuilt",
                    hint="`graphrun audit RUN --verify` names the damaged event",
                ) from None
            b.runs = dict(rebuild_rows(ordered))
            return len(b.runs)

    # -- leases --------------------------------------------------------------------

    def _holder_dead(self, lease: Lease) -> bool:
        return not holder_alive(lease)

    def acquire_lease(self, run_id: str, *, seconds: float = LEASE_SECONDS) -> None:
        """Take the run for this store, or raise :class:`LeaseHeldError`."""
        now = self.clock.now()
        with self.backend.lock:
            found = self.backend.leases.get(run_id)
            if (
                found is not None
                and found.owner != self.owner
                and found.expires_at > now
                and not self._holder_dead(found)
            ):
                raise LeaseHeldError(
                    f"run {run_id} is being extended by process {found.pid} on {found.host}",
                    hint="wait for it to finish or stop it; the lease expires "
                    f"in {found.expires_at - now:.0f}s if that process is gone",
                )
            self.backend.leases[run_id] = Lease(
                run_id,
                self.owner,
                self.pid,
                socket.gethostname(),
                now + seconds,
                self.started,
            )
        # Another holder may have appended while this store did not hold the run.
        self._seen.pop(run_id, None)

    def renew_lease(self, run_id: str, *, seconds: float = LEASE_SECONDS) -> None:
        with self.backend.lock:
            lease = self.backend.leases.get(run_id)
            if lease is not None and lease.owner == self.owner:
                self.backend.leases[run_id] = _replace_lease(
                    lease, expires_at=self.clock.now() + seconds
                )

    def release_lease(self, run_id: str) -> None:
        with self.backend.lock:
            lease = self.backend.leases.get(run_id)
            if lease is not None and lease.owner == self.owner:
                del self.backend.leases[run_id]

    def lease(self, run_id: str) -> Lease | None:
        return self.backend.leases.get(run_id)

    def is_live(self, run_id: str) -> bool:
        """Whether some live holder has the run's lease."""
        lease = self.lease(run_id)
        if lease is None or lease.expires_at < self.clock.now():
            return False
        return not self._holder_dead(lease)

    def release_stale_leases(self) -> list[str]:
        """Drop the leases whose holder is gone for sure (dead on this host)."""
        with self.backend.lock:
            stale = [
                run_id
                for run_id, lease in self.backend.leases.items()
                if lease.owner != self.owner and self._holder_dead(lease)
            ]
            for run_id in stale:
                del self.backend.leases[run_id]
        return sorted(stale)

    @contextmanager
    def leased(self, run_id: str) -> Iterator[None]:
        self.acquire_lease(run_id)
        try:
            yield
        finally:
            self.release_lease(run_id)

    # -- cancel requests -----------------------------------------------------------

    def request_cancel(self, run_id: str, by: str, reason: str) -> None:
        """Ask whoever drives ``run_id`` to cancel it; the first request stands."""
        with self.backend.lock:
            if not self.has_run(run_id):
                raise self.unknown_run(run_id)
            self.backend.cancel_requests.setdefault(run_id, (by, reason, self.clock.now()))

    def cancel_requested(self, run_id: str) -> tuple[str, str] | None:
        """``(by, reason)`` of the request to cancel ``run_id``, or ``None``."""
        found = self.backend.cancel_requests.get(run_id)
        return (found[0], found[1]) if found else None

    def tamper(self, run_id: str, seq: int, body: bytes) -> None:
        """Replace one stored body without rehashing (tests of ``verify``)."""
        with self.backend.lock:
            rows = self.backend.events[run_id]
            for i, (s, _body, prev, digest) in enumerate(rows):
                if s == seq:
                    rows[i] = (s, body, prev, digest)
                    return
        raise KeyError(seq)


def _conforms(store: MemoryStore) -> Store:
    return store  # mypy checks that MemoryStore has every method of Store


__all__ = ["MemoryBackend", "MemoryStore"]
