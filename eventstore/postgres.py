"""The PostgreSQL event store: the SQLite store's contract on a shared database.

Several processes on several machines append to one log, so every run can be
driven by whichever worker is free (``graphrun worker``) and audited in one place.

Tables (in the first schema of the connection's ``search_path``):

* ``events (run_id, seq)``: the primary key is the optimistic lock, appending a
  seq that exists raises :class:`ConcurrentAppendError`. ``body`` is the event's
  canonical JSON, as text, byte for byte what the chain hashes:
  ``hash = sha256:hex(sha256(prev_hash ‖ "\\n" ‖ body))``; verification hashes
  the stored text as it is, never a re-encoding. ``run_events`` is a view with
  the body as ``jsonb`` for SQL (``data->>'answer'``).
* ``runs``: the runs projection, written in the transaction of every append (it
  is true on disk at every commit).
* ``leases``: one holder per run, with an expiry that heartbeats move on. A
  worker's claim also holds a session-level advisory lock on the run (its
  ``lock_key``) on a connection of its own: PostgreSQL releases it the moment
  that connection goes, so a worker that dies on any host frees its runs at
  once; the expiry is the fallback for a worker that hangs without dying.
* ``cancel_requests``: who asked to cancel a run another process drives.
* ``run_queue``: runs submitted for workers (``queued``, ``running``,
  ``waiting``, ``done``); see :mod:`graphrun.runtime.engine.workers`.
* ``graphrun_meta``: the schema version. Migrations run in one transaction
  under an advisory lock, so the first uses by many processes at once are safe.

Connections come from a ``psycopg_pool`` pool; a store is safe to share between
threads (a worker drives several runs through one store).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec

from graphrun.eventstore import codec, redaction
from graphrun.eventstore.errors import (
    ConcurrentAppendError,
    CorruptStoreError,
    LeaseHeldError,
    StoreError,
    StoreUnreachableError,
    UnknownRunError,
)
from graphrun.eventstore.events import (
    Event,
    HumanInputReceived,
    HumanInputRequested,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunInterrupted,
    RunStarted,
)
from graphrun.eventstore.ids import Clock
from graphrun.eventstore.projections import (
    COLUMNS,
    RunRow,
    apply_run_row,
    prefix_match,
    rebuild_rows,
    runs_query,
)
from graphrun.eventstore.store import (
    ENDED_STATUSES,
    LEASE_SECONDS,
    Lease,
    _process_started,
    damaged_run,
    holder_alive,
)

#: Events after which a worker hands its run back (it ended, or waits for a person):
#: their commit waits for the flush, so a database crash cannot lose the log's tail
#: while the queue already says ``done`` or ``waiting`` (WAL is flushed in order, so
#: every earlier commit of the run is on disk with it).
_HAND_BACK_EVENTS = (
    RunCompleted,
    RunFailed,
    RunCancelled,
    RunInterrupted,
    HumanInputRequested,
)

#: The schema version once every migration below has run.
SCHEMA_VERSION = 4
_MIGRATE_LOCK = 0x67726E31  # pg_advisory_xact_lock key ("grn1")
#: Seconds between a worker's looks for dead processes holding leases on this host.
_DEAD_EVERY = 1.0
#: Seconds a claim's read of a run's cancel request answers the driver's first look.
_CANCEL_FRESH = 0.2

_MIGRATIONS: dict[int, list[str]] = {
    1: [
        """
        CREATE TABLE events (
            run_id    TEXT COLLATE "C" NOT NULL,
            seq       INTEGER NOT NULL,
            ts        DOUBLE PRECISION NOT NULL,
            type      TEXT NOT NULL,
            node_id   TEXT,
            body      TEXT NOT NULL,
            prev_hash TEXT NOT NULL,
            hash      TEXT NOT NULL,
            PRIMARY KEY (run_id, seq)
        )
        """,
        """
        CREATE TABLE runs (
            run_id        TEXT COLLATE "C" PRIMARY KEY,
            graph_name    TEXT NOT NULL,
            status        TEXT NOT NULL,
            parent_run_id TEXT COLLATE "C",
            started_at    DOUBLE PRECISION NOT NULL,
            updated_at    DOUBLE PRECISION NOT NULL,
            last_seq      INTEGER NOT NULL,
            last_hash     TEXT NOT NULL,
            started_by    TEXT,
            agent_dir     TEXT,
            current_node  TEXT,
            waiting_node  TEXT,
            output        TEXT,
            error         TEXT
        )
        """,
        "CREATE INDEX runs_started ON runs (started_at DESC, run_id DESC)",
        "CREATE INDEX runs_parent ON runs (parent_run_id)",
        "CREATE INDEX runs_status ON runs (status)",
        """
        CREATE TABLE leases (
            run_id     TEXT COLLATE "C" PRIMARY KEY,
            owner      TEXT NOT NULL,
            pid        INTEGER NOT NULL,
            host       TEXT NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL,
            started    DOUBLE PRECISION NOT NULL DEFAULT 0
        )
        """,
        """
        CREATE TABLE run_queue (
            run_id      TEXT COLLATE "C" PRIMARY KEY,
            state       TEXT NOT NULL,
            settings    JSONB NOT NULL DEFAULT '{}',
            resume_run  TEXT COLLATE "C",
            queued_at   DOUBLE PRECISION NOT NULL,
            updated_at  DOUBLE PRECISION NOT NULL,
            worker      TEXT,
            attempts    INTEGER NOT NULL DEFAULT 0,
            answered    BOOLEAN NOT NULL DEFAULT false
        )
        """,
        "CREATE INDEX run_queue_ready ON run_queue (state, queued_at)",
        """
        CREATE VIEW run_events AS
        SELECT run_id, seq, ts, type, node_id, body::jsonb AS data, prev_hash, hash
        FROM events
        """,
    ],
    # Requests to cancel a run another process drives (its driver polls them).
    2: [
        """
        CREATE TABLE cancel_requests (
            run_id       TEXT COLLATE "C" PRIMARY KEY,
            requested_by TEXT NOT NULL,
            reason       TEXT NOT NULL,
            requested_at DOUBLE PRECISION NOT NULL
        )
        """,
    ],
    # A worker's claim holds an advisory lock on the run (see claim()): lock_key is
    # its key, locked_at when it was taken, by the server's clock (a lock taken
    # before the server last started was lost to the restart, not to a death).
    3: [
        "ALTER TABLE leases ADD COLUMN lock_key BIGINT",
        "ALTER TABLE leases ADD COLUMN locked_at TIMESTAMPTZ",
        "CREATE INDEX IF NOT EXISTS runs_status_started ON runs (status, started_at DESC, "
        "run_id DESC)",
    ],
    # A run's folded state at one seq (see graphrun.eventstore.snapshots).
    4: [
        """
        CREATE TABLE snapshots (
            run_id TEXT COLLATE "C" PRIMARY KEY,
            seq    INTEGER NOT NULL,
            hash   TEXT NOT NULL,
            body   BYTEA NOT NULL,
            digest TEXT NOT NULL
        )
        """,
    ],
}


#: SQL: whether a lease row's holder has lost its advisory lock since taking it
#: (the lock was taken after the server started, and no session holds it now):
#: the holder's connection is gone, so its process is.
def _lock_gone(alias: str) -> str:
    return (
        f"({alias}.locked_at > pg_postmaster_start_time() AND NOT EXISTS (SELECT 1 "
        "FROM pg_locks k WHERE k.locktype = 'advisory' AND k.database = (SELECT oid "
        "FROM pg_database WHERE datname = current_database()) AND k.objsubid = 1 "
        f"AND k.classid::bigint = ({alias}.lock_key >> 32) "
        f"AND k.objid::bigint = ({alias}.lock_key & 4294967295)))"
    )


_COLS = ", ".join(COLUMNS)
_UPSERT_RUN = (
    f"INSERT INTO runs ({_COLS}) VALUES ({', '.join('%s' for _ in COLUMNS)}) "
    "ON CONFLICT (run_id) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in COLUMNS[1:])
)
_INSERT_EVENT = (
    "INSERT INTO events (run_id, seq, ts, type, node_id, body, prev_hash, hash) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)
_SELECT_RUN = f"SELECT {_COLS} FROM runs"
_RENEW = "UPDATE leases SET expires_at = %s WHERE run_id = %s AND owner = %s"


def _compact(sql: str) -> str:
    """SQL without its comments and runs of blanks: psycopg caches the parsing of
    (and prepares) only statements up to 4 KB, and the claim's would not fit."""
    return " ".join(re.sub(r"--[^\n]*", "", sql).split())


#: SQL: the advisory lock key of the run id ``{run}`` in the schema ``{schema}``:
#: the first 63 bits of ``sha256(schema || '.' || run_id)`` (PostgresStore._lock_key).
_LOCK_KEY = (
    "(('x' || encode(substr(sha256(convert_to({schema} || '.' || {run}, 'UTF8')), 1, 8), "
    "'hex'))::bit(64)::bigint & 9223372036854775807)"
)

#: One claim, one statement (one round trip): up to ``n`` of the oldest queued runs
#: (and running ones whose worker is gone) are locked ``FOR UPDATE SKIP LOCKED``
#: (workers never wait on each other), their advisory locks tried on the claiming
#: connection, their leases taken where still free, their queue rows set to
#: ``running``; each row comes back with whether it was taken and, if so, the log
#: of the run to continue (``resume_run`` or itself) and its cancel request. A run
#: whose worker lives is taken only once its lease expired or its process is seen
#: dead on this host (``dead``): then without its lock, which the heartbeat takes
#: once that worker lets go of it.
_CLAIM_WITH = (
    """
alive AS MATERIALIZED (
    SELECT (k.classid::bigint << 32) | k.objid::bigint AS key FROM pg_locks k
    WHERE k.locktype = 'advisory' AND k.objsubid = 1
      AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())
), fresh AS MATERIALIZED (
    -- Queued runs, oldest first, along the (state, queued_at) index: a long queue
    -- costs a claim no more than a short one.
    SELECT q.run_id, q.settings, q.resume_run, q.attempts, q.queued_at, l.owner AS was
    FROM run_queue q LEFT JOIN leases l ON l.run_id = q.run_id
    WHERE q.state = 'queued' AND NOT (q.run_id = ANY(%(skip)s))
      AND (l.run_id IS NULL OR l.expires_at <= %(now)s OR l.owner = ANY(%(dead)s)
           OR (l.locked_at > pg_postmaster_start_time()
               AND NOT EXISTS (SELECT 1 FROM alive a WHERE a.key = l.lock_key)))
    ORDER BY q.queued_at LIMIT %(n)s
    FOR UPDATE OF q SKIP LOCKED
), orphaned AS MATERIALIZED (
    -- Running runs whose worker is gone (as many as workers drive at once, at most).
    SELECT q.run_id, q.settings, q.resume_run, q.attempts, q.queued_at, l.owner AS was
    FROM run_queue q LEFT JOIN leases l ON l.run_id = q.run_id
    WHERE q.state = 'running' AND NOT (q.run_id = ANY(%(skip)s))
      AND (l.run_id IS NULL OR l.expires_at <= %(now)s OR l.owner = ANY(%(dead)s)
           OR (l.locked_at > pg_postmaster_start_time()
               AND NOT EXISTS (SELECT 1 FROM alive a WHERE a.key = l.lock_key)))
    ORDER BY q.queued_at LIMIT %(n)s
    FOR UPDATE OF q SKIP LOCKED
), candidate AS MATERIALIZED (
    SELECT c.*, """
    + _LOCK_KEY.format(schema="%(schema)s", run="c.run_id")
    + """ AS key
    FROM (SELECT * FROM orphaned UNION ALL SELECT * FROM fresh) AS c
    ORDER BY c.queued_at LIMIT %(n)s
), locked AS MATERIALIZED (
    SELECT c.*, pg_try_advisory_lock(c.key) AS got FROM candidate c
), taken AS (
    INSERT INTO leases (run_id, owner, pid, host, expires_at, started, lock_key, locked_at)
    SELECT run_id, %(owner)s, %(pid)s, %(host)s, %(until)s, %(started)s, key,
           CASE WHEN got THEN clock_timestamp() END
    FROM locked
    ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner, pid = excluded.pid,
        host = excluded.host, expires_at = excluded.expires_at, started = excluded.started,
        lock_key = excluded.lock_key, locked_at = excluded.locked_at
    -- The lease as it is now (the candidate may have been seen before another
    -- worker's claim committed): taken only if still free. Holding the run's
    -- lock now, this claim knows a holder that had taken the same lock since the
    -- server started has lost it, so is gone.
    WHERE leases.expires_at <= %(now)s OR leases.owner = ANY(%(dead)s)
       OR (excluded.locked_at IS NOT NULL AND leases.lock_key = excluded.lock_key
           AND leases.locked_at > pg_postmaster_start_time())
    RETURNING run_id
), running AS (
    UPDATE run_queue q SET state = 'running', worker = %(owner)s, updated_at = %(now)s,
        attempts = q.attempts + 1, answered = false
    FROM taken t WHERE q.run_id = t.run_id
    RETURNING q.run_id
)"""
)
_CLAIM_COLUMNS = """k.run_id, k.settings, k.resume_run, k.attempts, k.was, k.key, k.got,
       r.run_id IS NOT NULL, e.seqs, e.bodies, e.prevs, e.hashes,
       c.requested_by, c.reason, s.seq, s.hash, s.body, s.digest"""
_CLAIM_JOINS = """
LEFT JOIN running r ON r.run_id = k.run_id
LEFT JOIN LATERAL (
    SELECT array_agg(v.seq ORDER BY v.seq) AS seqs, array_agg(v.body ORDER BY v.seq) AS bodies,
           array_agg(v.prev_hash ORDER BY v.seq) AS prevs,
           array_agg(v.hash ORDER BY v.seq) AS hashes
    FROM events v WHERE r.run_id IS NOT NULL AND v.run_id = coalesce(k.resume_run, k.run_id)
) e ON true
LEFT JOIN cancel_requests c
    ON r.run_id IS NOT NULL AND c.run_id = coalesce(k.resume_run, k.run_id)
LEFT JOIN snapshots s
    ON r.run_id IS NOT NULL AND s.run_id = coalesce(k.resume_run, k.run_id)
ORDER BY k.queued_at
"""
_CLAIM = _compact(f"WITH {_CLAIM_WITH} SELECT {_CLAIM_COLUMNS} FROM locked k{_CLAIM_JOINS}")

#: Claimed runs handed back (``runs``, each with its queue state in ``states``):
#: their queue rows and leases change, then (they done: ``handed`` reads them)
#: their advisory locks (``keys``) go; an answer that came while this worker held
#: a run queues it again.
_FINISH_WITH = """
queue AS (
    UPDATE run_queue q SET state = CASE WHEN h.state = 'unstarted' OR (h.state = 'waiting'
        AND q.answered) THEN 'queued' ELSE h.state END, answered = false, worker = NULL,
        updated_at = %(now)s, attempts = q.attempts - (h.state = 'unstarted')::int
    FROM unnest(%(runs)s::text[], %(states)s::text[]) AS h(run_id, state)
    WHERE q.run_id = h.run_id AND q.worker = %(owner)s RETURNING 1
), lease AS (
    DELETE FROM leases WHERE run_id = ANY(%(runs)s) AND owner = %(owner)s RETURNING 1
), handed AS MATERIALIZED (
    SELECT (SELECT count(pg_advisory_unlock(k)) FROM unnest(%(keys)s::bigint[]) AS k
            WHERE q.n + l.n >= 0) AS unlocked
    FROM (SELECT count(*) AS n FROM queue) AS q, (SELECT count(*) AS n FROM lease) AS l
)"""
_FINISH = _compact(f"WITH {_FINISH_WITH} SELECT unlocked FROM handed")

#: A hand-back and the next claim in one statement: one row per candidate (or one
#: of nulls when there is none), ``handed`` read once whatever the rest finds.
_FINISH_AND_CLAIM = _compact(
    f"WITH {_FINISH_WITH}, {_CLAIM_WITH} "
    f"SELECT {_CLAIM_COLUMNS} FROM handed h LEFT JOIN locked k ON true{_CLAIM_JOINS}"
)

#: The advisory locks this session holds that it should not: released after a
#: claim failed midway (session locks outlive the transaction that took them).
_UNLOCK_OTHERS = """
SELECT pg_advisory_unlock((k.classid::bigint << 32) | k.objid::bigint) FROM pg_locks k
WHERE k.locktype = 'advisory' AND k.objsubid = 1 AND k.pid = pg_backend_pid()
  AND NOT ((k.classid::bigint << 32) | k.objid::bigint = ANY(%s))
"""


@functools.lru_cache(maxsize=128)
def _step_statement(
    rows: int, fenced: bool = False, headed: bool = False, ended: bool = False
) -> str:
    """One statement inserting ``rows`` events and upserting the run's row: the
    row is written only if every event was (a taken seq fails it all). ``fenced``:
    nothing is written unless this store still holds the run's lease (two more
    parameters, the run id and the owner, follow the events'). ``headed``: nothing
    is written unless the run's log still ends where the writer thinks (two more
    parameters, the run id and the hash of its last event): a database that lost
    commits the writer saw (a crash under ``synchronous_commit = off``) must not
    get events after a gap. ``ended``: the events end the run, whose state
    snapshot goes with them (one more parameter, the run id)."""
    values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s)"] * rows)
    insert = _INSERT_EVENT.partition(" VALUES ")[0]
    checks = []
    if fenced:
        checks.append("EXISTS (SELECT 1 FROM leases WHERE run_id = %s AND owner = %s)")
    if headed:
        checks.append("EXISTS (SELECT 1 FROM runs WHERE run_id = %s AND last_hash = %s)")
    if checks:
        rows_sql = f"SELECT * FROM (VALUES {values}) AS v WHERE " + " AND ".join(checks)
    else:
        rows_sql = f"VALUES {values}"
    cleared = (
        ", cleared AS (DELETE FROM snapshots WHERE run_id = %s AND EXISTS (SELECT 1 FROM added))"
        if ended
        else ""
    )
    return f"WITH added AS ({insert} {rows_sql} RETURNING 1){cleared} " + _UPSERT_RUN.replace(
        f"VALUES ({', '.join('%s' for _ in COLUMNS)})",
        f"SELECT {', '.join('%s' for _ in COLUMNS)} WHERE (SELECT count(*) FROM added) > 0",
        1,
    )


def is_postgres_url(value: str | os.PathLike[str] | None) -> bool:
    """Whether ``--db`` / ``$GRAPHRUN_DB`` names a PostgreSQL database."""
    return isinstance(value, str) and value.startswith(("postgresql://", "postgres://"))


def masked(url: str) -> str:
    """The URL without its password (for messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    userinfo = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{userinfo}:***@{netloc[1]}"))


def _pid_alive(pid: int, started: float = 0.0) -> bool:
    """Whether the process holding a lease on this host may still run: the SQLite
    store's rule (:func:`graphrun.eventstore.store.holder_alive`): its pid, started
    when the lease says (a reused pid does not hold it), not a zombie. Nothing is
    sent to the process."""
    return holder_alive(
        Lease(
            run_id="", owner="", pid=pid, host=socket.gethostname(), expires_at=0.0, started=started
        )
    )


class _PoolLog(logging.Handler):
    """psycopg_pool's own log records, routed through graphrun's: each goes to the
    ``graphrun.postgres`` logger at debug level (``GRAPHRUN_LOG=debug`` shows
    them) and a warning (a connection that failed or broke) is passed, as one
    short line, to the listeners (a worker says once that the database is away)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.listeners: list[Callable[[str], None]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        _log.debug("psycopg_pool: %s", message)
        if record.levelno >= logging.WARNING:
            line = message.strip().splitlines()[0] if message.strip() else record.levelname
            if line.startswith("discarding closed connection"):
                line = "the connection to the server was lost"
            else:
                line = re.sub(r"^error connecting in '[^']*': ", "", line)
            for listener in list(self.listeners):
                listener(line)


_log = logging.getLogger("graphrun.postgres")
_pool_log = _PoolLog()


def _route_pool_logging() -> None:
    """Route psycopg's loggers (psycopg_pool's is ``psycopg.pool``) through
    graphrun's, once per process: their records no longer reach Python's
    last-resort handler, raw, on stderr."""
    pool_logger = logging.getLogger("psycopg")
    if _pool_log not in pool_logger.handlers:
        pool_logger.addHandler(_pool_log)
        pool_logger.propagate = False


def on_connection_trouble(listener: Callable[[str], None]) -> None:
    """Call ``listener`` with a short line whenever the pool of any PostgreSQL
    store of this process fails to connect or loses a connection."""
    _route_pool_logging()
    _pool_log.listeners.append(listener)


def _lease_live(lease: Lease, now: float) -> bool:
    if lease.expires_at < now:
        return False
    return not (lease.host == socket.gethostname() and not _pid_alive(lease.pid, lease.started))


def _modules() -> tuple[Any, Any]:
    try:
        import psycopg
        import psycopg_pool
    except ImportError:
        raise StoreError(
            "a postgresql:// database needs psycopg and psycopg_pool",
            hint="pip install 'graphrun[postgres]'",
        ) from None
    return psycopg, psycopg_pool


class PostgresStore:
    """An event store in a PostgreSQL database, with :class:`SqliteStore`'s methods.

    Args:
        url: ``postgresql://user:password@host:port/dbname`` (libpq's URL form,
            query parameters included, e.g. ``?options=-csearch_path%3Dteam``).
        create: accepted for parity with the SQLite store: the tables are made
            on first use either way.
        clock: the clock that stamps events and leases.
        durability: ``"normal"`` (a commit returns before it is flushed to disk,
            as SQLite's WAL with ``synchronous=NORMAL``; ``sync`` appends wait
            for the flush) or ``"full"`` (every commit waits for it).
        max_connections: the pool's size.
    """

    def __init__(
        self,
        url: str,
        *,
        create: bool = True,
        clock: Clock | None = None,
        durability: str = "normal",
        max_connections: int = 16,
    ) -> None:
        if durability not in ("normal", "full"):
            raise StoreError(f"unknown durability {durability!r} (use 'normal' or 'full')")
        psycopg, psycopg_pool = _modules()
        self._psycopg = psycopg
        self._pool_timeout = psycopg_pool.PoolTimeout
        self.url = url
        self.path = masked(url)
        self.clock = clock or Clock()
        self.durability = durability
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._lock = threading.Lock()
        self._rows: dict[str, RunRow] = {}
        self._renew_at: dict[str, float] = {}
        # Runs whose lease a worker holds for longer than one drive (see hold()).
        self._held: set[str] = set()
        # Runs being handed back right now (finish_claim): a heartbeat that misses
        # their lease row meanwhile has not lost them to another worker.
        self._releasing: set[str] = set()
        # run id -> queue settings, for runs whose RunStarted also queues them.
        self._to_queue: dict[str, dict[str, Any]] = {}
        # The connection holding this store's advisory locks on claimed runs (opened
        # on the first claim), and the runs locked on it.
        self._lock_conn: Any = None
        self._lock_guard = threading.Lock()
        self._locked: set[str] = set()
        # Owners of leases on this host seen dead, and when to look again (claims).
        self._dead: set[str] = set()
        self._dead_at = 0.0
        self._process_start: float | None = None
        # run id -> (time.monotonic(), its cancel request or None) as a claim read
        # it: the driver's first look for a request, answered without asking again.
        self._cancel_seen: dict[str, tuple[float, tuple[str, str] | None]] = {}
        self._schema = ""
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
                self._migrate(conn)
                self._schema = str(conn.execute("SELECT current_schema()").fetchone()[0])
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot open the PostgreSQL event store {self.path}: {_first_line(exc)}"
            ) from None
        _route_pool_logging()
        self.pool = psycopg_pool.ConnectionPool(
            url,
            min_size=1,
            max_size=max(1, max_connections),
            kwargs={"autocommit": True},
            configure=self._configure,
            open=True,
            name="graphrun",
        )

    # -- opening -------------------------------------------------------------------

    def _configure(self, conn: Any) -> None:
        """Each pooled connection: like SQLite's default (WAL, synchronous=NORMAL),
        a commit is not flushed to disk before it returns unless the store is
        ``durability="full"`` or the append asks for ``sync`` (human answers): a
        killed graphrun process loses nothing committed either way."""
        if self.durability != "full":
            conn.execute("SET synchronous_commit = off")

    def _migrate(self, conn: Any) -> None:
        enc = conn.execute("SHOW server_encoding").fetchone()[0]
        if enc.upper() not in ("UTF8", "SQL_ASCII"):
            raise CorruptStoreError(
                f"{self.path} uses the {enc} encoding; graphrun stores JSON text in UTF8",
                hint="create the database WITH ENCODING 'UTF8'",
            )
        if self._version(conn) == SCHEMA_VERSION:
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATE_LOCK,))
            if conn.execute("SELECT current_schema()").fetchone()[0] is None:
                raise StoreError(
                    f"{self.path}: no schema of the search_path exists",
                    hint="create the schema first, or fix search_path",
                )
            conn.execute(
                "CREATE TABLE IF NOT EXISTS graphrun_meta (key TEXT PRIMARY KEY, value TEXT)"
            )
            version = self._version(conn)
            if version > SCHEMA_VERSION:
                raise CorruptStoreError(
                    f"{self.path} was written by a newer graphrun (schema {version}, "
                    f"this one knows {SCHEMA_VERSION})",
                    hint="upgrade graphrun",
                )
            if version == 0:
                found = conn.execute("SELECT to_regclass('events')").fetchone()[0]
                if found is not None:
                    raise CorruptStoreError(
                        f"{self.path} already has an events table that graphrun did not make",
                        hint="use another database or schema (search_path)",
                    )
            for number in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[number]:
                    conn.execute(statement)
            conn.execute(
                "INSERT INTO graphrun_meta (key, value) VALUES ('schema_version', %s) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(SCHEMA_VERSION),),
            )

    @staticmethod
    def _version(conn: Any) -> int:
        if conn.execute("SELECT to_regclass('graphrun_meta')").fetchone()[0] is None:
            return 0
        found = conn.execute(
            "SELECT value FROM graphrun_meta WHERE key = 'schema_version'"
        ).fetchone()
        return int(found[0]) if found else 0

    @contextmanager
    def _conn(self) -> Iterator[Any]:
        """A pooled connection; database errors become :class:`StoreError`, and
        :class:`StoreUnreachableError` when the server could not be reached or the
        connection broke (then what this store remembers of runs' heads is
        forgotten: the server may have lost its last commits)."""
        psycopg = self._psycopg
        broken = False
        try:
            with self.pool.connection() as conn:
                try:
                    yield conn
                finally:
                    broken = bool(conn.broken)
        except psycopg.errors.UniqueViolation:
            raise
        except psycopg.Error as exc:
            if broken or isinstance(exc, self._pool_timeout):
                with self._lock:
                    self._rows.clear()
                raise StoreUnreachableError(f"PostgreSQL {self.path}: {_first_line(exc)}") from None
            raise StoreError(f"PostgreSQL {self.path}: {_first_line(exc)}") from None

    @staticmethod
    def on_connection_trouble(listener: Callable[[str], None]) -> None:
        """See :func:`on_connection_trouble` (a worker's outage line)."""
        on_connection_trouble(listener)

    def close(self) -> None:
        with self._lock_guard:
            if self._lock_conn is not None:
                self._lock_conn.close()
                self._lock_conn = None
                self._locked.clear()
        self.pool.close()

    # -- advisory locks on claimed runs ------------------------------------------------

    def _lock_key(self, run_id: str) -> int:
        """The advisory lock key of a run in this schema (63 bits, never negative);
        the same as ``_LOCK_KEY`` computes in SQL."""
        digest = hashlib.sha256(f"{self._schema}.{run_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF

    def _on_lock_conn(self, work: Callable[[Any], Any]) -> Any:
        """``work(conn)`` on the connection holding this store's advisory locks,
        under the guard. The connection is opened when missing; when it breaks,
        every lock it held is gone with it (the heartbeat takes them again, see
        heartbeat()), and ``work`` is tried once more on a new one. Another
        error of the database leaves the connection (and its locks) as it is."""
        psycopg = self._psycopg
        for attempt in (1, 2):
            conn = self._lock_conn
            fresh = conn is None or conn.closed
            try:
                if fresh:
                    self._locked.clear()
                    conn = self._lock_conn = psycopg.connect(
                        self.url, autocommit=True, connect_timeout=10
                    )
                    for setting in (
                        # Over TCP: a worker whose host vanishes is noticed in
                        # seconds, not after two hours of keepalive silence.
                        "tcp_keepalives_idle = 5",
                        "tcp_keepalives_interval = 2",
                        "tcp_keepalives_count = 3",
                        # This connection idles between heartbeats: never cut for it.
                        "idle_session_timeout = 0",
                        # Claims and hand-backs commit here: flushed before they
                        # are used, whatever the store's durability.
                        "synchronous_commit = on",
                    ):
                        with contextlib.suppress(psycopg.Error):
                            conn.execute(f"SET {setting}")
                return work(conn)
            except psycopg.Error as exc:
                operational = isinstance(exc, psycopg.OperationalError) or bool(
                    conn is not None and conn.broken
                )
                if not operational:
                    raise StoreError(f"PostgreSQL {self.path}: {_first_line(exc)}") from None
                if conn is not None:
                    with contextlib.suppress(psycopg.Error):
                        conn.close()
                self._lock_conn = None
                self._locked.clear()
                if not fresh and attempt == 1:
                    continue  # a connection that broke since its last use: a new one
                raise StoreUnreachableError(f"PostgreSQL {self.path}: {_first_line(exc)}") from None
        raise AssertionError("unreachable")

    def _locking(self, sql: str, run_id: str) -> bool:
        """``sql`` (one of the advisory lock functions) of ``run_id``'s key on the
        lock connection (see :meth:`_on_lock_conn`), under the guard."""
        key = self._lock_key(run_id)
        return bool(self._on_lock_conn(lambda conn: conn.execute(sql, (key,)).fetchone()[0]))

    def _try_lock(self, run_id: str) -> bool:
        with self._lock_guard:
            if run_id in self._locked:
                return True
            got = self._locking("SELECT pg_try_advisory_lock(%s)", run_id)
            if got:
                self._locked.add(run_id)
            return got

    def _relock(self, run_id: str) -> bool:
        """Take the lock of a run this worker holds again (false: not taken). A run
        handed back meanwhile is not locked: its hand-back dropped it from the held
        runs before giving up the lock, and the check is under the same guard."""
        with self._lock_guard:
            if run_id not in self._held or run_id in self._locked:
                return False
            got = self._locking("SELECT pg_try_advisory_lock(%s)", run_id)
            if got:
                self._locked.add(run_id)
            return got

    def _unlock(self, run_id: str) -> None:
        """Give up a run's advisory lock (once its lease row is gone or another's)."""
        with self._lock_guard:
            if run_id not in self._locked or run_id in self._held:
                return
            self._locked.discard(run_id)
            with contextlib.suppress(StoreError):
                self._locking("SELECT pg_advisory_unlock(%s)", run_id)

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- appending -----------------------------------------------------------------

    def _row(self, conn: Any, run_id: str) -> RunRow | None:
        with self._lock:
            row = self._rows.get(run_id)
        if row is None:
            found = conn.execute(_SELECT_RUN + " WHERE run_id = %s", (run_id,)).fetchone()
            if found is not None:
                row = RunRow(*found)
        return row

    def append(self, run_id: str, events: Sequence[Event], *, sync: bool = False) -> list[Event]:
        """Append events to a run in one transaction; returns them stamped.

        Each event gets ``run_id``, the next ``seq`` and (unless set) ``ts``.
        Raises :class:`ConcurrentAppendError` if another writer got there first.
        ``sync`` waits for the commit to reach the disk (see ``durability``)."""
        if not events:
            return []
        replace = msgspec.structs.replace
        with self._conn() as conn:
            row = self._row(conn, run_id)
            seq = row.last_seq if row else 0
            prev = head = row.last_hash if row else codec.GENESIS
            now = self.clock.now()
            stamped: list[Event] = []
            params: list[tuple[Any, ...]] = []
            answered = False
            settles = False
            for event in events:
                seq += 1
                if event.seq != seq or event.run_id != run_id or not event.ts:
                    if event.run_id == run_id and event.seq and event.seq != seq:
                        with self._lock:
                            self._rows.pop(run_id, None)
                        raise ConcurrentAppendError(
                            f"run {run_id} is at seq {seq - 1} here, not {event.seq - 1} "
                            "as its writer thought",
                            hint="only one process may extend a run at a time; after a "
                            "database crash, commits not yet flushed may be gone: the next "
                            "drive reads the log again",
                        )
                    event = replace(event, run_id=run_id, seq=seq, ts=event.ts or now)
                body = codec.encode(event)
                red = redaction.redact_event(event, body)  # keys are never recorded
                if red is not event:
                    event, body = red, codec.encode(red)
                digest = codec.chain_hash(prev, body)
                params.append(
                    (
                        run_id,
                        seq,
                        event.ts,
                        type(event).__name__,
                        getattr(event, "node_id", None),
                        body.decode("utf-8"),
                        prev,
                        digest,
                    )
                )
                prev = digest
                row = apply_run_row(row, event, digest)
                answered = answered or isinstance(event, HumanInputReceived)
                settles = settles or isinstance(event, _HAND_BACK_EVENTS)
                stamped.append(event)
            assert row is not None
            with self._lock:
                renew_at = self._renew_at.get(run_id)
                queue = (
                    self._to_queue.pop(run_id, None) if isinstance(events[0], RunStarted) else None
                )
                fenced = run_id in self._held
            renew = renew_at is not None and now >= renew_at
            # A commit that must wait for the flush on a connection that does not
            # (``durability="normal"``) needs a transaction to say so; at ``full``
            # every commit waits, and a step is still one statement.
            durable = (sync or settles) and self.durability != "full"
            try:
                if not (renew or queue is not None or answered or durable) and len(params) <= 64:
                    # A node step: its events and the run's row in one statement,
                    # one round trip, committed as one transaction.
                    args = [value for p in params for value in p]
                    if fenced:
                        args += (run_id, self.owner)
                    if head != codec.GENESIS:
                        args += (run_id, head)
                    ended = row.status in ENDED_STATUSES  # (at `full`: see _append_in)
                    if ended:
                        args.append(run_id)
                    cur = conn.execute(
                        _step_statement(len(params), fenced, head != codec.GENESIS, ended),
                        [*args, *msgspec.structs.astuple(row)],
                    )
                    if cur.rowcount == 0:
                        if (
                            fenced
                            and not conn.execute(
                                "SELECT 1 FROM leases WHERE run_id = %s AND owner = %s",
                                (run_id, self.owner),
                            ).fetchone()
                        ):
                            raise self._lost(run_id)
                        raise self._moved(conn, run_id, params[0][1] - 1)
                else:
                    with conn.transaction(), conn.cursor() as cur:
                        if durable:
                            cur.execute("SET LOCAL synchronous_commit = on")
                        if (
                            fenced
                            and not cur.execute(
                                "SELECT 1 FROM leases WHERE run_id = %s AND owner = %s FOR UPDATE",
                                (run_id, self.owner),
                            ).fetchone()
                        ):
                            raise self._lost(run_id)
                        if (
                            head != codec.GENESIS
                            and not cur.execute(
                                "SELECT 1 FROM runs WHERE run_id = %s AND last_hash = %s",
                                (run_id, head),
                            ).fetchone()
                        ):
                            raise self._moved(conn, run_id, params[0][1] - 1)
                        self._append_in(cur, run_id, row, params, now, renew, queue, answered)
            except self._psycopg.errors.UniqueViolation:
                with self._lock:
                    self._rows.pop(run_id, None)
                    if queue is not None:
                        self._to_queue[run_id] = queue
                raise ConcurrentAppendError(
                    f"run {run_id} was extended by another writer (seq {params[0][1]} taken)",
                    hint="only one process may extend a run at a time",
                ) from None
        with self._lock:
            self._rows[run_id] = row
            if renew:
                self._renew_at[run_id] = now + LEASE_SECONDS / 3
        return stamped

    def _moved(self, conn: Any, run_id: str, seq: int) -> ConcurrentAppendError:
        """The run's log does not end where this writer thought (at ``seq``)."""
        with self._lock:
            self._rows.pop(run_id, None)
        found = conn.execute("SELECT last_seq FROM runs WHERE run_id = %s", (run_id,)).fetchone()
        return ConcurrentAppendError(
            f"run {run_id} was extended by another writer (it ends at seq "
            f"{found[0] if found else 0} in the database, not at seq {seq} as this writer "
            "thought); nothing was appended",
            hint="only one process may extend a run at a time; after a database crash, "
            "commits not yet flushed may be gone: the next drive reads the log again",
        )

    def _sync_commit(self, conn: Any) -> None:
        """This transaction's commit waits for the flush (as ``durability="full"``)."""
        if self.durability != "full":
            conn.execute("SET LOCAL synchronous_commit = on")

    def _lost(self, run_id: str) -> LeaseHeldError:
        """A worker's run whose lease another worker took (this one stalled past it)."""
        with self._lock:
            self._rows.pop(run_id, None)
        return LeaseHeldError(
            f"run {run_id} was taken over by another worker (this worker's lease on it "
            "expired); nothing more is appended by this one",
            hint="a longer --lease suits workers that stall",
        )

    def _append_in(
        self,
        cur: Any,
        run_id: str,
        row: RunRow,
        params: list[tuple[Any, ...]],
        now: float,
        renew: bool,
        queue: dict[str, Any] | None,
        answered: bool,
    ) -> None:
        """An append's statements, inside its transaction."""
        cur.executemany(_INSERT_EVENT, params)
        cur.execute(_UPSERT_RUN, msgspec.structs.astuple(row))
        if row.status in ENDED_STATUSES:  # (its step statement does the same, at `full`)
            cur.execute("DELETE FROM snapshots WHERE run_id = %s", (run_id,))
        if renew:
            cur.execute(_RENEW, (now + LEASE_SECONDS, run_id, self.owner))
        if queue is not None:
            cur.execute(
                "INSERT INTO run_queue (run_id, state, settings, queued_at, "
                "updated_at) VALUES (%s, 'queued', %s, %s, %s)",
                (run_id, self._psycopg.types.json.Jsonb(queue), now, now),
            )
        if answered:
            self._mark_answered(cur, run_id, row, now)

    def _mark_answered(self, cur: Any, run_id: str, row: RunRow, now: float) -> None:
        """A person answered ``run_id``: the queued run it belongs to (itself or an
        ancestor) becomes runnable again, to be continued from ``run_id``."""
        target, resume = run_id, run_id
        for _ in range(64):  # a run tree deeper than this is not a real one
            # A run still held by its worker is marked: its hand-back as "waiting"
            # queues it instead (the worker may not have seen this answer).
            found = cur.execute(
                "UPDATE run_queue SET state = CASE WHEN state = 'waiting' THEN 'queued' "
                "ELSE state END, answered = true, resume_run = %s, updated_at = %s "
                "WHERE run_id = %s AND state IN ('waiting', 'running', 'queued') "
                "RETURNING run_id",
                (resume, now, target),
            ).fetchone()
            if found is not None:
                return
            parent = (
                row.parent_run_id
                if target == run_id
                else (
                    cur.execute(
                        "SELECT parent_run_id FROM runs WHERE run_id = %s", (target,)
                    ).fetchone()
                    or (None,)
                )[0]
            )
            if not parent:
                return
            target = parent

    # -- reading -------------------------------------------------------------------

    def has_run(self, run_id: str) -> bool:
        with self._conn() as conn:
            return (
                conn.execute("SELECT 1 FROM runs WHERE run_id = %s", (run_id,)).fetchone()
                is not None
            )

    def read(
        self, run_id: str, *, after: int = 0, upto: int | None = None, light: bool = False
    ) -> list[Event]:
        """The events of a run in seq order (``after < seq <= upto``); ``light``: LLM
        calls' wire bodies left undecoded (:data:`graphrun.eventstore.codec.LightLlmCalled`)."""
        sql = "SELECT seq, body FROM events WHERE run_id = %s AND seq > %s"
        args: list[Any] = [run_id, after]
        if upto is not None:
            sql += " AND seq <= %s"
            args.append(upto)
        with self._conn() as conn:
            rows = conn.execute(sql + " ORDER BY seq", args).fetchall()
            if not rows and not self._exists(conn, run_id):
                raise self.unknown_run(run_id)
        decode = codec.decode
        out: list[Event] = []
        for seq, body in rows:
            try:
                out.append(decode(body, light=light))
            except codec.DECODE_ERRORS as exc:
                raise damaged_run(
                    run_id, seq, f"event seq {seq} in the database does not decode ({exc})"
                ) from None
        return out

    def _exists(self, conn: Any, run_id: str) -> bool:
        return (
            conn.execute("SELECT 1 FROM runs WHERE run_id = %s", (run_id,)).fetchone() is not None
        )

    def raw_rows(self, run_id: str) -> Iterator[tuple[int, bytes, str, str]]:
        """Stored ``(seq, body, prev_hash, hash)`` rows, for verification: ``body``
        is the stored text's bytes exactly, the bytes the chain hashes."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT seq, body, prev_hash, hash FROM events WHERE run_id = %s ORDER BY seq",
                (run_id,),
            ).fetchall()
        for seq, body, prev, digest in rows:
            yield seq, body.encode("utf-8"), prev, digest

    def verify(self, run_id: str) -> codec.ChainProblem | None:
        return self.read_verified(run_id)[1]

    def read_verified(
        self, run_id: str, *, hashes: dict[int, str] | None = None, light: bool = False
    ) -> tuple[list[Event], codec.ChainProblem | None]:
        """The run's events and :meth:`verify`'s answer, in one reading of the log
        (each event decoded once); the events are the run's only when there is no
        problem. ``hashes``, if given, gets each verified event's chain hash by seq.
        ``light``: LLM calls' wire bodies are left undecoded
        (:data:`graphrun.eventstore.codec.LightLlmCalled`)."""
        if not self.has_run(run_id):
            raise self.unknown_run(run_id)
        events: list[Event] = []
        return events, codec.verify_chain(
            self.raw_rows(run_id), into=events, hashes=hashes, light=light
        )

    # -- snapshots (see graphrun.eventstore.snapshots) -------------------------------

    def snapshot(self, run_id: str) -> tuple[int, str, bytes, str] | None:
        """The run's kept snapshot row ``(seq, hash, body, digest)``, or ``None``
        (none kept, or the server could not say: a snapshot is never needed)."""
        try:
            with self._conn() as conn:
                found = conn.execute(
                    "SELECT seq, hash, body, digest FROM snapshots WHERE run_id = %s", (run_id,)
                ).fetchone()
        except StoreError:
            return None
        if found is None:
            return None
        seq, digest, body, check = found
        return seq, digest, bytes(body), check

    def stored_after(self, run_id: str, after: int) -> list[tuple[int, bytes, str]]:
        """The run's stored ``(seq, body, hash)`` rows after seq ``after``, in order."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT seq, body, hash FROM events WHERE run_id = %s AND seq > %s ORDER BY seq",
                (run_id, after),
            ).fetchall()
        return [(seq, body.encode("utf-8"), digest) for seq, body, digest in rows]

    def keep_snapshot(self, run_id: str, seq: int, digest: str, body: bytes, check: str) -> bool:
        """Keep ``body`` as the run's snapshot at ``seq`` (chain hash ``digest``) in
        place of the one before; whether it was written."""
        try:
            with self._conn() as conn:
                conn.execute(
                    "INSERT INTO snapshots (run_id, seq, hash, body, digest) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (run_id) DO UPDATE SET "
                    "seq = excluded.seq, hash = excluded.hash, body = excluded.body, "
                    "digest = excluded.digest",
                    (run_id, seq, digest, body, check),
                )
        except StoreError:
            return False
        return True

    def lost_head(self, run_id: str) -> str | None:
        """Never behind a reported head here (PostgreSQL never drops a commit it acknowledged)."""
        return None

    def lost_heads(self) -> dict[str, str]:
        return {}

    def require_intact(self, run_id: str) -> None:
        """Raise unless the run's log verifies (call it before extending a run
        another process wrote); the error names the first bad seq."""
        problem = self.verify(run_id)
        if problem is None:
            return
        from graphrun.eventstore import store as sqlite_store

        # The SQLite store's error for a broken log, where that version has one.
        broken = getattr(sqlite_store, "broken_log", None)
        if broken is not None:
            raise broken(run_id, problem)
        raise CorruptStoreError(
            f"run {run_id} does not verify at seq {problem.seq}: {problem.reason}",
            hint=f"nothing was appended; `graphrun audit {run_id} --verify` checks the run",
        )

    def run(self, run_id: str) -> RunRow:
        # Always the table (the cache is this process's view, for appending).
        with self._conn() as conn:
            found = conn.execute(_SELECT_RUN + " WHERE run_id = %s", (run_id,)).fetchone()
        row = RunRow(*found) if found is not None else None
        if row is None:
            raise self.unknown_run(run_id)
        with self._lock:
            if run_id in self._held and run_id not in self._rows:
                # A run this worker holds: no one else appends to it (appends check
                # the lease), so its next append starts from this row instead of
                # reading it again.
                self._rows[run_id] = row
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
        # PostgreSQL keeps only valid text: a runs row is never undecodable here.
        sql, args = runs_query(
            _SELECT_RUN, "%s", status=status, parent=parent, limit=limit, offset=offset
        )
        with self._conn() as conn:
            return [RunRow(*r) for r in conn.execute(sql, args).fetchall()]

    def resolve_run_id(self, prefix: str) -> str:
        """A full run id from a unique prefix (like git's short hashes)."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT run_id FROM runs WHERE run_id >= %s AND run_id < %s LIMIT 3",
                (prefix, prefix + "\uffff"),
            ).fetchall()
        return prefix_match(prefix, rows, self.unknown_run(prefix))

    def unknown_run(self, run_id: str) -> UnknownRunError:
        return UnknownRunError(
            f"no run {run_id!r} in {self.path}", hint="`graphrun runs` lists the runs"
        )

    def rebuild_runs(self) -> int:
        """Drop and rebuild the ``runs`` projection from ``events``; returns rows."""
        with self._conn() as conn, conn.transaction():
            conn.execute("LOCK TABLE runs IN EXCLUSIVE MODE")
            rows = conn.execute(
                "SELECT run_id, seq, body, hash FROM events ORDER BY run_id, seq"
            ).fetchall()
            stored = []
            for run_id, seq, body, digest in rows:
                try:
                    stored.append((codec.decode(body), digest))
                except codec.DECODE_ERRORS as exc:
                    raise damaged_run(
                        run_id,
                        seq,
                        f"event seq {seq} does not decode ({exc}); the runs were not rebuilt",
                    ) from None
            rebuilt = rebuild_rows(stored)
            conn.execute("DELETE FROM runs")
            with conn.cursor() as cur:
                cur.executemany(_UPSERT_RUN, [msgspec.structs.astuple(r) for r in rebuilt.values()])
        with self._lock:
            self._rows.clear()
        return len(rebuilt)

    # -- leases --------------------------------------------------------------------

    def acquire_lease(self, run_id: str, *, seconds: float = LEASE_SECONDS) -> None:
        """Take the run for this process, or raise :class:`LeaseHeldError`.

        A run this store's worker claimed is its own already (the claim took the
        lease, the heartbeat renews it): nothing to do. Had another worker taken
        it over since, the first append says so (appends to a claimed run check
        the lease's owner)."""
        with self._lock:
            if run_id in self._held:
                return
        host = socket.gethostname()
        now = self.clock.now()
        with self._conn() as conn:
            found = conn.execute(
                "SELECT owner, pid, host, expires_at, started, "
                f"{_lock_gone('l')} FROM leases l WHERE run_id = %s",
                (run_id,),
            ).fetchone()
            dead = ""
            if found is not None and found[0] != self.owner:
                owner, pid, lease_host, expires_at, started, lock_gone = found
                if lock_gone or (lease_host == host and not _pid_alive(pid, started)):
                    dead = owner
                elif expires_at > now:
                    raise self._held_error(run_id, pid, lease_host, expires_at - now)
            # One statement: of two processes racing for a free or expired lease,
            # exactly one gets it.
            taken = conn.execute(
                "INSERT INTO leases (run_id, owner, pid, host, expires_at, started) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (run_id) DO UPDATE SET "
                "owner = excluded.owner, pid = excluded.pid, host = excluded.host, "
                "expires_at = excluded.expires_at, started = excluded.started, "
                # A worker's own claim keeps its advisory lock's columns.
                "lock_key = CASE WHEN leases.owner = excluded.owner THEN leases.lock_key END, "
                "locked_at = CASE WHEN leases.owner = excluded.owner THEN leases.locked_at END "
                "WHERE leases.owner = %s OR leases.expires_at <= %s OR leases.owner = %s "
                "RETURNING owner",
                (
                    run_id,
                    self.owner,
                    os.getpid(),
                    host,
                    now + seconds,
                    _process_started(),
                    self.owner,
                    now,
                    dead,
                ),
            ).fetchone()
            if taken is None:
                held = conn.execute(
                    "SELECT pid, host, expires_at FROM leases WHERE run_id = %s", (run_id,)
                ).fetchone() or (0, "?", now)
                raise self._held_error(run_id, held[0], held[1], held[2] - now)
        with self._lock:
            self._renew_at[run_id] = now + min(seconds, LEASE_SECONDS) / 3
            # Another process may have appended while we did not hold the run.
            self._rows.pop(run_id, None)

    @staticmethod
    def _held_error(run_id: str, pid: int, host: str, left: float) -> LeaseHeldError:
        return LeaseHeldError(
            f"run {run_id} is being extended by process {pid} on {host}",
            hint=f"wait for it to finish or stop it; the lease expires in {left:.0f}s "
            "if that process is gone",
        )

    def renew_lease(self, run_id: str, *, seconds: float = LEASE_SECONDS) -> None:
        now = self.clock.now()
        with self._conn() as conn:
            conn.execute(_RENEW, (now + seconds, run_id, self.owner))
        with self._lock:
            if run_id in self._renew_at:
                self._renew_at[run_id] = now + min(seconds, LEASE_SECONDS) / 3

    def release_lease(self, run_id: str) -> None:
        with self._lock:
            if run_id in self._held:
                return  # a worker's claim: released with the queue row (finish_claim)
            self._renew_at.pop(run_id, None)
        with self._conn() as conn:
            conn.execute(
                "DELETE FROM leases WHERE run_id = %s AND owner = %s", (run_id, self.owner)
            )

    def lease(self, run_id: str) -> Lease | None:
        with self._conn() as conn:
            found = conn.execute(
                "SELECT run_id, owner, pid, host, expires_at, started FROM leases "
                "WHERE run_id = %s",
                (run_id,),
            ).fetchone()
        return Lease(*found) if found else None

    def is_live(self, run_id: str) -> bool:
        """Whether some live process holds the run's lease: not expired, its
        worker's advisory lock still held, its process alive (on this host)."""
        with self._conn() as conn:
            found = conn.execute(
                "SELECT run_id, owner, pid, host, expires_at, started, "
                f"{_lock_gone('l')} FROM leases l WHERE run_id = %s",
                (run_id,),
            ).fetchone()
        if found is None or found[-1]:
            return False
        return _lease_live(Lease(*found[:-1]), self.clock.now())

    def release_stale_leases(self) -> list[str]:
        """Delete the lease rows of holders that are gone for sure (their worker's
        advisory lock is free, or their process is dead on this host); returns
        their runs. A killed process leaves its row behind; nothing else clears
        it until the run is taken again. An expired lease of a process that may
        live (another host, no lock) stays: it is shown as expired."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT run_id, owner, pid, host, expires_at, started, "
                f"{_lock_gone('l')} FROM leases l WHERE owner <> %s",
                (self.owner,),
            ).fetchall()
            here = socket.gethostname()
            stale = [
                (r[0], r[1]) for r in rows if r[-1] or (r[3] == here and not _pid_alive(r[2], r[5]))
            ]
            for run_id, owner in stale:
                # Only the row that was judged: a new holder's row stays.
                conn.execute(
                    "DELETE FROM leases l WHERE run_id = %s AND owner = %s "
                    f"AND (host = %s OR {_lock_gone('l')})",
                    (run_id, owner, here),
                )
        return sorted(r for r, _ in stale)

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
        with self._conn() as conn:
            if not self._exists(conn, run_id):
                raise self.unknown_run(run_id)
            conn.execute(
                "INSERT INTO cancel_requests (run_id, requested_by, reason, requested_at) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING",
                (run_id, by, reason, self.clock.now()),
            )

    def cancel_requested(self, run_id: str) -> tuple[str, str] | None:
        """``(by, reason)`` of the request to cancel ``run_id``, or ``None``. The
        first look after a claim is answered by what the claim read, when it read
        it less than ``_CANCEL_FRESH`` seconds ago."""
        with self._lock:
            seen = self._cancel_seen.pop(run_id, None)
        if seen is not None and time.monotonic() - seen[0] < _CANCEL_FRESH:
            return seen[1]
        with self._conn() as conn:
            found = conn.execute(
                "SELECT requested_by, reason FROM cancel_requests WHERE run_id = %s", (run_id,)
            ).fetchone()
        return (str(found[0]), str(found[1])) if found else None

    # -- the run queue (graphrun submit / worker) ------------------------------------

    def queue_on_start(self, run_id: str, settings: dict[str, Any]) -> None:
        """Queue ``run_id`` for workers in the same transaction as its ``RunStarted``."""
        with self._lock:
            self._to_queue[run_id] = settings

    def queued(self, run_id: str) -> dict[str, Any] | None:
        """The queue row of ``run_id`` or of the queued run it descends from."""
        with self._conn() as conn:
            target: str | None = run_id
            for _ in range(64):
                if target is None:
                    return None
                found = conn.execute(
                    "SELECT run_id, state, settings, resume_run, worker, attempts "
                    "FROM run_queue WHERE run_id = %s",
                    (target,),
                ).fetchone()
                if found is not None:
                    keys = ("run_id", "state", "settings", "resume_run", "worker", "attempts")
                    return dict(zip(keys, found, strict=True))
                parent = conn.execute(
                    "SELECT parent_run_id FROM runs WHERE run_id = %s", (target,)
                ).fetchone()
                target = parent[0] if parent else None
        return None

    def claim(self, *, seconds: float = LEASE_SECONDS) -> dict[str, Any] | None:
        """Take the oldest queued run, or a running one whose worker is gone; see
        :meth:`claim_many`. Returns its claim, or ``None`` when nothing is ready."""
        claims = self.claim_many(1, seconds=seconds)
        return claims[0] if claims else None

    def claim_many(self, n: int, *, seconds: float = LEASE_SECONDS) -> list[dict[str, Any]]:
        """Take up to ``n`` of the oldest queued runs (and running ones whose worker
        is gone), in one statement: one round trip, however many are taken.

        Each run's queue row is locked (``FOR UPDATE SKIP LOCKED``: workers never
        wait on each other), its lease taken, its state set to ``running``. Each
        claim is the queue row (``run_id``, ``settings``, ``resume_run``,
        ``attempts``, ``taken_over``) and ``log``: the stored rows (``raw_rows``)
        of the run to continue, read as the claim took it, for the worker to
        verify and fold instead of reading them again. The lease stays held
        through drives until :meth:`finish_claim`.

        A worker is gone when its lease expired, when its process is dead on this
        host, or, on any host, when the advisory lock its claim took is free: the
        lock lives on a connection of the worker's own (the one claims run on),
        which PostgreSQL closes the moment the worker dies. The claim takes that
        lock itself before the lease, so of two workers only one can succeed, and
        the worker it replaces cannot append any more (appends check the lease's
        owner)."""
        if n < 1:
            return []
        with self._lock_guard:
            return self._claim(n, seconds)

    def _claim(
        self, n: int, seconds: float, finishing: Sequence[tuple[str, str]] = ()
    ) -> list[dict[str, Any]]:
        """:meth:`claim_many` under the guard; ``finishing``: ``(run id, state)`` of
        runs handed back in the same statement first (see :meth:`finish_claims`)."""
        now = self.clock.now()
        tick = time.monotonic()
        with self._lock:
            skip = sorted(self._held | self._locked)
            for run_id, (when, _) in list(self._cancel_seen.items()):
                if tick - when >= _CANCEL_FRESH:
                    del self._cancel_seen[run_id]
        args = {
            "schema": self._schema,
            "skip": skip,
            "now": now,
            "dead": self._dead_here(now),
            "n": n,
            "owner": self.owner,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "until": now + seconds,
            "started": self._started(),
        }

        sql = _CLAIM
        if finishing:
            # The hand-backs and the claim: one statement (one round trip, one flush).
            sql = _FINISH_AND_CLAIM
            args.update(self._finish_args(finishing, now))
        try:
            rows = self._on_lock_conn(lambda conn: conn.execute(sql, args).fetchall())
        except StoreUnreachableError:
            raise  # the connection went, and every lock with it
        except StoreError:
            # The statement failed after taking some locks, maybe: those go.
            with contextlib.suppress(StoreError):
                keep = [self._lock_key(r) for r in self._locked]
                self._on_lock_conn(lambda conn: conn.execute(_UNLOCK_OTHERS, (keep,)))
            raise
        if finishing:
            self._finished([run_id for run_id, _state in finishing])
        claims: list[dict[str, Any]] = []
        refused: list[int] = []
        for row in rows:
            run_id, settings, resume, attempts, owner, key, got, taken = row[:8]
            if run_id is None:
                continue  # (the hand-back's row when nothing was found)
            if not taken:
                if got:
                    refused.append(key)
                continue
            seqs, bodies, prevs, hashes, cancel_by, cancel_reason = row[8:14]
            kept = None if row[14] is None else (row[14], row[15], bytes(row[16]), row[17])
            with self._lock:
                self._held.add(run_id)
                if got:
                    self._locked.add(run_id)
                self._renew_at[run_id] = now + min(seconds, LEASE_SECONDS) / 3
                self._rows.pop(run_id, None)
                target = resume or run_id
                self._rows.pop(target, None)
                self._cancel_seen[target] = (
                    time.monotonic(),
                    (str(cancel_by), str(cancel_reason)) if cancel_by is not None else None,
                )
            claims.append(
                {
                    "run_id": run_id,
                    "settings": settings,
                    "resume_run": resume,
                    "attempts": attempts + 1,
                    "taken_over": owner is not None and owner != self.owner,
                    "log": [
                        (seq, body.encode("utf-8"), prev, digest)
                        for seq, body, prev, digest in zip(
                            seqs or (), bodies or (), prevs or (), hashes or (), strict=True
                        )
                    ],
                    # The run's kept state snapshot row (see snapshot()), or None.
                    "snapshot": kept,
                }
            )
        if refused:
            # Locked but not taken (another claim got there first): let go.
            with contextlib.suppress(StoreError):
                self._on_lock_conn(
                    lambda conn: conn.execute(
                        "SELECT pg_advisory_unlock(k) FROM unnest(%s::bigint[]) AS k",
                        (refused,),
                    )
                )
        return claims

    def _started(self) -> float:
        """When this process started (a lease's ``started``), looked up once."""
        if self._process_start is None:
            self._process_start = _process_started()
        return self._process_start

    def _dead_here(self, now: float) -> list[str]:
        """Owners of live leases on running queued runs whose process is gone from
        this host (under the guard). Looked for at most every ``_DEAD_EVERY``
        seconds: a dead worker's advisory lock frees its runs at once anyway; this
        is for a run taken without its lock (from a worker that stalled past its
        lease), whose new holder then died. An owner seen dead stays dead."""
        tick = time.monotonic()
        if tick < self._dead_at:
            return sorted(self._dead)
        self._dead_at = tick + _DEAD_EVERY
        here = self._on_lock_conn(
            lambda conn: conn.execute(
                "SELECT DISTINCT l.owner, l.pid, l.started FROM leases l "
                "JOIN run_queue q ON q.run_id = l.run_id "
                "WHERE q.state = 'running' AND l.host = %s AND l.expires_at > %s "
                "AND l.owner <> %s",
                (socket.gethostname(), now, self.owner),
            ).fetchall()
        )
        owners = {owner for owner, _pid, _started in here}
        self._dead = {o for o in self._dead if o in owners} | {
            owner for owner, pid, started in here if not _pid_alive(pid, started)
        }
        return sorted(self._dead)

    def finish_claim(
        self, run_id: str, state: str, *, claim: int = 0, seconds: float = LEASE_SECONDS
    ) -> list[dict[str, Any]]:
        """Hand a claimed run back: ``state`` is ``done``, ``waiting``, ``queued`` (a
        run this worker stops driving, for another to continue) or ``stuck`` (a run
        no worker could drive, left for a person); see :meth:`finish_claims`."""
        return self.finish_claims([(run_id, state)], claim=claim, seconds=seconds)

    def finish_claims(
        self,
        done: Sequence[tuple[str, str]],
        *,
        claim: int = 0,
        seconds: float = LEASE_SECONDS,
    ) -> list[dict[str, Any]]:
        """Hand claimed runs back, each ``(run id, queue state)`` (see
        :meth:`finish_claim`; ``unstarted``: a run claimed and never driven, queued
        again with its attempt not counted), in one statement committed flushed:
        their queue rows and leases change, then their advisory locks go. When the
        database cannot be reached the runs stay this worker's (their leases
        renewed by the heartbeat) and :class:`StoreError` is raised: call again.

        ``claim``: claim up to that many runs in the same statement (see
        :meth:`claim_many`), whose claims are returned: a worker hands its runs
        back and takes the next ones in one round trip and one flush. When that
        fails, nothing of either happened."""
        for _run_id, state in done:
            if state not in ("done", "waiting", "queued", "stuck", "unstarted"):
                raise ValueError(f"unknown queue state {state!r}")
        runs = [run_id for run_id, _state in done]
        if not runs and claim < 1:
            return []
        with self._lock:
            self._releasing.update(runs)
        try:
            with self._lock_guard:
                if claim > 0 or not done:
                    return self._claim(claim, seconds, done)
                args = self._finish_args(done, self.clock.now())
                self._on_lock_conn(lambda conn: conn.execute(_FINISH, args))
                self._finished(runs)
                return []
        finally:
            with self._lock:
                self._releasing.difference_update(runs)

    def _finish_args(self, done: Sequence[tuple[str, str]], now: float) -> dict[str, Any]:
        """``_FINISH_WITH``'s parameters (under the guard)."""
        return {
            "runs": [run_id for run_id, _state in done],
            "states": [state for _run_id, state in done],
            "now": now,
            "owner": self.owner,
            # A run whose lock is lost keeps none to give up (see _unlock).
            "keys": [self._lock_key(r) for r, _state in done if r in self._locked],
        }

    def _finished(self, runs: Sequence[str]) -> None:
        """Runs handed back are this worker's no more (under the guard: the
        heartbeat never locks them again)."""
        with self._lock:
            for run_id in runs:
                self._held.discard(run_id)
                self._renew_at.pop(run_id, None)
                self._rows.pop(run_id, None)
                self._locked.discard(run_id)

    def _forget(self, run_id: str) -> None:
        """The run is no longer this worker's: drop it and its advisory lock."""
        with self._lock:
            self._held.discard(run_id)
            self._renew_at.pop(run_id, None)
            self._rows.pop(run_id, None)
        self._unlock(run_id)

    def heartbeat(self, *, seconds: float = LEASE_SECONDS) -> list[str]:
        """Renew every lease this store's worker holds; returns the runs it lost
        (another worker took them; they are this worker's no more).

        A run whose advisory lock went with a broken connection (the server
        restarted, the network failed) is locked again here; one whose lock
        another worker holds now is lost."""
        with self._lock:
            held = sorted(self._held)
        if not held:
            return []
        now = self.clock.now()
        with self._lock_guard:
            with contextlib.suppress(self._psycopg.Error):
                if self._lock_conn is not None and not self._lock_conn.closed:
                    self._lock_conn.execute("SELECT 1")
            if self._lock_conn is not None and self._lock_conn.broken:
                self._lock_conn.close()
                self._lock_conn = None
                self._locked.clear()
        relock = [r for r in held if r not in self._locked]
        # A lock another holds now (a hung worker's, whose expired lease this one
        # took) is tried again at the next beat; the lease row says who holds the run.
        relocked = [r for r in relock if self._relock(r)]
        with self._conn() as conn:
            kept = {
                r[0]
                for r in conn.execute(
                    "UPDATE leases SET expires_at = %s, locked_at = CASE WHEN run_id = "
                    "ANY(%s) THEN clock_timestamp() ELSE locked_at END "
                    "WHERE owner = %s AND run_id = ANY(%s) RETURNING run_id",
                    (now + seconds, relocked, self.owner, held),
                ).fetchall()
            }
        with self._lock:
            # Not lost: a run handed back meanwhile (no longer held, or being).
            lost = sorted(
                r for r in set(held) - kept if r in self._held and r not in self._releasing
            )
        for run_id in lost:
            self._forget(run_id)
        return lost

    def queue_counts(self) -> dict[str, int]:
        """How many queued runs are in each state."""
        with self._conn() as conn:
            rows = conn.execute("SELECT state, count(*) FROM run_queue GROUP BY state").fetchall()
        return {state: int(n) for state, n in rows}

    # -- copying (graphrun migrate) ----------------------------------------------------

    def copy_in(self, run_id: str, rows: Sequence[tuple[int, bytes, str, str]]) -> None:
        """Store a run's ``raw_rows`` from another store as they are: the bodies,
        ``prev_hash`` and ``hash`` are kept, not recomputed (``graphrun migrate``)."""
        if not rows:
            return
        row: RunRow | None = None
        params = []
        for seq, body, prev, digest in rows:
            event = codec.decode(body)
            row = apply_run_row(row, event, digest)
            params.append(
                (
                    run_id,
                    seq,
                    event.ts,
                    type(event).__name__,
                    getattr(event, "node_id", None),
                    body.decode("utf-8"),
                    prev,
                    digest,
                )
            )
        assert row is not None
        try:
            with self._conn() as conn, conn.transaction(), conn.cursor() as cur:
                cur.executemany(_INSERT_EVENT, params)
                cur.execute(_UPSERT_RUN, msgspec.structs.astuple(row))
        except self._psycopg.errors.UniqueViolation:
            raise ConcurrentAppendError(
                f"run {run_id} already has events in {self.path}",
                hint="a copied run is only added where it is missing",
            ) from None


def copy_runs(
    source: Any, target: Any, *, say: Any = None, run_ids: Sequence[str] | None = None
) -> tuple[int, int]:
    """Copy every run (or ``run_ids``) of ``source`` into ``target``, either store
    kind, keeping each run's hash chain: a run lands with the very hashes it had,
    or not at all. Runs already in ``target`` with the same last hash are left as
    they are. Returns ``(copied, already there)``."""
    copied = present = 0
    ids = list(run_ids) if run_ids else [r.run_id for r in source.runs(limit=1 << 62)]
    for run_id in ids:
        problem = source.verify(run_id)
        if problem is not None:
            raise CorruptStoreError(
                f"run {run_id} in {source.path} does not verify at seq {problem.seq} "
                f"({problem.reason}); not copied",
                hint=f"graphrun audit {run_id} --verify --db {source.path}",
            )
        rows = list(source.raw_rows(run_id))
        if target.has_run(run_id):
            if target.run(run_id).last_hash == rows[-1][3]:
                present += 1
                continue
            raise StoreError(
                f"run {run_id} is already in {target.path} with other events",
                hint="copy into another database",
            )
        if hasattr(target, "copy_in"):
            target.copy_in(run_id, rows)
        else:
            # An SQLite file keeps an event's canonical encoding: the chain is the
            # same exactly when re-encoding gives the stored bytes back.
            events = source.read(run_id)
            prev = codec.GENESIS
            for event, (seq, _body, _prev, digest) in zip(events, rows, strict=True):
                prev = codec.chain_hash(prev, codec.encode(event))
                if prev != digest:
                    raise StoreError(
                        f"run {run_id}: event {seq} cannot be stored in {target.path} with "
                        "its hash (it holds fields this graphrun does not know)",
                        hint="copy it with the graphrun that wrote it",
                    )
            target.append(run_id, events, sync=True)
        if target.run(run_id).last_hash != rows[-1][3] or target.verify(run_id) is not None:
            raise CorruptStoreError(f"run {run_id}: the copy in {target.path} does not verify")
        copied += 1
        if say is not None:
            say(f"▸ {run_id}: {len(rows)} events")
    return copied, present


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = [
    "SCHEMA_VERSION",
    "PostgresStore",
    "copy_runs",
    "is_postgres_url",
    "masked",
    "on_connection_trouble",
]
