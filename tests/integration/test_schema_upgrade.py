"""Databases written by older schemas keep working: they are migrated on open (in one
transaction), and their runs list, replay, verify and export with the hashes they
were recorded with.

* ``events-schema-v1.db``: the first schema (events WITHOUT ROWID, user_version 1).
* ``events-schema-v3.db``: bodies without their envelope, large ones zlib BLOBs,
  hashes as raw bytes; made by importing every file of ``replays/``.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from graphrun.eventstore.migrations import SCHEMA_USER_VERSION

DATA = Path(__file__).resolve().parents[1] / "data"
REPLAYS = Path(__file__).resolve().parents[2] / "replays"
V1 = DATA / "events-schema-v1.db"
V3 = DATA / "events-schema-v3.db"


def _stored_columns(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [r[1] for r in conn.execute("PRAGMA table_xinfo(events)") if r[6] == 0]


def test_a_schema_v1_database_is_migrated_and_its_runs_replay(graphrun, tmp_path: Path) -> None:
    shutil.copy(V1, graphrun.db)
    with sqlite3.connect(graphrun.db) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    rows = graphrun("runs", "--json").json_lines()
    assert sorted(r["graph_name"] for r in rows) == ["file-triage", "release-checklist"]
    with sqlite3.connect(graphrun.db) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_USER_VERSION
        ddl = db.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()[0]
        numbers = [n for (n,) in db.execute("SELECT run_no FROM runs ORDER BY run_no")]
        tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "WITHOUT ROWID" not in ddl
    assert _stored_columns(graphrun.db) == ["id", "body", "hash"]
    assert tables == {"events", "run_heads", "leases", "cancel_requests", "snapshots"}
    assert numbers == [1, 2]
    for row in rows:
        replay = graphrun("replay", row["run_id"])
        assert replay.code == 0, replay.stdout + replay.stderr
        verify = graphrun("audit", row["run_id"], "--verify")
        assert verify.code == 0, verify.stderr
    audit = graphrun(
        "audit", next(r["run_id"] for r in rows if r["graph_name"] == "release-checklist")
    )
    assert "alice" in audit.stdout


def test_a_schema_v3_database_with_compressed_bodies_is_migrated(graphrun, tmp_path) -> None:
    shutil.copy(V3, graphrun.db)
    with sqlite3.connect(graphrun.db) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3
        blobs = db.execute("SELECT count(*) FROM events WHERE typeof(body) = 'blob'").fetchone()
        assert blobs[0] > 0
        recorded_runs = {r for (r,) in db.execute("SELECT run_id FROM runs")}
    rows = graphrun("runs", "--json").json_lines()
    assert {r["run_id"] for r in rows} == recorded_runs
    with sqlite3.connect(graphrun.db) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_USER_VERSION
        kinds = {k for (k,) in db.execute("SELECT DISTINCT typeof(body) FROM events")}
        (usage,) = db.execute(
            "SELECT json_extract(body, '$.usage') FROM events WHERE type = 'LlmCalled' LIMIT 1"
        ).fetchone()
    assert kinds == {"text"}
    assert json.loads(usage)
    for row in rows:
        run_id = row["run_id"]
        assert graphrun("audit", run_id, "--verify").code == 0
        replay = graphrun("replay", run_id)
        assert replay.code == 0, replay.stdout + replay.stderr
    # Every event keeps the bytes and the hash it was recorded with: an export of the
    # migrated run has the very event lines of the file it was imported from.
    compared = 0
    for path in REPLAYS.glob("*.run.jsonl"):
        run_id = json.loads(path.read_text().splitlines()[0])["runs"][0]
        if run_id not in recorded_runs:  # recorded after the schema-3 file was made
            continue
        compared += 1
        out = tmp_path / f"{run_id}.jsonl"
        assert graphrun("export", run_id, "-o", str(out), "--with-origin").code == 0
        recorded = [ln for ln in path.read_text().splitlines() if ln.startswith('{"hash"')]
        exported = [ln for ln in out.read_text().splitlines() if ln.startswith('{"hash"')]
        assert exported[: len(recorded)] == recorded, path.name
    assert compared  # replays/format-v1.run.jsonl at least: it is never re-recorded


def test_the_migrated_database_still_refuses_a_second_writer_of_a_seq(tmp_path: Path) -> None:
    import pytest

    from graphrun.eventstore.errors import ConcurrentAppendError
    from graphrun.eventstore.events import NodeEntered
    from graphrun.eventstore.store import SqliteStore

    db = tmp_path / "v1.db"
    shutil.copy(V1, db)
    first, second = SqliteStore(db), SqliteStore(db)
    run_id = first.runs()[0].run_id
    # second appends (and so knows the tail), then first extends the run behind its back
    second.append(run_id, [NodeEntered(node_id="x", node_type="end", visit=1)])
    first.append(run_id, [NodeEntered(node_id="y", node_type="end", visit=1)])
    with pytest.raises(ConcurrentAppendError):
        second.append(run_id, [NodeEntered(node_id="z", node_type="end", visit=1)])
    first.close()
    second.close()


def test_a_schema_5_database_gains_the_listing_indexes(tmp_path: Path) -> None:
    """Schema 5 to 6: the indexes a page of `runs` is read through are added (by
    sqlite-utils), and the first page is read through them, not by sorting every run."""
    from graphrun.eventstore.store import SqliteStore
    from tests.conformance.store_contract import started

    db = tmp_path / "five.db"
    with SqliteStore(db, create=True) as store:
        for i in range(30):
            store.append(f"r{i:02d}", [started()])
    with sqlite3.connect(db) as conn:
        conn.execute("DROP INDEX run_heads_started")
        conn.execute("DROP INDEX run_heads_status_started")
        conn.execute("PRAGMA user_version = 5")
    with SqliteStore(db) as store:
        assert [r.run_id for r in store.runs(limit=2, offset=1)] == ["r28", "r27"]
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_USER_VERSION
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert {"run_heads_started", "run_heads_status_started"} <= indexes
        for status in ("", "WHERE status = 'running' "):
            plan = " ".join(
                str(r[-1])
                for r in conn.execute(
                    "EXPLAIN QUERY PLAN SELECT run_id FROM run_heads "
                    f"{status}ORDER BY started_at DESC, run_id DESC LIMIT 50"
                )
            )
            assert "run_heads_" in plan and "TEMP B-TREE" not in plan, plan


def _index_columns(db: Path) -> dict[str, list[tuple[str, int]]]:
    """Each index of ``run_heads``: its columns and whether each is descending."""
    with sqlite3.connect(db) as conn:
        names = [
            n
            for (n,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'run_heads' "
                "AND sql IS NOT NULL"
            )
        ]
        return {
            n: [(r[2], r[3]) for r in conn.execute(f"PRAGMA index_xinfo('{n}')") if r[5]]
            for n in names
        }


def test_a_new_store_has_the_indexes_an_upgraded_one_gets_without_loading_sqlite_utils(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    from graphrun.eventstore.store import SqliteStore

    fresh = tmp_path / "new.db"
    # A new process: whether making a store loads sqlite-utils (and numpy with it).
    code = (
        "import sys; from graphrun.eventstore.store import SqliteStore; "
        f"SqliteStore({str(fresh)!r}, create=True).close(); "
        "print(sorted(m for m in ('sqlite_utils', 'numpy') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    upgraded = tmp_path / "five.db"
    with SqliteStore(upgraded, create=True):
        pass
    with sqlite3.connect(upgraded) as conn:
        conn.execute("DROP INDEX run_heads_started")
        conn.execute("DROP INDEX run_heads_status_started")
        conn.execute("PRAGMA user_version = 5")
    with SqliteStore(upgraded):
        pass
    made = _index_columns(fresh)
    assert made["run_heads_started"] == [("started_at", 1), ("run_id", 1)]
    assert made["run_heads_status_started"] == [("status", 0), ("started_at", 1), ("run_id", 1)]
    assert made == _index_columns(upgraded)
