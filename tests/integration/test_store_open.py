"""Opening a database: many processes at once on a new file, and a process killed
(SIGKILL) inside every step of creating or migrating the schema. Real processes,
real files."""

from __future__ import annotations

import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from graphrun.eventstore.migrations import STEPS

DATA = Path(__file__).resolve().parents[1] / "data"
SOURCES = {"new": None, "v1": DATA / "events-schema-v1.db", "v3": DATA / "events-schema-v3.db"}
VERSIONS = {"new": 0, "v1": 1, "v3": 3}

OPEN_AND_APPEND = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from graphrun.eventstore.store import SqliteStore
    from tests.conformance.store_contract import started, step

    db, go, n = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    (go.parent / f"ready{n}").touch()
    while not go.exists():
        time.sleep(0.001)
    store = SqliteStore(db)
    store.append(f"run{n}", [started(), *step("a", 1, 1, None)])
    assert store.verify(f"run{n}") is None
    store.close()
    """
)


@pytest.mark.parametrize("round_", range(2))
def test_sixteen_processes_open_a_new_database_at_once(tmp_path: Path, round_: int) -> None:
    db, go = tmp_path / "events.db", tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_AND_APPEND, str(db), str(go), str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(16)
    ]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready*"))) < 16 and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()  # every process is past its imports: they open the file together
    failures = []
    for proc in procs:
        _out, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            failures.append(err.strip().splitlines()[-1:])
    assert not failures
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 16
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


KILL_INSIDE_STEP = textwrap.dedent(
    """
    import os, signal, sys
    from graphrun.eventstore import migrations

    version, index = int(sys.argv[2]), int(sys.argv[3])
    steps = list(migrations.STEPS[version])
    real = steps[index]

    def killed(conn):
        real(conn)
        os.kill(os.getpid(), signal.SIGKILL)

    steps[index] = killed
    migrations.STEPS[version] = steps
    from graphrun.eventstore.store import SqliteStore

    SqliteStore(sys.argv[1])
    """
)


def _cases() -> list[tuple[str, int]]:
    return [(name, i) for name, v in VERSIONS.items() for i in range(len(STEPS[v]))]


@pytest.mark.parametrize(("source", "index"), _cases())
def test_a_process_killed_inside_a_migration_step_loses_nothing(
    graphrun, source: str, index: int
) -> None:
    original = SOURCES[source]
    if original is not None:
        shutil.copy(original, graphrun.db)
        with sqlite3.connect(original) as conn:
            expected = {r for (r,) in conn.execute("SELECT run_id FROM runs")}
    else:
        expected = set()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            KILL_INSIDE_STEP,
            str(graphrun.db),
            str(VERSIONS[source]),
            str(index),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    if original is not None:
        with sqlite3.connect(graphrun.db) as conn:  # rolled back: the file as it was
            assert conn.execute("PRAGMA user_version").fetchone()[0] == VERSIONS[source]
    listed = graphrun("runs", "--json")
    assert listed.code == 0, listed.stderr
    assert {r["run_id"] for r in listed.json_lines()} == expected
    for run_id in sorted(expected)[:3]:
        verified = graphrun("audit", run_id, "--verify")
        assert verified.code == 0, verified.stderr
