"""Schema changes of the event database, one function each, applied in order.

The fast path never imports sqlite-utils: :data:`SCHEMA_USER_VERSION` is kept in
``PRAGMA user_version`` and the store only runs :func:`migrate` when it is behind.
"""

from __future__ import annotations

import sqlite3
from typing import Any

#: ``PRAGMA application_id`` of a graphrun database ("grn1").
APPLICATION_ID = 0x67726E31
#: ``PRAGMA user_version`` once every migration below has run.
SCHEMA_USER_VERSION = 2


def _migrations() -> Any:
    from sqlite_utils import Migrations

    migrations = Migrations("graphrun")

    @migrations()
    def m001_events_runs_leases(db: Any) -> None:
        db.execute(
            """
            CREATE TABLE IF NOT EXISTS events (
                run_id    TEXT    NOT NULL,
                seq       INTEGER NOT NULL,
                ts        REAL    NOT NULL,
                type      TEXT    NOT NULL,
                node_id   TEXT,
                body      TEXT    NOT NULL,
                prev_hash TEXT    NOT NULL,
                hash      TEXT    NOT NULL,
                PRIMARY KEY (run_id, seq)
            ) WITHOUT ROWID
            """
        )
        db.execute(
            """
            CREATE TABLE IF NOT EXISTS runs (
                run_id        TEXT PRIMARY KEY,
                graph_name    TEXT NOT NULL,
                status        TEXT NOT NULL,
                parent_run_id TEXT,
                started_at    REAL NOT NULL,
                updated_at    REAL NOT NULL,
                last_seq      INTEGER NOT NULL,
                last_hash     TEXT NOT NULL,
                started_by    TEXT,
                agent_dir     TEXT,
                current_node  TEXT,
                waiting_node  TEXT,
                output        TEXT,
                error         TEXT
            )
            """
        )
        db.execute("CREATE INDEX IF NOT EXISTS runs_status ON runs(status)")
        db.execute("CREATE INDEX IF NOT EXISTS runs_parent ON runs(parent_run_id)")
        db.execute(
            """
            CREATE TABLE IF NOT EXISTS leases (
                run_id     TEXT PRIMARY KEY,
                owner      TEXT NOT NULL,
                pid        INTEGER NOT NULL,
                host       TEXT NOT NULL,
                expires_at REAL NOT NULL
            )
            """
        )
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('event_schema_version', '1')")

    @migrations()
    def m002_events_rowid_table(db: Any) -> None:
        """``events`` as a rowid table with a unique ``(run_id, seq)`` index.

        In a WITHOUT ROWID table a row over ~1/4 page spills to overflow pages, so
        an event carrying a 1 KB script output took ~4 KB on disk; rowid tables
        keep rows up to a page inline. The unique index is still the lock.
        """
        db.execute(
            """
            CREATE TABLE events_v2 (
                id        INTEGER PRIMARY KEY,
                run_id    TEXT    NOT NULL,
                seq       INTEGER NOT NULL,
                ts        REAL    NOT NULL,
                type      TEXT    NOT NULL,
                node_id   TEXT,
                body      TEXT    NOT NULL,
                prev_hash TEXT    NOT NULL,
                hash      TEXT    NOT NULL,
                UNIQUE (run_id, seq)
            )
            """
        )
        db.execute(
            "INSERT INTO events_v2 (run_id, seq, ts, type, node_id, body, prev_hash, hash) "
            "SELECT run_id, seq, ts, type, node_id, body, prev_hash, hash FROM events "
            "ORDER BY run_id, seq"
        )
        db.execute("DROP TABLE events")
        db.execute("ALTER TABLE events_v2 RENAME TO events")

    return migrations


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the database up to :data:`SCHEMA_USER_VERSION`."""
    from sqlite_utils import Database

    db = Database(conn)
    _migrations().apply(db)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {SCHEMA_USER_VERSION}")
    conn.commit()
