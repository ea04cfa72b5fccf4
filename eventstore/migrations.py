"""Schema changes of the event database, one function each, applied in order.

The fast path never imports sqlite-utils: :data:`SCHEMA_USER_VERSION` is kept in
``PRAGMA user_version`` and the store only runs :func:`migrate` when it is behind.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from graphrun.eventstore import codec

#: ``PRAGMA application_id`` of a graphrun database ("grn1").
APPLICATION_ID = 0x67726E31
#: ``PRAGMA user_version`` once every migration below has run.
SCHEMA_USER_VERSION = 3


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

    @migrations()
    def m003_events_keyed_by_run_number(db: Any) -> None:
        """``events`` keyed by ``run_no << 32 | seq``, bodies packed, hashes raw.

        The integer key is the lock and the per-run range in one, so the
        ``(run_id, seq)`` index and the ``run_id`` column go; ``prev_hash`` is the
        previous row's hash and is no longer stored; bodies leave out the
        envelope the row already holds (``run_id``, ``seq``, ``ts``), large ones
        are kept zlib-compressed, and hashes are 32 bytes. Hashes are unchanged:
        they are over the canonical JSON of the whole event, rebuilt exactly
        from the row (a row that cannot be is kept whole).
        """
        conn = db.conn
        conn.execute("ALTER TABLE runs ADD COLUMN run_no INTEGER")
        conn.execute(
            """
            CREATE TABLE events_v3 (
                id      INTEGER PRIMARY KEY,
                ts      REAL    NOT NULL,
                type    TEXT    NOT NULL,
                node_id TEXT,
                body    BLOB    NOT NULL,
                hash    BLOB    NOT NULL
            )
            """
        )
        numbers: dict[str, int] = {}
        for (run_id,) in conn.execute(
            "SELECT run_id FROM events GROUP BY run_id ORDER BY min(rowid)"
        ).fetchall():
            numbers[run_id] = len(numbers) + 1
        rows = conn.execute(
            "SELECT run_id, seq, ts, type, node_id, body, hash FROM events ORDER BY run_id, seq"
        )
        conn.executemany(
            "INSERT INTO events_v3 (id, ts, type, node_id, body, hash) VALUES (?, ?, ?, ?, ?, ?)",
            (
                (
                    numbers[run_id] << 32 | seq,
                    ts,
                    type_,
                    node_id,
                    _repack(body, run_id, seq, ts),
                    _raw_hash(digest),
                )
                for run_id, seq, ts, type_, node_id, body, digest in rows
            ),
        )
        conn.executemany(
            "UPDATE runs SET run_no = ? WHERE run_id = ?",
            [(number, run_id) for run_id, number in numbers.items()],
        )
        conn.execute("DROP TABLE events")
        conn.execute("ALTER TABLE events_v3 RENAME TO events")
        # Small tables in as few pages as they need: ``meta`` was never read, and
        # a WITHOUT ROWID ``leases`` needs no separate index for its key.
        conn.execute("DROP TABLE IF EXISTS meta")
        conn.execute(
            """
            CREATE TABLE leases_v3 (
                run_id     TEXT PRIMARY KEY,
                owner      TEXT NOT NULL,
                pid        INTEGER NOT NULL,
                host       TEXT NOT NULL,
                expires_at REAL NOT NULL
            ) WITHOUT ROWID
            """
        )
        conn.execute("INSERT INTO leases_v3 SELECT * FROM leases")
        conn.execute("DROP TABLE leases")
        conn.execute("ALTER TABLE leases_v3 RENAME TO leases")
        # For people (and tests) reading the log with SQL: events by run id and seq.
        conn.execute(
            """
            CREATE VIEW run_events AS
            SELECT runs.run_id AS run_id, events.id & 4294967295 AS seq, events.id AS id,
                   events.ts AS ts, events.type AS type, events.node_id AS node_id,
                   events.body AS body, events.hash AS hash
            FROM events JOIN runs ON runs.run_no = events.id >> 32
            """
        )

    return migrations


def _repack(body: str | bytes, run_id: str, seq: int, ts: float) -> str | bytes:
    """A v2 body in the v3 form, or kept whole (and packed) when it could not be
    rebuilt byte for byte from the v3 form (a damaged or hand-edited row)."""
    raw = body.encode("utf-8") if isinstance(body, str) else body
    try:
        event = codec.decode(raw)
        kept = codec.storable(event, raw)
        if codec.canonical_from_row(kept, run_id, seq, ts) != raw or event.run_id != run_id:
            kept = raw
    except Exception:  # undecodable: keep it as it is, verification will name it
        return body
    return codec.pack_body(kept, type(event).__name__ not in codec.PLAIN_TYPES)


def _raw_hash(digest: str) -> bytes | str:
    """``sha256:<hex>`` as 32 bytes; anything else (a damaged row) kept as text."""
    prefix, _, hexdigest = digest.partition(":")
    if prefix == "sha256" and len(hexdigest) == 64:
        try:
            return bytes.fromhex(hexdigest)
        except ValueError:
            pass
    return digest


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the database up to :data:`SCHEMA_USER_VERSION`."""
    from sqlite_utils import Database

    db = Database(conn)
    _migrations().apply(db)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {SCHEMA_USER_VERSION}")
    conn.commit()
