"""A run whose log went backwards is named: after a crash, a damaged ``-wal`` file
makes SQLite drop committed transactions silently, so graphrun keeps each run's
last reported head (seq and hash, appended and fsynced when a run ends or waits)
outside the database, and ``runs``, ``show``, ``resume`` and ``audit --verify``
compare the log with it."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

LOOP = """\
name: loop
version: "1.0"
start: step
initial_state: {n: 0}
nodes:
  step:
    type: script
    script: scripts/step.py
  done:
    type: end
    output: "{{n}}"
"""

STEP = """\
import json, os
n = json.loads(os.environ["GRAPH_STATE"])["n"] + 1
print(json.dumps({"n": n, "_next": "done" if n == 6 else "step"}))
"""


def crashed_copy(graphrun: Any, agent: Any, tmp_path: Path, keep: float) -> tuple[Path, str, str]:
    """Run A (checkpointed into the main file), then run B while another connection
    keeps the WAL from being folded in; copy the files as a crash leaves them and
    cut the WAL copy to ``keep`` of its length (a torn or damaged WAL)."""
    root = agent(LOOP, {"scripts/step.py": STEP})
    assert graphrun("run", str(root)).code == 0
    first = graphrun.last_run()
    reader = sqlite3.connect(graphrun.db)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM events").fetchone()  # holds the WAL open
    try:
        assert graphrun("run", str(root)).code == 0
        second = graphrun.last_run()
        copy = tmp_path / "crashed" / "events.db"
        copy.parent.mkdir()
        for suffix in ("", "-wal", "-reported-heads"):
            shutil.copyfile(f"{graphrun.db}{suffix}", f"{copy}{suffix}")
    finally:
        reader.close()
    wal = Path(f"{copy}-wal")
    data = wal.read_bytes()
    wal.write_bytes(data[: max(32, int(len(data) * keep))])
    return copy, first, second


@pytest.mark.parametrize("keep", [0.5, 0.0])
def test_a_log_that_went_backwards_is_named(
    graphrun: Any, agent: Any, tmp_path: Path, keep: float
) -> None:
    copy, first, second = crashed_copy(graphrun, agent, tmp_path, keep)
    db = ["--db", str(copy)]
    res = graphrun("runs", *db)
    assert res.code == 0, res.stderr
    assert first in res.stdout
    warning = [line for line in res.stderr.splitlines() if second in line]
    assert len(warning) == 1, res.stderr
    assert "committed events were lost (a damaged -wal file after a crash?)" in warning[0]
    assert graphrun("runs", "--strict", *db).code == 2
    if keep == 0.0:  # the whole run is gone
        res = graphrun("show", second, *db)
        assert res.code == 2
        assert "although graphrun reported it at seq 22: committed events were lost" in res.stderr
        return
    res = graphrun("show", second, *db)
    assert res.code == 0
    assert f"warning: run {second}'s log ends at seq " in res.stderr
    assert "but seq 22 was reported: committed events were lost" in res.stderr
    res = graphrun("audit", second, "--verify", *db)
    assert res.code == 1
    assert f"BROKEN: run {second}: first bad seq " in res.stderr
    before = graphrun("events", second, "--json", *db).stdout
    res = graphrun("resume", second, *db)
    assert res.code == 2, res.stderr
    assert "committed events were lost" in res.stderr and "nothing was appended" in res.stderr
    assert graphrun("events", second, "--json", *db).stdout == before
    # The run the WAL did not hold is untouched.
    assert graphrun("audit", first, "--verify", *db).code == 0
    assert graphrun("show", first, *db).stderr == ""


def test_a_new_database_forgets_an_old_record(graphrun: Any, agent: Any) -> None:
    root = agent(LOOP, {"scripts/step.py": STEP})
    assert graphrun("run", str(root)).code == 0
    record = Path(f"{graphrun.db}-reported-heads")
    (row,) = graphrun("runs", "--json").json_lines()
    assert record.read_text().split() == [row["run_id"], "22", row["last_hash"]]  # type: ignore[index]
    for suffix in ("", "-wal", "-shm"):
        Path(f"{graphrun.db}{suffix}").unlink(missing_ok=True)
    assert graphrun("run", str(root)).code == 0
    res = graphrun("runs")
    assert res.code == 0 and res.stderr == ""
    assert len(record.read_text().splitlines()) == 1


def test_the_record_is_compacted_once_it_doubles_not_at_every_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store with more runs than fit under the limit once compacted is not
    # rewritten at every line (that made each run's end cost the whole record).
    from graphrun.eventstore import reported

    monkeypatch.setattr(reported, "COMPACT_BYTES", 1000)
    record = reported.ReportedHeads(tmp_path / "events.db")
    rewrites = 0
    real = record._compact

    def counted() -> int:
        nonlocal rewrites
        rewrites += 1
        return real()

    monkeypatch.setattr(record, "_compact", counted)
    line = len("r0000 1 " + "h" * 64 + "\n")
    for i in range(200):  # 200 runs: ~15 KB compacted, far past the 1,000-byte limit
        record.record(f"r{i:04d}", 1, "h" * 64)
    assert 1 <= rewrites <= 8  # doubling from 1 KB to ~15 KB: a handful, not ~185
    heads = record.heads()
    assert len(heads) == 200 and heads["r0199"] == (1, "h" * 64)
    for i in range(200):  # the same runs again, at their next head
        record.record(f"r{i:04d}", 2, "g" * 64)
    assert record.path.stat().st_size <= 2 * 200 * line + 1000
    assert all(seq == 2 for seq, _ in record.heads().values())
