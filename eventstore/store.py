"""The ``Store`` protocol, and the SQLite event store.

The SQLite file (schema in ``migrations.py``):

* ``events`` is keyed by one integer, ``id = run_no << 32 | seq``, where
  ``run_no`` is the run's number in this file (``run_heads.run_no``). The key is
  the lock: appending a seq that already exists raises
  :class:`ConcurrentAppendError`. A run's events are one range of the table.
* Each row keeps the event's canonical JSON as TEXT (``json_extract`` reads
  every field) and its chain hash ``sha256:<hex>`` over the previous hash and
  exactly those bytes; ``run_id``, ``seq``, ``ts``, ``type`` and ``node_id`` are
  virtual columns derived from the hashed body, so nothing people query sits
  outside the chain and nothing is stored twice.
* ``runs`` is a view: ``run_heads`` (written in the transaction of an event that
  changes a run's head: start, waiting, answered, the end) plus the step columns
  read from ``events``. A node step's commit writes its events alone, in one
  statement. Appends go through the raw ``sqlite3`` connection.
* WAL with ``synchronous=NORMAL`` by default (a killed process loses nothing
  committed); ``durability="full"`` or ``append(..., sync=True)`` fsyncs.
* A run is leased by one process at a time; a lease can be taken over once it
  expired, or when its holder (same host, same pid *and* process start time) is
  gone. No signal is sent to find out.
* A cancel request (``cancel_requests``) asks the process driving a run to
  cancel it: only the run's writer appends to its log, so the request is a row
  of its own, which the driver polls (one primary-key read).
* SQLite's failures become one-line :class:`StoreError` subclasses naming the
  file and what to do (disk full, read-only, I/O error, locked, damaged).
"""

from __future__ import annotations

import functools
import os
import socket
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar

import msgspec
import psutil

from graphrun.eventstore import codec, redaction
from graphrun.eventstore.errors import (
    BrokenLogError,
    ConcurrentAppendError,
    CorruptStoreError,
    LeaseHeldError,
    StoreError,
    StoreFullError,
    StoreIOError,
    StoreLockedError,
    StoreReadOnlyError,
    UnknownRunError,
)
from graphrun.eventstore.events import Event
from graphrun.eventstore.ids import Clock
from graphrun.eventstore.migrations import prepare
from graphrun.eventstore.projections import (
    COLUMNS,
    HEAD_COLUMNS,
    HEAD_EVENT_TYPES,
    RunRow,
    apply_run_row,
    entered_node,
    prefix_match,
    rebuild_rows,
    row_problem,
    runs_query,
)
from graphrun.eventstore.reported import ReportedHeads

LEASE_SECONDS = 30.0
#: A run's head is recorded outside the database when it reaches one of these.
_REPORTED_STATUSES = frozenset(
    {"waiting", "completed", "completed_with_errors", "failed", "cancelled", "interrupted"}
)
#: A run that ends in one of these drops its state snapshot (in the same transaction):
#: snapshots are kept only for runs that are still to be continued.
ENDED_STATUSES = frozenset({"completed", "completed_with_errors", "failed", "cancelled"})
#: How long a command waits for another process's write lock before giving up.
BUSY_SECONDS = 10.0

_SEQ_BITS = 32
_SEQ_MASK = (1 << _SEQ_BITS) - 1
_INSERT_EVENT = "INSERT INTO events (id, body, hash) VALUES (?, ?, ?)"
_UPSERT_HEAD = (
    f"INSERT INTO run_heads ({', '.join(HEAD_COLUMNS)}, run_no) "
    f"VALUES ({', '.join('?' for _ in HEAD_COLUMNS)}, ?) "
    f"ON CONFLICT (run_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in HEAD_COLUMNS[1:])
)
_SELECT_RUN = f"SELECT {', '.join(COLUMNS)}, run_no FROM runs"
_head_of = msgspec.structs.astuple
_HEAD_INDEX = tuple(COLUMNS.index(c) for c in HEAD_COLUMNS)
_RENEW_IN_APPEND = "UPDATE leases SET expires_at = ? WHERE run_id = ? AND owner = ?"

#: A stored row as read for verification: seq, body bytes, hash (as stored).
_Stored = tuple[int, bytes, Any]

P = ParamSpec("P")
R = TypeVar("R")


@functools.lru_cache(maxsize=64)
def _insert_many(rows: int) -> str:
    """One INSERT of ``rows`` events."""
    return _INSERT_EVENT.partition(" VALUES ")[0] + " VALUES " + ", ".join(["(?, ?, ?)"] * rows)


@dataclass(frozen=True)
class Lease:
    run_id: str
    owner: str
    pid: int
    host: str
    expires_at: float
    #: When the holding process started (with ``pid``, who holds it; 0 = unknown).
    started: float = 0.0


@functools.cache
def _process_started() -> float:
    return float(psutil.Process().create_time())


def holder_alive(lease: Lease) -> bool:
    """Whether the process holding ``lease`` may still be running.

    Another host's process cannot be seen: its lease holds until it expires. On
    this host the holder is gone when no process has its pid, when that pid
    belongs to a process started at another time (the pid was reused), or when
    it is a zombie. Nothing is sent to the process."""
    if lease.host != socket.gethostname():
        return True
    try:
        process = psutil.Process(lease.pid)
        if lease.started and abs(process.create_time() - lease.started) > 0.005:
            return False
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # access denied: it exists
        return True


class Store(Protocol):
    """What the runtime uses of an event store (SQLite, memory, PostgreSQL).

    Every implementation passes ``tests/conformance/store_contract.py`` and raises
    the same errors: :class:`UnknownRunError`, :class:`ConcurrentAppendError`,
    :class:`LeaseHeldError`, :class:`CorruptStoreError` (and
    :class:`BrokenLogError` from :meth:`require_intact`), ``ValueError`` for a
    run that does not start with ``RunStarted``.
    """

    @property
    def path(self) -> str | Path: ...

    @property
    def owner(self) -> str: ...

    def close(self) -> None: ...

    def append(
        self, run_id: str, events: Sequence[Event], *, sync: bool = False
    ) -> list[Event]: ...

    def has_run(self, run_id: str) -> bool: ...

    def read(
        self, run_id: str, *, after: int = 0, upto: int | None = None, light: bool = False
    ) -> list[Event]: ...

    def raw_rows(self, run_id: str) -> Iterator[tuple[int, bytes, str, str]]: ...

    def verify(self, run_id: str) -> codec.ChainProblem | None: ...

    def read_verified(
        self, run_id: str, *, hashes: dict[int, str] | None = None, light: bool = False
    ) -> tuple[list[Event], codec.ChainProblem | None]: ...

    def lost_head(self, run_id: str) -> str | None: ...

    def lost_heads(self) -> dict[str, str]: ...

    def require_intact(self, run_id: str) -> None: ...

    def run(self, run_id: str) -> RunRow: ...

    def runs(
        self,
        *,
        status: str | None = None,
        parent: str | None = None,
        limit: int = 1000,
        offset: int = 0,
        damaged: list[CorruptStoreError] | None = None,
    ) -> list[RunRow]: ...

    def resolve_run_id(self, prefix: str) -> str: ...

    def unknown_run(self, run_id: str) -> UnknownRunError: ...

    def rebuild_runs(self) -> int: ...

    def acquire_lease(self, run_id: str, *, seconds: float = LEASE_SECONDS) -> None: ...

    def renew_lease(self, run_id: str, *, seconds: float = LEASE_SECONDS) -> None: ...

    def release_lease(self, run_id: str) -> None: ...

    def lease(self, run_id: str) -> Lease | None: ...

    def is_live(self, run_id: str) -> bool: ...

    def release_stale_leases(self) -> list[str]: ...

    def leased(self, run_id: str) -> AbstractContextManager[None]: ...

    def request_cancel(self, run_id: str, by: str, reason: str) -> None: ...

    def cancel_requested(self, run_id: str) -> tuple[str, str] | None: ...


#: Events per query of :func:`read_in_pages`.
PAGE_EVENTS = 1024


def read_in_pages(
    store: Store, run_id: str, *, upto: int | None = None, light: bool = False
) -> Iterator[Event]:
    """The run's events in seq order (up to ``upto``), read a page at a time: a
    command that looks at each event once (``show``) keeps one page decoded, not
    the whole log, so its memory, and its time per event, do not grow with the run.
    Unlike one :meth:`Store.read`, the pages are separate reads: a run that grows
    meanwhile is read up to its head when the first page is. ``light``: as
    :meth:`Store.read`."""
    last = store.run(run_id).last_seq if upto is None else upto
    after = 0
    while after < last:
        page = store.read(run_id, after=after, upto=min(after + PAGE_EVENTS, last), light=light)
        if not page:
            return
        yield from page
        after = page[-1].seq


def broken_log(run_id: str, problem: codec.ChainProblem) -> BrokenLogError:
    """The error for a run whose log does not verify (shared by every store)."""
    return BrokenLogError(
        f"run {run_id} does not verify at seq {problem.seq}: {problem.reason}",
        seq=problem.seq,
        hint=f"nothing was appended; `graphrun audit {run_id} --verify` checks the run",
        run_id=run_id,
    )


def damaged_run(run_id: str, seq: int, reason: str) -> CorruptStoreError:
    """The error for a run whose stored data does not decode (every store)."""
    return CorruptStoreError(
        f"run {run_id}: {reason}",
        hint=f"`graphrun audit {run_id} --verify` checks the whole run",
        run_id=run_id,
        seq=seq,
    )


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "not valid UTF-8"
    text = " ".join(str(exc).split())
    return text if len(text) <= 160 else text[:157] + "..."


def _bad_run_no(run_id: bytes, path: Path) -> CorruptStoreError:
    text = run_id.decode("utf-8", "backslashreplace")
    return damaged_run(text, 0, f"its runs row's run_no in {path} is not a number")


_LEASE_KINDS: tuple[type | tuple[type, ...], ...] = (str, str, int, str, (int, float), (int, float))


def _lease_shaped(row: Sequence[Any]) -> bool:
    """Whether a ``leases`` row (run_id, owner, pid, host, expires_at, started) has
    the types graphrun writes (a damaged or edited file may hold others)."""
    return all(isinstance(v, k) for v, k in zip(row, _LEASE_KINDS, strict=True))


def _unreadable_lease(run_id: str) -> Lease:
    """A lease row a damaged file holds: it holds nothing (expired long ago), so
    the run can be taken, and the row is replaced when it is."""
    return Lease(run_id=run_id, owner="(unreadable)", pid=0, host="", expires_at=0.0)


def _undecodable(exc: sqlite3.Error) -> bool:
    """Whether SQLite handed back text that is not UTF-8 (a damaged row)."""
    return "decode" in str(exc).lower()


def storage_error(
    path: Path, exc: sqlite3.Error, doing: str, busy_seconds: float = BUSY_SECONDS
) -> StoreError:
    """A one-line error for what SQLite reported while ``doing`` something."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    detail = " ".join(str(exc).split())  # one line, even when it quotes damaged SQL
    if len(detail) > 160:
        detail = detail[:157] + "..."
    if code == 13 or "database or disk is full" in detail:
        return StoreFullError(
            f"the disk holding {path} is full ({doing})",
            hint="free some space; a run that stopped continues with `graphrun resume RUN`",
        )
    if code == 8 or "readonly" in detail:
        return StoreReadOnlyError(
            f"{path} cannot be written ({doing}: {detail})",
            hint="check the permissions of the file and its folder, or pass --db",
        )
    if code == 10 or "disk I/O error" in detail:
        return StoreIOError(
            f"I/O error on {path} ({doing}: {detail})",
            hint="check the disk and its free space; a run that stopped continues with "
            "`graphrun resume RUN`",
        )
    if code in (5, 6) or "locked" in detail:
        return StoreLockedError(
            f"{path} stayed locked by another process for over {busy_seconds:g}s ({doing})",
            hint="retry once the other graphrun commands on this database have finished",
        )
    if code == 26 or "not a database" in detail:
        return CorruptStoreError(
            f"{path} is not a usable graphrun database: {detail}",
            hint="point --db at a graphrun event database",
        )
    if code == 11 or "malformed" in detail:
        return CorruptStoreError(
            f"{path} is damaged ({detail}) while {doing}",
            hint="`graphrun audit RUN --verify` names the first damaged event; "
            "restore the file from a backup",
        )
    if code == 14:
        return StoreError(
            f"cannot open the event database {path}: {detail}",
            hint="check that its folder exists and can be written, or pass --db",
        )
    return StoreError(f"{path}: {detail} ({doing})")


def _guarded(doing: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Turn SQLite's errors in a store method into one-line store errors."""

    def wrap(method: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(method)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return method(*args, **kwargs)
            except sqlite3.Error as exc:
                store = args[0]
                assert isinstance(store, SqliteStore)
                store.rollback()
                raise storage_error(store.path, exc, doing, store.busy_seconds) from None

        return guarded

    return wrap


class SqliteStore:
    """An event store in one SQLite file."""

    def __init__(
        self,
        path: str | Path,
        *,
        durability: str = "normal",
        create: bool = True,
        clock: Clock | None = None,
        busy_seconds: float = BUSY_SECONDS,
    ) -> None:
        self.path = Path(path)
        self.busy_seconds = busy_seconds
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
        self.reported = ReportedHeads(self.path)
        if create and not self.path.exists():
            self.reported.forget()  # a record of another, earlier file by that name
        try:
            if create:
                self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create the folder of the event database {self.path}: {exc.strerror}",
                hint="pass --db or set GRAPHRUN_DB to a writable place",
            ) from None
        try:
            self.conn = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False, timeout=busy_seconds
            )
        except sqlite3.Error as exc:
            raise storage_error(self.path, exc, "opening it") from None
        try:
            prepare(self.conn, self.path, timeout=busy_seconds)
            sync = "FULL" if durability == "full" else "NORMAL"
            self.conn.execute(f"PRAGMA synchronous={sync}")
        except CorruptStoreError:
            self.conn.close()
            raise
        except sqlite3.Error as exc:
            self.conn.close()
            if isinstance(exc, sqlite3.DatabaseError) and "not a database" in str(exc):
                raise CorruptStoreError(
                    f"{self.path} is not a usable graphrun database: {exc}",
                    hint="point --db at a graphrun event database",
                ) from None
            raise storage_error(self.path, exc, "opening it", busy_seconds) from None
        self.durability = durability

    def close(self) -> None:
        with self._lock:
            self.conn.close()

    def checkpoint_heads(self) -> bool:
        """Checkpoint the WAL into the database file and, if every frame went in,
        mark the reported heads recorded so far as safe (see
        :mod:`graphrun.eventstore.reported`); whether a mark was written."""
        covered = self.reported.size()
        if covered is None:
            return False
        with self._lock:
            try:
                busy, log, done = self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            except sqlite3.Error:
                return False  # the next MARK_BYTES of the record try again
        if busy or log != done:  # a reader (or a writer) held part of the WAL back
            return False
        self.reported.mark(covered)
        return True

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rollback(self) -> None:
        """End a transaction an error left open (SQLite may have ended it already)."""
        try:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass

    # -- appending -----------------------------------------------------------------

    def _row(self, run_id: str) -> RunRow | None:
        row = self._rows.get(run_id)
        if row is None:
            try:
                found = self.conn.execute(_SELECT_RUN + " WHERE run_id = ?", (run_id,)).fetchone()
            except sqlite3.OperationalError as exc:
                if not _undecodable(exc):
                    raise
                (run_no,) = self.conn.execute(
                    "SELECT run_no FROM run_heads WHERE run_id = ?", (run_id,)
                ).fetchone()
                raise self._damaged_row(run_no) from None
            if found is not None:
                row = self._to_row(found)
        return row

    def _to_row(self, found: tuple[Any, ...]) -> RunRow:
        """A ``runs`` view row (with its ``run_no`` last); a row whose values have
        the wrong types (a damaged file) is a :class:`CorruptStoreError`."""
        problem = row_problem(found)
        if problem is None and (not isinstance(found[-1], int) or isinstance(found[-1], bool)):
            problem = f"its runs row's run_no is {type(found[-1]).__name__}, not int"
        if problem is not None:
            run_id = found[0] if isinstance(found[0], str) else repr(found[0])
            raise damaged_run(run_id, 0, f"{problem} in {self.path}")
        self._run_nos.setdefault(found[0], found[-1])
        return RunRow(*found[:-1])

    @_guarded("appending to the log")
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
            params: list[tuple[int, str, str]] = []
            replace = msgspec.structs.replace
            encode = codec.encode
            chain_hash = codec.chain_hash
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
                body = encode(event)
                red = redaction.redact_event(event, body)  # keys are never recorded
                if red is not event:
                    event, body = red, encode(red)
                prev = chain_hash(prev, body)
                params.append((seq, body.decode("utf-8"), prev))
                if type(event) in head_types or row is None:
                    row = apply_run_row(row, event, prev)
                    head_touched = True
                else:
                    entered = entered_node(event) or entered
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
                before is None or self._head(before) != self._head(row)
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
                    for key, body_text, digest in params:
                        flat += (base + key, body_text, digest)
                    conn.execute(_insert_many(len(params)), flat)
                else:
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        if run_no is None:
                            run_no = self._run_no(run_id, new=before is None)
                        base = run_no << _SEQ_BITS
                        conn.executemany(
                            _INSERT_EVENT, [(base + key, b, h) for key, b, h in params]
                        )
                        if head_changed:
                            conn.execute(_UPSERT_HEAD, (*self._head(row), run_no))
                            if row.status in ENDED_STATUSES:
                                conn.execute("DELETE FROM snapshots WHERE run_id = ?", (run_id,))
                        if renew:
                            # Renewing every step would rewrite the leases page every
                            # commit; a third of the lease time is often enough.
                            conn.execute(
                                _RENEW_IN_APPEND, (now + LEASE_SECONDS, run_id, self.owner)
                            )
                            self._renew_at[run_id] = now + LEASE_SECONDS / 3
                        conn.execute("COMMIT")
                    except BaseException:
                        self.rollback()
                        raise
            except sqlite3.IntegrityError:
                self._rows.pop(run_id, None)
                raise ConcurrentAppendError(
                    f"run {run_id} was extended by another writer (seq {params[0][0]} taken)",
                    hint="only one process may extend a run at a time",
                ) from None
            except sqlite3.Error:
                self._rows.pop(run_id, None)
                raise
            finally:
                if sync and self.durability != "full":
                    try:
                        conn.execute("PRAGMA synchronous=NORMAL")
                    except sqlite3.Error:
                        pass
            self._run_nos[run_id] = run_no
            self._rows[run_id] = row
        if (
            head_changed
            and row.status in _REPORTED_STATUSES
            and self.reported.record(run_id, row.last_seq, row.last_hash)
        ):
            self.checkpoint_heads()  # the record grew by MARK_BYTES: try to mark it
        return stamped

    @staticmethod
    def _head(row: RunRow) -> tuple[Any, ...]:
        values = _head_of(row)
        return tuple(values[i] for i in _HEAD_INDEX)

    def _run_no(self, run_id: str, *, new: bool = False) -> int:
        """The run's number in this file; a new run gets the next one (in a write
        transaction, so two writers cannot pick the same)."""
        run_no = self._run_nos.get(run_id)
        if run_no is not None:
            return run_no
        found = self.conn.execute(
            "SELECT run_no FROM run_heads WHERE run_id = ?", (run_id,)
        ).fetchone()
        if found is not None:
            if not isinstance(found[0], int):
                raise _bad_run_no(run_id.encode("utf-8"), self.path)
            run_no = found[0]
        elif new:
            (top_head,) = self.conn.execute("SELECT max(run_no) FROM run_heads").fetchone()
            (top_event,) = self.conn.execute("SELECT max(id) FROM events").fetchone()
            run_no = max(top_head or 0, (top_event or 0) >> _SEQ_BITS) + 1
        else:
            raise self.unknown_run(run_id)
        self._run_nos[run_id] = run_no
        return run_no

    def _range(self, run_id: str, after: int = 0, upto: int | None = None) -> tuple[int, int]:
        """``events.id`` bounds ``(lo, hi]`` of a run's seqs ``after < seq <= upto``."""
        base = self._run_no(run_id) << _SEQ_BITS
        return base + after, base + min(upto if upto is not None else _SEQ_MASK, _SEQ_MASK)

    # -- reading -------------------------------------------------------------------

    @_guarded("reading the runs")
    def has_run(self, run_id: str) -> bool:
        with self._lock:
            if run_id in self._rows:
                return True
            cur = self.conn.execute("SELECT 1 FROM run_heads WHERE run_id = ?", (run_id,))
            return cur.fetchone() is not None

    @_guarded("reading a run's events")
    def read(
        self, run_id: str, *, after: int = 0, upto: int | None = None, light: bool = False
    ) -> list[Event]:
        """The events of a run in seq order (``after < seq <= upto``); ``light``: LLM
        calls' wire bodies left undecoded (:data:`graphrun.eventstore.codec.LightLlmCalled`)."""
        with self._lock:
            lo, hi = self._range(run_id, after, upto)
            rows = self.conn.execute(
                "SELECT id, CAST(body AS BLOB) FROM events WHERE id > ? AND id <= ? ORDER BY id",
                (lo, hi),
            ).fetchall()
        decode = codec.decode
        try:
            return [decode(body, light=light) for _key, body in rows]
        except codec.DECODE_ERRORS:
            pass
        for key, body in rows:
            try:
                decode(body)
            except codec.DECODE_ERRORS as exc:
                raise damaged_run(
                    run_id,
                    key & _SEQ_MASK,
                    f"event seq {key & _SEQ_MASK} in {self.path} "
                    f"does not decode ({_one_line(exc)})",
                ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def raw_rows(self, run_id: str) -> Iterator[tuple[int, bytes, str, str]]:
        """Stored ``(seq, body, prev_hash, hash)`` rows, for verification and export.

        ``body`` is the exact stored bytes; ``prev_hash`` is the previous row's
        hash, as the chain defines it."""
        rows, failure, _head = self._stored_rows(run_id)
        if failure is not None:
            raise storage_error(self.path, failure, f"reading run {run_id}")
        yield from self._chained(rows)

    @_guarded("reading a run's events")
    def _stored_rows(
        self, run_id: str
    ) -> tuple[list[_Stored], sqlite3.Error | None, tuple[Any, ...] | None]:
        """The run's stored rows up to the first one SQLite cannot read, the error
        that stopped the reading (``None`` when every row was read), and its
        ``run_heads`` row: read in one transaction, so that a writer committing
        meanwhile (another process continuing the run) cannot make them disagree."""
        rows: list[_Stored] = []
        head: tuple[Any, ...] | None = None
        with self._lock:
            lo, hi = self._range(run_id)
            began = not self.conn.in_transaction
            try:
                if began:
                    self.conn.execute("BEGIN")
                cursor = self.conn.execute(
                    "SELECT id, CAST(body AS BLOB), hash FROM events "
                    "WHERE id > ? AND id <= ? ORDER BY id",
                    (lo, hi),
                )
                for key, body, digest in cursor:
                    rows.append((key & _SEQ_MASK, body, digest))
                found = self.conn.execute(
                    f"SELECT {', '.join(HEAD_COLUMNS)} FROM run_heads WHERE run_id = ?", (run_id,)
                ).fetchone()
                head = None if found is None else tuple(found)
            except sqlite3.DatabaseError as exc:
                return rows, exc, None
            finally:
                if began:
                    self.rollback()  # a read: nothing to keep
        return rows, None, head

    @staticmethod
    def _chained(rows: list[_Stored]) -> Iterator[tuple[int, bytes, str, str]]:
        prev = codec.GENESIS
        for seq, body, digest in rows:
            yield seq, body, prev, digest
            prev = digest

    def verify(self, run_id: str) -> codec.ChainProblem | None:
        """The first place the run's stored log does not verify, or ``None``:
        a gap, a wrong hash, a body that is not UTF-8 JSON of this run and seq, or
        a row SQLite cannot read (a damaged page)."""
        return self.read_verified(run_id)[1]

    def read_verified(
        self, run_id: str, *, hashes: dict[int, str] | None = None, light: bool = False
    ) -> tuple[list[Event], codec.ChainProblem | None]:
        """The run's events and :meth:`verify`'s answer, in one reading of the log
        (each event decoded once). The events are the run's only when there is no
        problem. ``hashes``, if given, gets each verified event's chain hash by seq.
        ``light``: LLM calls' wire bodies are left undecoded
        (:data:`graphrun.eventstore.codec.LightLlmCalled`)."""
        if not self.has_run(run_id):
            raise self.unknown_run(run_id)
        rows, failure, head = self._stored_rows(run_id)
        events: list[Event] = []
        problem = codec.verify_chain(
            self._chained(rows), run_id, into=events, hashes=hashes, light=light
        )
        if problem is not None:
            return events, problem
        if failure is not None:
            seq = rows[-1][0] + 1 if rows else 1
            detail = " ".join(str(failure).split())[:160]
            return events, codec.ChainProblem(seq, f"its database page cannot be read ({detail})")
        if not rows:
            return events, codec.ChainProblem(1, "the run has no events")
        problem = self._head_problem(run_id, events, head)
        if problem is None:  # a chain that verifies may still have lost its end
            reported = self.reported.unchecked().get(run_id)
            lost = self._behind(run_id, *reported) if reported is not None else None
            if lost is not None:
                problem = codec.ChainProblem(min(len(events) + 1, reported[0]), lost)  # type: ignore[index]
        return events, problem

    # -- snapshots (see graphrun.eventstore.snapshots) -------------------------------

    def snapshot(self, run_id: str) -> tuple[int, str, bytes, str] | None:
        """The run's kept snapshot row ``(seq, hash, body, digest)``, or ``None``
        (none kept, or a row that cannot be read: a snapshot is never needed)."""
        try:
            with self._lock:
                found = self.conn.execute(
                    "SELECT seq, hash, CAST(body AS BLOB), digest FROM snapshots WHERE run_id = ?",
                    (run_id,),
                ).fetchone()
        except sqlite3.Error:
            return None
        if found is None:
            return None
        seq, digest, body, check = found
        if not (isinstance(seq, int) and isinstance(digest, str) and isinstance(check, str)):
            return None
        return seq, digest, bytes(body), check

    @_guarded("reading a run's events")
    def stored_after(self, run_id: str, after: int) -> list[tuple[int, bytes, str]]:
        """The run's stored ``(seq, body, hash)`` rows after seq ``after``, in order."""
        with self._lock:
            lo, hi = self._range(run_id, after)
            rows = self.conn.execute(
                "SELECT id, CAST(body AS BLOB), hash FROM events "
                "WHERE id > ? AND id <= ? ORDER BY id",
                (lo, hi),
            ).fetchall()
        return [(key & _SEQ_MASK, body, digest) for key, body, digest in rows]

    def keep_snapshot(self, run_id: str, seq: int, digest: str, body: bytes, check: str) -> bool:
        """Keep ``body`` as the run's snapshot at ``seq`` (chain hash ``digest``) in
        place of the one before; whether it was written (a busy or read-only file
        only costs the next command a full fold)."""
        try:
            with self._lock:
                self.conn.execute(
                    "INSERT OR REPLACE INTO snapshots (run_id, seq, hash, body, digest) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (run_id, seq, digest, body, check),
                )
        except sqlite3.Error:
            self.rollback()
            return False
        return True

    def _head_problem(
        self, run_id: str, events: list[Event], found: tuple[Any, ...] | None
    ) -> codec.ChainProblem | None:
        """Whether the run's ``run_heads`` row ``found`` (read with its events) is
        what its (verified) events say."""
        try:
            expected = rebuild_rows((e, "") for e in events)[run_id]
        except ValueError as exc:  # a chain that verifies, of a log no run could write
            return codec.ChainProblem(1, str(exc))
        if found is None or tuple(found) == self._head(expected):
            return None
        differ = [
            c for c, a, b in zip(HEAD_COLUMNS, found, self._head(expected), strict=True) if a != b
        ]
        return codec.ChainProblem(
            len(events),
            f"the runs table's {', '.join(differ)} for this run do not match its events "
            "(edited outside graphrun?)",
        )

    @_guarded("reading the runs")
    def lost_head(self, run_id: str) -> str | None:
        """Whether the run's log went back behind the head graphrun last reported
        (it ends before that seq, or the run is gone; see
        :mod:`graphrun.eventstore.reported`): why, or ``None``."""
        reported = self.reported.unchecked().get(run_id)
        return None if reported is None else self._behind(run_id, *reported)

    @_guarded("reading the runs")
    def lost_heads(self) -> dict[str, str]:
        """:meth:`lost_head` of every run reported in this file that went back
        (of the heads no complete checkpoint covers: the rest are safe)."""
        found = {}
        for run_id, (seq, digest) in sorted(self.reported.unchecked().items()):
            problem = self._behind(run_id, seq, digest)
            if problem is not None:
                found[run_id] = problem
        return found

    def _behind(self, run_id: str, seq: int, _digest: str) -> str | None:
        lost = (
            "committed events were lost (a damaged -wal file after a crash?); "
            f"{self.reported.path.name} keeps what was reported"
        )
        with self._lock:
            found = self.conn.execute(
                "SELECT run_no FROM run_heads WHERE run_id = ?", (run_id,)
            ).fetchone()
            if found is None or not isinstance(found[0], int):
                return f"run {run_id} was reported at seq {seq} but is not in {self.path}: {lost}"
            (last,) = self.conn.execute(
                "SELECT coalesce(max(id), 0) & ? FROM events WHERE id > ? AND id <= ?",
                (_SEQ_MASK, found[0] << _SEQ_BITS, (found[0] << _SEQ_BITS) | _SEQ_MASK),
            ).fetchone()
        if last >= seq:
            # Not behind. (Another event at that seq is a rewritten log: the chain,
            # signed heads and anchors are what answer for its content.)
            return None
        return f"run {run_id}'s log ends at seq {last}, but seq {seq} was reported: {lost}"

    def require_intact(self, run_id: str) -> None:
        """Raise :class:`BrokenLogError` unless the run's log verifies (call it
        before extending a run another process wrote)."""
        problem = self.verify(run_id)
        if problem is not None:
            raise broken_log(run_id, problem)

    @_guarded("reading the runs")
    def run(self, run_id: str) -> RunRow:
        with self._lock:
            row = self._row(run_id)
        if row is None:
            raise self.unknown_run(run_id)
        return row

    @_guarded("reading the runs")
    def runs(
        self,
        *,
        status: str | None = None,
        parent: str | None = None,
        limit: int = 1000,
        offset: int = 0,
        damaged: list[CorruptStoreError] | None = None,
    ) -> list[RunRow]:
        """The runs, newest first (one page). A run whose row holds bytes that are
        not text is left out, and its error added to ``damaged`` (raised when
        ``damaged`` is ``None``): one damaged run never hides the others."""
        sql, args = runs_query(
            _SELECT_RUN,
            "?",
            status=status,
            parent=parent,
            limit=limit,
            offset=offset,
            heads="run_heads",
        )
        with self._lock:
            try:
                return [self._to_row(r) for r in self.conn.execute(sql, args).fetchall()]
            except sqlite3.OperationalError as exc:
                if not _undecodable(exc):
                    raise
            except CorruptStoreError:
                pass
            # Some row does not decode: read them one by one, by number.
            sql, args = runs_query(
                "SELECT run_no FROM (SELECT * FROM runs WHERE typeof(run_no) = 'integer')",
                "?",
                status=status,
                parent=parent,
                limit=limit,
                offset=offset,
                heads="run_heads",
            )
            out: list[RunRow] = []
            for (raw,) in self.conn.execute(
                "SELECT CAST(run_id AS BLOB) FROM run_heads WHERE typeof(run_no) != 'integer'"
            ).fetchall():
                error = _bad_run_no(bytes(raw or b""), self.path)
                if damaged is None:
                    raise error
                damaged.append(error)
            for (run_no,) in self.conn.execute(sql, args).fetchall():
                try:
                    try:
                        found = self.conn.execute(_SELECT_RUN + " WHERE run_no = ?", (run_no,))
                        out.append(self._to_row(found.fetchone()))
                    except sqlite3.OperationalError as exc:
                        if not _undecodable(exc):
                            raise
                        raise self._damaged_row(run_no) from None
                except CorruptStoreError as error:
                    if damaged is None:
                        raise
                    damaged.append(error)
            return out

    def _damaged_row(self, run_no: int) -> CorruptStoreError:
        """The error for the run numbered ``run_no``, whose row does not decode."""
        (raw,) = self.conn.execute(
            "SELECT CAST(run_id AS BLOB) FROM run_heads WHERE run_no = ?", (run_no,)
        ).fetchone()
        run_id = bytes(raw or b"").decode("utf-8", "backslashreplace")
        seq = 0
        lo = run_no << _SEQ_BITS
        for key, body in self.conn.execute(
            "SELECT id, CAST(body AS BLOB) FROM events WHERE id > ? AND id <= ? ORDER BY id",
            (lo, lo + _SEQ_MASK),
        ):
            try:
                bytes(body).decode("utf-8")
            except UnicodeDecodeError:
                seq = key & _SEQ_MASK
                break
        where = f"event seq {seq}" if seq else "its runs row"
        return damaged_run(run_id, seq, f"{where} in {self.path} is not valid UTF-8")

    @_guarded("reading the runs")
    def resolve_run_id(self, prefix: str) -> str:
        """A full run id from a unique prefix (like git's short hashes)."""
        with self._lock:
            rows = self.conn.execute(
                "SELECT run_id FROM run_heads WHERE run_id >= ? AND run_id < ? LIMIT 3",
                (prefix, prefix + "\uffff"),
            ).fetchall()
        return prefix_match(prefix, rows, self.unknown_run(prefix))

    def unknown_run(self, run_id: str) -> UnknownRunError:
        reported = self.reported.heads().get(run_id)
        if reported is not None:  # it was there: the database lost it
            return UnknownRunError(
                f"no run {run_id!r} in {self.path}, although graphrun reported it at seq "
                f"{reported[0]}: committed events were lost (a damaged -wal file after a "
                f"crash?); {self.reported.path.name} keeps what was reported",
                hint="restore the database from a backup",
            )
        return UnknownRunError(
            f"no run {run_id!r} in {self.path}", hint="`graphrun runs` lists the runs"
        )

    @_guarded("rebuilding the runs table")
    def rebuild_runs(self) -> int:
        """Rebuild ``run_heads`` from ``events``, keeping each run's number; returns rows."""
        with self._lock:
            rows = self.conn.execute(
                "SELECT id, CAST(body AS BLOB), hash FROM events ORDER BY id"
            ).fetchall()
            run_nos: dict[str, int] = {}

            def stored() -> Iterator[tuple[Event, str]]:
                for key, body, digest in rows:
                    event = codec.decode(body)
                    run_nos.setdefault(event.run_id, key >> _SEQ_BITS)
                    yield event, digest

            try:
                rebuilt = rebuild_rows(stored())
            except codec.DECODE_ERRORS as exc:
                raise CorruptStoreError(
                    f"{self.path}: an event does not decode ({exc}); the runs were not rebuilt",
                    hint="`graphrun audit RUN --verify` names the damaged event",
                ) from None
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute("DELETE FROM run_heads")
            self.conn.executemany(
                _UPSERT_HEAD,
                [(*self._head(r), run_nos[r.run_id]) for r in rebuilt.values()],
            )
            self.conn.execute("COMMIT")
            self._rows.clear()
            return len(rebuilt)

    # -- leases --------------------------------------------------------------------

    @_guarded("taking the run's lease")
    def acquire_lease(self, run_id: str, *, seconds: float = LEASE_SECONDS) -> None:
        """Take the run for this process, or raise :class:`LeaseHeldError`."""
        host = socket.gethostname()
        now = self.clock.now()
        with self._lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                found = self._lease(run_id)
                if (
                    found is not None
                    and found.owner != self.owner
                    and found.expires_at > now
                    and holder_alive(found)
                ):
                    raise LeaseHeldError(
                        f"run {run_id} is being extended by process {found.pid} on {found.host}",
                        hint="wait for it to finish or stop it; the lease expires "
                        f"in {found.expires_at - now:.0f}s if that process is gone",
                    )
                self.conn.execute(
                    "INSERT OR REPLACE INTO leases (run_id, owner, pid, host, started, "
                    "expires_at) VALUES (?, ?, ?, ?, ?, ?)",
                    (run_id, self.owner, os.getpid(), host, _process_started(), now + seconds),
                )
                self.conn.execute("COMMIT")
            except BaseException:
                self.rollback()
                raise
            self._renew_at[run_id] = now + min(seconds, LEASE_SECONDS) / 3
        # Another process may have appended while we did not hold the run.
        self._rows.pop(run_id, None)

    @_guarded("renewing the run's lease")
    def renew_lease(self, run_id: str, *, seconds: float = LEASE_SECONDS) -> None:
        with self._lock:
            now = self.clock.now()
            self.conn.execute(
                "UPDATE leases SET expires_at = ? WHERE run_id = ? AND owner = ?",
                (now + seconds, run_id, self.owner),
            )
            if run_id in self._renew_at:
                self._renew_at[run_id] = now + min(seconds, LEASE_SECONDS) / 3

    @_guarded("releasing the run's lease")
    def release_lease(self, run_id: str) -> None:
        with self._lock:
            self._renew_at.pop(run_id, None)
            self.conn.execute(
                "DELETE FROM leases WHERE run_id = ? AND owner = ?", (run_id, self.owner)
            )

    def _lease(self, run_id: str) -> Lease | None:
        try:
            found = self.conn.execute(
                "SELECT run_id, owner, pid, host, expires_at, started FROM leases WHERE run_id = ?",
                (run_id,),
            ).fetchone()
        except sqlite3.OperationalError as exc:
            if not _undecodable(exc):
                raise
            return _unreadable_lease(run_id)
        if found is None:
            return None
        if not _lease_shaped(found):
            return _unreadable_lease(run_id)
        return Lease(*found)

    @_guarded("reading the run's lease")
    def lease(self, run_id: str) -> Lease | None:
        with self._lock:
            return self._lease(run_id)

    def is_live(self, run_id: str) -> bool:
        """Whether some live process holds the run's lease."""
        lease = self.lease(run_id)
        if lease is None or lease.expires_at < self.clock.now():
            return False
        return holder_alive(lease)

    @_guarded("releasing the leases of dead processes")
    def release_stale_leases(self) -> list[str]:
        """Delete the lease rows whose holder is gone for sure (a process of this
        host that died: a ``kill -9`` leaves its row behind); returns their runs.
        A lease of another host's process stays until it expires (that process
        cannot be seen from here)."""
        with self._lock:
            try:
                rows = self.conn.execute(
                    "SELECT run_id, owner, pid, host, expires_at, started FROM leases "
                    "WHERE owner <> ?",
                    (self.owner,),
                ).fetchall()
            except sqlite3.OperationalError as exc:
                if not _undecodable(exc):
                    raise
                return []  # a damaged row: each lease is read on its own (`_lease`)
            stale = [Lease(*r) for r in rows if _lease_shaped(r)]
            stale = [lease for lease in stale if not holder_alive(lease)]
            if stale:
                self.conn.execute("BEGIN IMMEDIATE")
                try:
                    for lease in stale:
                        self.conn.execute(
                            "DELETE FROM leases WHERE run_id = ? AND owner = ?",
                            (lease.run_id, lease.owner),
                        )
                    self.conn.execute("COMMIT")
                except BaseException:
                    self.rollback()
                    raise
        return sorted(lease.run_id for lease in stale)

    @contextmanager
    def leased(self, run_id: str) -> Iterator[None]:
        self.acquire_lease(run_id)
        try:
            yield
        finally:
            self.release_lease(run_id)

    # -- cancel requests -----------------------------------------------------------

    @_guarded("recording a cancel request")
    def request_cancel(self, run_id: str, by: str, reason: str) -> None:
        """Ask whoever drives ``run_id`` to cancel it (``by`` asked, for ``reason``).

        Not an event: only the run's writer appends to its log. The driver sees
        the request through :meth:`cancel_requested` and records ``RunCancelled``
        itself. The first request of a run stands."""
        with self._lock:
            if not self.has_run(run_id):
                raise self.unknown_run(run_id)
            self.conn.execute(
                "INSERT INTO cancel_requests (run_id, requested_by, reason, requested_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
                (run_id, by, reason, self.clock.now()),
            )

    @_guarded("reading the cancel requests")
    def cancel_requested(self, run_id: str) -> tuple[str, str] | None:
        """``(by, reason)`` of the request to cancel ``run_id``, or ``None``."""
        with self._lock:
            found = self.conn.execute(
                "SELECT requested_by, reason FROM cancel_requests WHERE run_id = ?", (run_id,)
            ).fetchone()
        return (str(found[0]), str(found[1])) if found else None


def _conforms(store: SqliteStore) -> Store:
    return store  # mypy checks that SqliteStore has every method of Store
