"""The SQLite event store: append-only ``events``, the ``runs`` projection, ``leases``.

* ``events`` is keyed by one integer, ``id = run_no << 32 | seq``, where
  ``run_no`` is the run's number in this file (``runs.run_no``). The key is the
  lock: appending a seq that already exists raises :class:`ConcurrentAppendError`.
  A run's events are one range of the table, with no secondary index to keep.
* Each row keeps the canonical JSON body (TEXT), or the same bytes compressed
  with zlib (BLOB) when the body is large and compresses, and the event's chain
  hash as 32 raw bytes; ``prev_hash`` is the previous row's hash.
* A node step's events are appended in one transaction; the ``runs`` row is
  written in it only when the run starts, waits, is answered or ends (a run's
  current node, last seq, hash and time are read from its last events). Appends
  go through the raw ``sqlite3`` connection (sqlite-utils only runs migrations).
* WAL with ``synchronous=NORMAL`` by default (a killed process loses nothing
  committed); ``durability="full"`` or ``append(..., sync=True)`` fsyncs.
* A run is leased by one process at a time; a lease whose holder is dead (same
  host, pid gone) or expired can be taken over.
"""

from __future__ import annotations

import functools
import gc
import operator
import os
import socket
import sqlite3
import threading
import uuid
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from graphrun.eventstore import codec, redaction
from graphrun.eventstore.errors import (
    ConcurrentAppendError,
    CorruptStoreError,
    LeaseHeldError,
    StoreError,
    UnknownRunError,
)
from graphrun.eventstore.events import Event, NodeEntered
from graphrun.eventstore.ids import Clock
from graphrun.eventstore.migrations import APPLICATION_ID, SCHEMA_USER_VERSION, migrate
from graphrun.eventstore.projections import (
    COLUMNS,
    HEAD_EVENT_TYPES,
    RunRow,
    apply_run_row,
    rebuild_rows,
)

LEASE_SECONDS = 30.0

_INSERT_EVENT = "INSERT INTO events (id, ts, type, node_id, body, hash) VALUES (?, ?, ?, ?, ?, ?)"
_UPSERT_RUN = (
    f"INSERT INTO runs ({', '.join(COLUMNS)}, run_no) "
    f"VALUES ({', '.join('?' for _ in COLUMNS)}, ?) "
    f"ON CONFLICT (run_id) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in COLUMNS[1:])
)
_SEQ_BITS = 32
_SEQ_MASK = (1 << _SEQ_BITS) - 1
_HASH_PREFIX = codec.HASH_ALGORITHM + ":"


# What every step changes in a run's row. They are not written per step: they
# are the run's last event (its seq, hash and time) and its last NodeEntered, so
# the store reads them from ``events`` (see _with_step) and a step's commit
# writes the events page alone. The row is written when anything else changes
# (start, waiting, answered, the end).
_STEP_COLUMNS = ("updated_at", "last_seq", "last_hash", "current_node")
_head = operator.itemgetter(*(i for i, c in enumerate(COLUMNS) if c not in _STEP_COLUMNS))
_astuple = msgspec.structs.astuple
_SELECT_RUN = f"SELECT {', '.join(COLUMNS)}, run_no FROM runs"
_LAST_EVENT = "SELECT id, ts, hash FROM events WHERE id > ? AND id < ? ORDER BY id DESC LIMIT 1"
_LAST_ENTERED = (
    "SELECT node_id FROM events WHERE id > ? AND id < ? AND type = 'NodeEntered' "
    "ORDER BY id DESC LIMIT 1"
)


@functools.lru_cache(maxsize=64)
def _insert_many(rows: int) -> str:
    """One INSERT of ``rows`` events."""
    return (
        _INSERT_EVENT.partition(" VALUES ")[0]
        + " VALUES "
        + ", ".join(["(?, ?, ?, ?, ?, ?)"] * rows)
    )


_RENEW_IN_APPEND = "UPDATE leases SET expires_at = ? WHERE run_id = ? AND owner = ?"


@dataclass(frozen=True)
class Lease:
    run_id: str
    owner: str
    pid: int
    host: str
    expires_at: float


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a log is decoded.

    Decoding builds many containers and no cycles; collections triggered by the
    allocation count would walk them again and again (a 20,000-event ``show``
    sometimes took 1.2x the time per event of a 10,000-event one)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _format_hash(raw: bytes | str) -> str:
    """A stored hash (32 raw bytes) as ``sha256:<hex>``."""
    if isinstance(raw, str):  # a hand-edited row
        return raw
    return _HASH_PREFIX + raw.hex()


class SqliteStore:
    """An event store in one SQLite file."""

    def __init__(
        self,
        path: str | Path,
        *,
        durability: str = "normal",
        create: bool = True,
        clock: Clock | None = None,
    ) -> None:
        self.path = Path(path)
        self.clock = clock or Clock()
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._lock = threading.RLock()
        self._rows: dict[str, RunRow] = {}
        self._run_nos: dict[str, int] = {}
        # run id -> when an append should next renew this store's lease on it. Only
        # runs leased through this store are here (no other lease row can match).
        self._renew_at: dict[str, float] = {}
        if durability not in ("normal", "full"):
            raise StoreError(f"unknown durability {durability!r} (use 'normal' or 'full')")
        if not create and not self.path.exists():
            raise StoreError(
                f"no event database at {self.path}",
                hint="run something first, or pass --db / set GRAPHRUN_DB",
            )
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False, timeout=10.0
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the event database {self.path}: {exc}") from None
        try:
            self._check_and_migrate()
            self.conn.execute("PRAGMA journal_mode=WAL")
            sync = "FULL" if durability == "full" else "NORMAL"
            self.conn.execute(f"PRAGMA synchronous={sync}")
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise CorruptStoreError(
                f"{self.path} is not a usable graphrun database: {exc}",
                hint="point --db at a graphrun event database",
            ) from None
        self.durability = durability

    # -- opening -------------------------------------------------------------------

    def _check_and_migrate(self) -> None:
        app_id = self.conn.execute("PRAGMA application_id").fetchone()[0]
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        if app_id == APPLICATION_ID and version == SCHEMA_USER_VERSION:
            return
        if app_id == APPLICATION_ID and version > SCHEMA_USER_VERSION:
            raise CorruptStoreError(
                f"{self.path} was written by a newer graphrun (schema {version}, "
                f"this one knows {SCHEMA_USER_VERSION})",
                hint="upgrade graphrun",
            )
        if app_id not in (0, APPLICATION_ID):
            raise CorruptStoreError(f"{self.path} belongs to another application")
        tables = {
            row[0] for row in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        if app_id == 0 and tables - {"_sqlite_migrations"}:
            raise CorruptStoreError(
                f"{self.path} is an SQLite database of something else "
                f"(tables: {', '.join(sorted(tables)[:5])})",
                hint="point --db at a graphrun event database",
            )
        migrate(self.conn)

    def close(self) -> None:
        with self._lock:
            self.conn.close()

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- appending -----------------------------------------------------------------

    def _row(self, run_id: str) -> RunRow | None:
        row = self._rows.get(run_id)
        if row is None:
            found = self.conn.execute(_SELECT_RUN + " WHERE run_id = ?", (run_id,)).fetchone()
            if found is not None:
                row = self._with_step(found)
        return row

    def _with_step(self, found: tuple[Any, ...]) -> RunRow:
        """A ``runs`` row (with its ``run_no`` last) completed from the run's events."""
        row = RunRow(*found[:-1])
        run_no = found[-1]
        if run_no is None:
            return row
        self._run_nos.setdefault(row.run_id, run_no)
        lo, hi = run_no << _SEQ_BITS, (run_no + 1) << _SEQ_BITS
        last = self.conn.execute(_LAST_EVENT, (lo, hi)).fetchone()
        if last is None:
            return row
        entered = self.conn.execute(_LAST_ENTERED, (lo, hi)).fetchone()
        return msgspec.structs.replace(
            row,
            last_seq=last[0] & _SEQ_MASK,
            updated_at=last[1],
            last_hash=_format_hash(last[2]),
            current_node=entered[0] if entered else None,
        )

    def append(self, run_id: str, events: Sequence[Event], *, sync: bool = False) -> list[Event]:
        """Append events to a run in one transaction; returns them stamped.

        Each event gets ``run_id``, the next ``seq`` and (unless set) ``ts``; events
        already stamped with exactly those (as the supervisor stamps them) are
        stored as they are. Raises :class:`ConcurrentAppendError` if another writer
        got there first.
        """
        if not events:
            return []
        with self._lock:
            row = before = self._row(run_id)
            seq = row.last_seq if row else 0
            prev = row.last_hash if row else codec.GENESIS
            now = self.clock.now()
            stamped: list[Event] = []
            params: list[tuple[Any, ...]] = []
            replace = msgspec.structs.replace
            encode = codec.encode
            chain_digest = codec.chain_digest
            pack = codec.pack_body
            storable = codec.storable
            plain = codec.PLAIN_TYPES
            head_types = HEAD_EVENT_TYPES
            # Most events only move the row's step columns (set once, below);
            # only the few that change its head are folded into it one by one.
            head_touched = row is None
            entered: str | None = None
            for event in events:
                seq += 1
                if event.seq != seq or event.run_id != run_id or not event.ts:
                    if event.run_id == run_id and event.seq and event.seq != seq:
                        raise ConcurrentAppendError(
                            f"run {run_id} is at seq {seq - 1} here, not {event.seq - 1} "
                            "as its writer thought",
                            hint="only one process may extend a run at a time",
                        )
                    event = replace(event, run_id=run_id, seq=seq, ts=event.ts or now)
                canonical = encode(event)
                red = redaction.redact_event(event, canonical)  # keys are never recorded
                if red is not event:
                    event, canonical = red, encode(red)
                cls = type(event)
                kind = cls.__name__
                stored = pack(storable(event, canonical), kind not in plain)
                raw = chain_digest(prev, canonical)
                prev = _HASH_PREFIX + raw.hex()
                params.append((seq, event.ts, kind, getattr(event, "node_id", None), stored, raw))
                if cls in head_types or row is None:
                    row = apply_run_row(row, event, prev)
                    head_touched = True
                elif cls is NodeEntered:
                    entered = event.node_id  # type: ignore[attr-defined]
                stamped.append(event)
            assert row is not None
            row = replace(
                row,
                updated_at=stamped[-1].ts,
                last_seq=seq,
                last_hash=prev,
                current_node=entered if entered is not None else row.current_node,
            )
            conn = self.conn
            head_changed = head_touched and (
                before is None or _head(_astuple(before)) != _head(_astuple(row))
            )
            renew_at = self._renew_at.get(run_id)
            renew = renew_at is not None and now >= renew_at
            try:
                if sync and self.durability != "full":
                    conn.execute("PRAGMA synchronous=FULL")
                run_no = self._run_nos.get(run_id)
                if not head_changed and not renew and run_no is not None and len(params) <= 64:
                    # A node step: its events alone, in one statement, which SQLite
                    # commits as one transaction (no BEGIN/COMMIT round trips).
                    base = run_no << _SEQ_BITS
                    flat: list[Any] = []
                    for p in params:
                        flat += (base + p[0], *p[1:])
                    conn.execute(_insert_many(len(params)), flat)
                else:
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        if run_no is None:
                            run_no = self._run_no(run_id, new=before is None)
                        base = run_no << _SEQ_BITS
                        conn.executemany(_INSERT_EVENT, [(base + p[0], *p[1:]) for p in params])
                        if head_changed:
                            conn.execute(_UPSERT_RUN, (*_astuple(row), run_no))
                        if renew:
                            # Renewing every step would rewrite the leases page every
                            # commit; a third of the lease time is often enough.
                            conn.execute(
                                _RENEW_IN_APPEND, (now + LEASE_SECONDS, run_id, self.owner)
                            )
                            self._renew_at[run_id] = now + LEASE_SECONDS / 3
                        conn.execute("COMMIT")
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
            except sqlite3.IntegrityError:
                self._rows.pop(run_id, None)
                raise ConcurrentAppendError(
                    f"run {run_id} was extended by another writer (seq {params[0][0]} taken)",
                    hint="only one process may extend a run at a time",
                ) from None
            finally:
                if sync and self.durability != "full":
                    conn.execute("PRAGMA synchronous=NORMAL")
            self._run_nos[run_id] = run_no
            self._rows[run_id] = row
            return stamped

    def _run_no(self, run_id: str, *, new: bool = False) -> int:
        """The run's number in this file; a new run gets the next one (in a write
        transaction, so two writers cannot pick the same)."""
        run_no = self._run_nos.get(run_id)
        if run_no is not None:
            return run_no
        found = self.conn.execute("SELECT run_no FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if found is not None and found[0] is not None:
            run_no = int(found[0])
        elif new:
            top = self.conn.execute("SELECT max(id) FROM events").fetchone()[0]
            run_no = (top >> _SEQ_BITS if top is not None else 0) + 1
        else:
            raise self.unknown_run(run_id)
        self._run_nos[run_id] = run_no
        return run_no

    def _range(self, run_id: str, after: int = 0, upto: int | None = None) -> tuple[int, int]:
        """``events.id`` bounds ``(lo, hi]`` of a run's seqs ``after < seq <= upto``."""
        base = self._run_no(run_id) << _SEQ_BITS
        return base + after, base + min(upto if upto is not None else _SEQ_MASK, _SEQ_MASK)

    # -- reading -------------------------------------------------------------------

    def has_run(self, run_id: str) -> bool:
        with self._lock:
            cur = self.conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,))
            return cur.fetchone() is not None

    def read(self, run_id: str, *, after: int = 0, upto: int | None = None) -> list[Event]:
        """The events of a run in seq order (``after < seq <= upto``)."""
        with self._lock:
            lo, hi = self._range(run_id, after, upto)
            rows = self.conn.execute(
                "SELECT id, ts, body FROM events WHERE id > ? AND id <= ? ORDER BY id", (lo, hi)
            ).fetchall()
        from_row = codec.event_from_row
        try:
            with _collector_paused():
                return [from_row(body, run_id, key & _SEQ_MASK, ts) for key, ts, body in rows]
        except (msgspec.DecodeError, msgspec.ValidationError, zlib.error) as exc:
            raise CorruptStoreError(
                f"run {run_id}: an event in the database does not decode ({exc})",
                hint=f"graphrun audit {run_id} --verify names the damaged event",
            ) from None

    def raw_rows(self, run_id: str) -> Iterator[tuple[int, bytes, str, str]]:
        """Stored ``(seq, body, prev_hash, hash)`` rows, for verification.

        ``body`` is the canonical bytes (decompressed); ``prev_hash`` is the
        previous row's hash, as the chain defines it."""
        with self._lock:
            lo, hi = self._range(run_id)
            rows = self.conn.execute(
                "SELECT id, ts, body, hash FROM events WHERE id > ? AND id <= ? ORDER BY id",
                (lo, hi),
            ).fetchall()
        prev = codec.GENESIS
        for key, ts, stored, raw_hash in rows:
            seq = key & _SEQ_MASK
            digest = _format_hash(raw_hash)
            yield seq, codec.canonical_from_row(stored, run_id, seq, ts), prev, digest
            prev = digest

    def verify(self, run_id: str) -> codec.ChainProblem | None:
        if not self.has_run(run_id):
            raise self.unknown_run(run_id)
        return codec.verify_chain(self.raw_rows(run_id))

    def run(self, run_id: str) -> RunRow:
        with self._lock:
            row = self._row(run_id)
        if row is None:
            raise self.unknown_run(run_id)
        return row

    def runs(
        self, *, status: str | None = None, parent: str | None = None, limit: int = 1000
    ) -> list[RunRow]:
        sql = _SELECT_RUN
        where: list[str] = []
        args: list[Any] = []
        if status:
            where.append("status = ?")
            args.append(status)
        if parent:
            where.append("parent_run_id = ?")
            args.append(parent)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY started_at DESC, run_id DESC LIMIT ?"
        args.append(limit)
        with self._lock:
            return [self._with_step(r) for r in self.conn.execute(sql, args).fetchall()]

    def resolve_run_id(self, prefix: str) -> str:
        """A full run id from a unique prefix (like git's short hashes)."""
        with self._lock:
            rows = self.conn.execute(
                "SELECT run_id FROM runs WHERE run_id >= ? AND run_id < ? LIMIT 3",
                (prefix, prefix + "\uffff"),
            ).fetchall()
        if len(rows) == 1:
            return str(rows[0][0])
        if not rows:
            raise self.unknown_run(prefix)
        raise UnknownRunError(f"run id prefix {prefix!r} is ambiguous", hint="give more characters")

    def unknown_run(self, run_id: str) -> UnknownRunError:
        return UnknownRunError(
            f"no run {run_id!r} in {self.path}", hint="`graphrun runs` lists the runs"
        )

    def rebuild_runs(self) -> int:
        """Drop and rebuild the ``runs`` projection from ``events``; returns rows."""
        with self._lock:
            rows = self.conn.execute("SELECT id, ts, body, hash FROM events ORDER BY id").fetchall()
            run_nos: dict[str, int] = {}
            names: dict[int, str] = {}  # run_no -> run id, from each run's RunStarted

            def stored() -> Iterator[tuple[Event, str]]:
                for key, ts, body, raw_hash in rows:
                    run_no = key >> _SEQ_BITS
                    event = codec.event_from_row(body, names.get(run_no, ""), key & _SEQ_MASK, ts)
                    names.setdefault(run_no, event.run_id)
                    run_nos.setdefault(event.run_id, run_no)
                    yield event, _format_hash(raw_hash)

            rebuilt = rebuild_rows(stored())
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute("DELETE FROM runs")
            self.conn.executemany(
                _UPSERT_RUN,
                [(*_astuple(r), run_nos[r.run_id]) for r in rebuilt.values()],
            )
            self.conn.execute("COMMIT")
            self._rows.clear()
            return len(rebuilt)

    # -- leases --------------------------------------------------------------------

    def acquire_lease(self, run_id: str, *, seconds: float = LEASE_SECONDS) -> None:
        """Take the run for this process, or raise :class:`LeaseHeldError`."""
        host = socket.gethostname()
        now = self.clock.now()
        with self._lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                found = self.conn.execute(
                    "SELECT owner, pid, host, expires_at FROM leases WHERE run_id = ?",
                    (run_id,),
                ).fetchone()
                if found is not None and found[0] != self.owner:
                    _owner, pid, lease_host, expires_at = found
                    holder_dead = lease_host == host and not _pid_alive(pid)
                    if expires_at > now and not holder_dead:
                        raise LeaseHeldError(
                            f"run {run_id} is being extended by process {pid} on {lease_host}",
                            hint="wait for it to finish or stop it; the lease expires "
                            f"in {expires_at - now:.0f}s if that process is gone",
                        )
                self.conn.execute(
                    "INSERT OR REPLACE INTO leases (run_id, owner, pid, host, expires_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (run_id, self.owner, os.getpid(), host, now + seconds),
                )
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self._renew_at[run_id] = now + min(seconds, LEASE_SECONDS) / 3
        # Another process may have appended while we did not hold the run.
        self._rows.pop(run_id, None)

    def renew_lease(self, run_id: str, *, seconds: float = LEASE_SECONDS) -> None:
        with self._lock:
            now = self.clock.now()
            self.conn.execute(
                "UPDATE leases SET expires_at = ? WHERE run_id = ? AND owner = ?",
                (now + seconds, run_id, self.owner),
            )
            if run_id in self._renew_at:
                self._renew_at[run_id] = now + min(seconds, LEASE_SECONDS) / 3

    def release_lease(self, run_id: str) -> None:
        with self._lock:
            self._renew_at.pop(run_id, None)
            self.conn.execute(
                "DELETE FROM leases WHERE run_id = ? AND owner = ?", (run_id, self.owner)
            )

    def lease(self, run_id: str) -> Lease | None:
        with self._lock:
            found = self.conn.execute(
                "SELECT run_id, owner, pid, host, expires_at FROM leases WHERE run_id = ?",
                (run_id,),
            ).fetchone()
        return Lease(*found) if found else None

    def is_live(self, run_id: str) -> bool:
        """Whether some live process holds the run's lease."""
        lease = self.lease(run_id)
        if lease is None or lease.expires_at < self.clock.now():
            return False
        return not (lease.host == socket.gethostname() and not _pid_alive(lease.pid))

    @contextmanager
    def leased(self, run_id: str) -> Iterator[None]:
        self.acquire_lease(run_id)
        try:
            yield
        finally:
            self.release_lease(run_id)
