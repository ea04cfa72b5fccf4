"""The schema of the event database, and how older databases reach it.

Schema 7 (this one)::

    events     id = run_no << 32 | seq (the key and the lock), body (the event's
               canonical JSON text, exactly the bytes hashed), hash
               ("sha256:<hex>" over the previous hash and the body), and, derived
               from the hashed body, the virtual columns run_id, seq, ts, type, node_id
    run_heads  what a run's events say about it beyond its last event (status,
               parent, output, ...), written in the transaction of the event that
               changes it; run_no numbers the run in this file
    runs       a view: run_heads plus the step columns read from events
               (updated_at, last_seq, last_hash, current_node), so it is always true
    run_events a view: events with their run id and seq
    leases     which process extends a run, until when
    cancel_requests
               who asked to cancel a run another process drives, and why (not
               an event: only the run's writer appends to its log)
    snapshots  a run's folded state at one seq, with that seq's chain hash (see
               :mod:`graphrun.eventstore.snapshots`): never a fact, only a
               shortcut that a verified log confirms before it is used

Creating the schema and every migration run in one transaction (``BEGIN
IMMEDIATE``): a process killed at any point leaves the file as it was, and a
second process opening a new file waits for the first to finish and then finds
the schema there. ``PRAGMA user_version`` says which schema a file has (the fast
path reads it and nothing else); ``PRAGMA application_id`` marks it as graphrun's,
set in the same transaction.

Older files: schema 1 and 2 (written through sqlite-utils' migrations, bodies
canonical JSON text, hashes ``sha256:<hex>``) are copied row for row; schema 3
(bodies without the envelope, large ones zlib-compressed, hashes as 32 raw
bytes) has each body rebuilt as the canonical bytes its hash was computed over.
Schema 4 is schema 5 without ``cancel_requests``; schema 5 is schema 6 without
the listing indexes of ``run_heads`` (newest first, and newest first by status):
``runs`` reads its first page through them, whatever the number of runs. An
older file gets them from sqlite-utils, the library this module's first schemas
were migrated with; a new file, from the same definitions in SQL (importing
sqlite-utils costs ~70 ms, most of it numpy's, which no new store should pay).
Schema 6 is schema 7 without ``snapshots`` (a file that has none folds every run
from its first event, as before).
"""

from __future__ import annotations

import sqlite3
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import msgspec

from graphrun.eventstore import codec
from graphrun.eventstore.errors import CorruptStoreError
from graphrun.eventstore.projections import HEAD_COLUMNS, RUNS_VIEW_SQL

#: ``PRAGMA application_id`` of a graphrun database ("grn1").
APPLICATION_ID = 0x67726E31
#: ``PRAGMA user_version`` of the schema this code writes.
SCHEMA_USER_VERSION = 7

_SEQ_BITS = 32

#: Tables an older graphrun may have left (a file with only these is graphrun's).
_OWN_TABLES = frozenset(
    {
        "_sqlite_migrations",
        "events",
        "events_v2",
        "events_v3",
        "runs",
        "run_heads",
        "leases",
        "leases_v3",
        "cancel_requests",
        "meta",
        "snapshots",
    }
)


def _derived(field: str) -> str:
    return f"(CASE WHEN json_valid(body) THEN body ->> '$.{field}' END)"


EVENTS_SQL = f"""
CREATE TABLE events (
    id      INTEGER PRIMARY KEY,
    body    TEXT    NOT NULL,
    hash    TEXT    NOT NULL,
    run_id  TEXT    AS {_derived("run_id")} VIRTUAL,
    seq     INTEGER AS (id & 4294967295) VIRTUAL,
    ts      REAL    AS {_derived("ts")} VIRTUAL,
    type    TEXT    AS {_derived("type")} VIRTUAL,
    node_id TEXT    AS {_derived("node_id")} VIRTUAL
)
"""

RUN_HEADS_SQL = """
CREATE TABLE run_heads (
    run_id        TEXT PRIMARY KEY,
    run_no        INTEGER NOT NULL UNIQUE,
    graph_name    TEXT NOT NULL,
    status        TEXT NOT NULL,
    parent_run_id TEXT,
    started_at    REAL NOT NULL,
    started_by    TEXT,
    agent_dir     TEXT,
    waiting_node  TEXT,
    output        TEXT,
    error         TEXT
)
"""

LEASES_SQL = """
CREATE TABLE leases (
    run_id     TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    host       TEXT NOT NULL,
    started    REAL NOT NULL DEFAULT 0,
    expires_at REAL NOT NULL
) WITHOUT ROWID
"""

CANCEL_REQUESTS_SQL = """
CREATE TABLE cancel_requests (
    run_id       TEXT PRIMARY KEY,
    requested_by TEXT NOT NULL,
    reason       TEXT NOT NULL,
    requested_at REAL NOT NULL
) WITHOUT ROWID
"""

SNAPSHOTS_SQL = """
CREATE TABLE IF NOT EXISTS snapshots (
    run_id TEXT PRIMARY KEY,
    seq    INTEGER NOT NULL,
    hash   TEXT NOT NULL,
    body   BLOB NOT NULL,
    digest TEXT NOT NULL
) WITHOUT ROWID
"""

RUN_EVENTS_SQL = """
CREATE VIEW run_events AS
SELECT run_id, seq, id, ts, type, node_id, body, hash FROM events
"""


# -- the steps -------------------------------------------------------------------------


def create_schema(conn: sqlite3.Connection) -> None:
    """The tables, views and indexes of schema 7 (old tables, if any, were set aside)."""
    conn.execute("DROP TABLE IF EXISTS _sqlite_migrations")
    conn.execute(EVENTS_SQL)
    conn.execute(RUN_HEADS_SQL)
    conn.execute("CREATE INDEX run_heads_status ON run_heads(status)")
    conn.execute("CREATE INDEX run_heads_parent ON run_heads(parent_run_id)")
    conn.execute(LEASES_SQL)
    conn.execute(CANCEL_REQUESTS_SQL)
    conn.execute(RUNS_VIEW_SQL)
    conn.execute(RUN_EVENTS_SQL)
    # The listing indexes as schema 6 added them (sqlite-utils is for older files:
    # importing it costs a new store ~70 ms, most of it numpy's).
    conn.execute("CREATE INDEX run_heads_started ON run_heads(started_at DESC, run_id DESC)")
    conn.execute(
        "CREATE INDEX run_heads_status_started ON run_heads(status, started_at DESC, run_id DESC)"
    )
    add_snapshots(conn)


def add_listing_indexes(conn: sqlite3.Connection) -> None:
    """Schema 5 to 6: the indexes a page of ``runs`` is read through (newest first,
    optionally of one status), so listing never sorts every run."""
    from sqlite_utils import Database
    from sqlite_utils.db import DescIndex

    heads = Database(conn, recursive_triggers=False, execute_plugins=False).table("run_heads")
    newest = [DescIndex("started_at"), DescIndex("run_id")]
    heads.create_index(newest, index_name="run_heads_started", if_not_exists=True)
    heads.create_index(
        ["status", *newest], index_name="run_heads_status_started", if_not_exists=True
    )


def add_snapshots(conn: sqlite3.Connection) -> None:
    """Schema 6 to 7: the table of state snapshots (empty: every run is folded from
    its first event until a command keeps one)."""
    conn.execute(SNAPSHOTS_SQL)


def set_aside_old_tables(conn: sqlite3.Connection) -> None:
    """Rename an older schema's tables to ``old_*`` and drop its views and indexes."""
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'view'").fetchall():
        conn.execute(f'DROP VIEW "{name}"')
    for name in ("events", "runs", "leases"):
        conn.execute(f'ALTER TABLE "{name}" RENAME TO "old_{name}"')
    for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
    ).fetchall():
        if not name.startswith("idx__sqlite_migrations"):
            conn.execute(f'DROP INDEX "{name}"')


def copy_runs(conn: sqlite3.Connection) -> None:
    """``run_heads`` from the old ``runs`` rows, numbered as the old file numbered
    them (schema 3), else by the order their events were first written."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(old_runs)")}
    if "run_no" in columns:
        numbered = conn.execute("SELECT run_id, run_no FROM old_runs").fetchall()
        top = max((n for _r, n in numbered if n is not None), default=0)
        numbers: dict[str, int] = {}
        for run_id, number in numbered:
            if number is None:
                top += 1
                number = top
            numbers[run_id] = number
    else:
        numbers = {}
        order = conn.execute(
            "SELECT run_id FROM old_events GROUP BY run_id ORDER BY min(ts), run_id"
        )
        for (run_id,) in order.fetchall():
            numbers[run_id] = len(numbers) + 1
        for (run_id,) in conn.execute("SELECT run_id FROM old_runs ORDER BY started_at"):
            numbers.setdefault(run_id, len(numbers) + 1)
    wanted = [c for c in HEAD_COLUMNS if c != "run_id"]
    rows = conn.execute(f"SELECT run_id, {', '.join(wanted)} FROM old_runs").fetchall()
    conn.executemany(
        f"INSERT INTO run_heads (run_id, run_no, {', '.join(wanted)}) "
        f"VALUES (?, ?, {', '.join('?' for _ in wanted)})",
        [(row[0], numbers[row[0]], *row[1:]) for row in rows],
    )


def copy_events(conn: sqlite3.Connection) -> None:
    """Every old event as schema 4 stores it, with its hash unchanged."""
    numbers = dict(conn.execute("SELECT run_id, run_no FROM run_heads").fetchall())
    columns = {row[1] for row in conn.execute("PRAGMA table_info(old_events)")}
    insert = "INSERT INTO events (id, body, hash) VALUES (?, ?, ?)"
    if "run_id" in columns:  # schema 1 and 2: the body is the hashed bytes already
        rows = conn.execute("SELECT run_id, seq, body, hash FROM old_events ORDER BY run_id, seq")
        conn.executemany(
            insert,
            (
                (numbers[run_id] << _SEQ_BITS | seq, body, digest)
                for run_id, seq, body, digest in rows
                if run_id in numbers
            ),
        )
        return
    names = {number: run_id for run_id, number in numbers.items()}
    rows = conn.execute("SELECT id, ts, body, hash FROM old_events ORDER BY id")
    conn.executemany(
        insert,
        (
            (
                key,
                _as_text(_v3_canonical(stored, names.get(key >> _SEQ_BITS, ""), key, ts)),
                _v3_hash(digest),
            )
            for key, ts, stored, digest in rows
        ),
    )


def copy_leases(conn: sqlite3.Connection) -> None:
    conn.execute(
        "INSERT INTO leases (run_id, owner, pid, host, expires_at) "
        "SELECT run_id, owner, pid, host, expires_at FROM old_leases"
    )


def add_cancel_requests(conn: sqlite3.Connection) -> None:
    """Schema 4 to 5: the table of cancel requests."""
    conn.execute(CANCEL_REQUESTS_SQL)


def drop_old_tables(conn: sqlite3.Connection) -> None:
    for name in ("old_events", "old_runs", "old_leases", "meta", "_sqlite_migrations"):
        conn.execute(f'DROP TABLE IF EXISTS "{name}"')


#: What brings a file at schema N (the key) to schema 7, step by step; every
#: step of one file runs in one transaction.
Step = Callable[[sqlite3.Connection], None]
_FROM_OLDER: list[Step] = [
    set_aside_old_tables,
    create_schema,
    copy_runs,
    copy_events,
    copy_leases,
    drop_old_tables,
]
STEPS: dict[int, list[Step]] = {
    0: [create_schema],
    1: _FROM_OLDER,
    2: _FROM_OLDER,
    3: _FROM_OLDER,
    4: [add_cancel_requests, add_listing_indexes, add_snapshots],
    5: [add_listing_indexes, add_snapshots],
    6: [add_snapshots],
}


# -- schema 3 bodies -------------------------------------------------------------------


def _v3_canonical(stored: str | bytes, run_id: str, key: int, ts: float) -> bytes:
    """The bytes a schema-3 row's hash was computed over: its body, decompressed,
    with the envelope (run id, seq, time) the row held put back. A row that does
    not rebuild is kept as stored (verification then names it)."""
    if isinstance(stored, str):
        raw = stored.encode("utf-8")
    elif stored[:1] == b"{":
        raw = bytes(stored)
    else:
        try:
            raw = zlib.decompress(stored)
        except zlib.error:
            return bytes(stored)
    try:
        event = codec.decode(raw)
    except codec.DECODE_ERRORS:
        return raw
    if event.run_id:
        return raw
    seq = key & ((1 << _SEQ_BITS) - 1)
    return codec.encode(msgspec.structs.replace(event, run_id=run_id, seq=seq, ts=ts))


def _v3_hash(digest: bytes | str) -> str:
    if isinstance(digest, bytes) and len(digest) == 32:
        return f"{codec.HASH_ALGORITHM}:{digest.hex()}"
    return digest if isinstance(digest, str) else digest.hex()


def _as_text(body: bytes) -> str | bytes:
    """Text when it is UTF-8 (what SQL reads); damaged bytes kept as they are."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return body


# -- opening a file --------------------------------------------------------------------


def _version(conn: sqlite3.Connection, path: Path) -> int | None:
    """The file's schema, ``None`` when it is current; raises for a file that is
    not graphrun's or is newer than this code."""
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if app_id == APPLICATION_ID and version == SCHEMA_USER_VERSION:
        return None
    if app_id == APPLICATION_ID and version > SCHEMA_USER_VERSION:
        raise CorruptStoreError(
            f"{path} was written by a newer graphrun (schema {version}, "
            f"this one knows {SCHEMA_USER_VERSION})",
            hint="upgrade graphrun",
        )
    if app_id not in (0, APPLICATION_ID):
        raise CorruptStoreError(f"{path} belongs to another application")
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    # An older graphrun stopped before it created anything but sqlite-utils' table:
    # a new file.
    fresh = tables <= {"_sqlite_migrations"}
    if app_id == 0 and (tables - _OWN_TABLES or not (fresh or "events" in tables)):
        raise CorruptStoreError(
            f"{path} is an SQLite database of something else "
            f"(tables: {', '.join(sorted(tables)[:5])})",
            hint="point --db at a graphrun event database",
        )
    if app_id == 0 and "_sqlite_migrations" in tables and version == 0:
        # Written by an older graphrun that was stopped before it marked the file.
        (version,) = conn.execute(
            "SELECT count(*) FROM _sqlite_migrations WHERE migration_set = 'graphrun'"
        ).fetchone()
    if version not in STEPS or (version == 0 and not fresh):
        raise CorruptStoreError(
            f"{path} has an unknown graphrun schema ({version})",
            hint="point --db at a graphrun event database",
        )
    return int(version)


def _wal(conn: sqlite3.Connection, deadline: float) -> None:
    """WAL mode; another process switching the same new file makes this wait."""
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def prepare(conn: sqlite3.Connection, path: Path, *, timeout: float = 10.0) -> None:
    """Make ``conn``'s file a current graphrun database (WAL mode), or raise
    :class:`CorruptStoreError` leaving a file that is not one untouched."""
    deadline = time.monotonic() + timeout
    # One read transaction: the file's id, version and tables from one snapshot
    # (read one by one, another process's migration could commit in between, and
    # its tables would look like a file of unknown schema).
    conn.execute("BEGIN")
    try:
        current = _version(conn, path)
    finally:
        conn.execute("ROLLBACK")
    if current is None:
        _wal(conn, deadline)
        return
    _wal(conn, deadline)
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = _version(conn, path)  # another process may have got here first
        if version is not None:
            for step in STEPS[version]:
                step(conn)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_USER_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


__all__ = ["APPLICATION_ID", "SCHEMA_USER_VERSION", "STEPS", "prepare"]
