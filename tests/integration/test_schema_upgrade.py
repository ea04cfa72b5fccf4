"""A database written by the first schema (events WITHOUT ROWID, user_version 1)
keeps working: it is migrated on open (through every later schema), and its runs
list, replay and verify."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

V1 = Path(__file__).resolve().parents[1] / "data" / "events-schema-v1.db"


def test_a_schema_v1_database_is_migrated_and_its_runs_replay(graphrun, tmp_path: Path) -> None:
    shutil.copy(V1, graphrun.db)
    with sqlite3.connect(graphrun.db) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    rows = graphrun("runs", "--json").json_lines()
    assert sorted(r["graph_name"] for r in rows) == ["file-triage", "release-checklist"]
    with sqlite3.connect(graphrun.db) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3
        ddl = db.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()[0]
        numbers = [n for (n,) in db.execute("SELECT run_no FROM runs ORDER BY run_no")]
    assert "WITHOUT ROWID" not in ddl
    assert "prev_hash" not in ddl and "run_id" not in ddl
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
