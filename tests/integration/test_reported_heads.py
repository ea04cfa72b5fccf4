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


def test_a_complete_checkpoint_marks_the_heads_before_it_as_safe(tmp_path: Path) -> None:
    # Only what is still in the WAL can be lost: a complete checkpoint lets the
    # store mark the heads before it, and runs/show check only those after.
    from graphrun.eventstore import reported

    record = reported.ReportedHeads(tmp_path / "events.db")
    due = [record.record(f"r{i:04d}", 3, "h" * 64) for i in range(300)]
    line = len("r0000 3 " + "h" * 64 + "\n")
    assert sum(due) == 300 * line // reported.MARK_BYTES  # one try per 8 KB of record
    assert len(record.unchecked()) == 300  # no mark yet: every head is checked
    covered = record.size()
    assert covered == 300 * line
    for i in range(300, 305):
        record.record(f"r{i:04d}", 3, "h" * 64)
    record.mark(covered)
    record.record("r0000", 9, "g" * 64)
    assert sorted(record.unchecked()) == ["r0000"] + [f"r{i:04d}" for i in range(300, 305)]
    assert record.unchecked()["r0000"] == (9, "g" * 64)
    assert len(record.heads()) == 305 and record.heads()["r0000"] == (9, "g" * 64)
    # Compacted, the record keeps every head and what the mark covered.
    record._compact()
    assert len(record.heads()) == 305 and record.heads()["r0000"] == (9, "g" * 64)
    assert sorted(record.unchecked()) == ["r0000"] + [f"r{i:04d}" for i in range(300, 305)]
    # A mark that claims past itself, or a damaged one, covers no more than it can.
    record.path.write_bytes(b"a 1 x\n~ 9999\nb 2 y\n~ 1x\n")
    assert sorted(record.unchecked()) == ["b"]
    record.path.write_bytes(b"a 1 x\n~ 1x\nb 2 y\n")
    assert sorted(record.unchecked()) == ["a", "b"]


def test_the_tail_is_read_backwards_to_the_last_mark(tmp_path: Path) -> None:
    from graphrun.eventstore import reported

    record = reported.ReportedHeads(tmp_path / "events.db")
    body = b"".join(f"r{i:06d} 1 {'h' * 64}\n".encode() for i in range(20_000))  # ~1.5 MB
    tail = b"".join(f"t{i:03d} 2 {'g' * 64}\n".encode() for i in range(700))  # ~50 KB
    record.path.write_bytes(body + reported.MARK + f"{len(body)}\n".encode() + tail)
    reads: list[int] = []
    real_open = open

    class Counting:
        def __init__(self, fh: Any) -> None:
            self.fh = fh

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *exc: object) -> None:
            self.fh.close()

        def seek(self, *args: int) -> int:
            return self.fh.seek(*args)  # type: ignore[no-any-return]

        def read(self, n: int = -1) -> bytes:
            data = self.fh.read(n)
            reads.append(len(data))
            return data  # type: ignore[no-any-return]

    import builtins

    try:
        builtins.open = lambda *a, **k: Counting(real_open(*a, **k))  # type: ignore[assignment]
        heads = record.unchecked()
    finally:
        builtins.open = real_open
    assert sorted(heads) == [f"t{i:03d}" for i in range(700)]
    assert sum(reads) < 4 * len(tail)  # the tail, a few times over: not the 1.5 MB before it


def test_the_store_marks_after_a_complete_checkpoint_only(graphrun: Any, agent: Any) -> None:
    from graphrun.eventstore import open_store, reported

    root = agent(LOOP, {"scripts/step.py": STEP})
    assert graphrun("run", str(root)).code == 0
    store = open_store(graphrun.db)
    try:
        record = store.reported
        assert reported.MARK not in record.path.read_bytes()
        reader = sqlite3.connect(graphrun.db)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM events").fetchone()
        try:
            assert graphrun("run", str(root)).code == 0  # committed after the reader's snapshot
            assert store.checkpoint_heads() is False  # the reader holds it back: no mark
            assert reported.MARK not in record.path.read_bytes()
        finally:
            reader.close()
        assert store.checkpoint_heads() is True
        assert record.unchecked() == {}
        assert len(record.heads()) == 2
        assert store.lost_heads() == {}
    finally:
        store.close()


def test_ending_runs_mark_the_record_as_it_grows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Runs that end one after another: each time the record grows past a multiple
    # of MARK_BYTES the store checkpoints and marks, so the heads left to check stay
    # a few, whatever the number of runs; a run cut back after its mark is still named.
    from graphrun.eventstore import reported
    from graphrun.eventstore.events import RunCompleted
    from graphrun.eventstore.store import SqliteStore
    from tests.conformance.store_contract import started, step

    monkeypatch.setattr(reported, "MARK_BYTES", 1024)
    db = tmp_path / "events.db"
    with SqliteStore(db) as store:
        for i in range(120):
            store.append(f"run{i:03d}", [started(), *step("a", 1, 1, None)])
            store.append(f"run{i:03d}", [RunCompleted(node_id="a", output="done")])
        data = store.reported.path.read_bytes()
        assert data.count(b"\n~ ") >= 8  # ~10 KB of heads: a mark per KB
        unchecked = store.reported.unchecked()
        assert 0 < len(unchecked) <= 1024 // 70 + 1  # one KB of lines at most
        assert len(store.reported.heads()) == 120
        assert store.lost_heads() == {}
        last = max(unchecked)
    with sqlite3.connect(db) as conn:  # the newest run loses its end
        conn.execute(
            "DELETE FROM events WHERE id = (SELECT max(id) FROM events)",
        )
    with SqliteStore(db) as store:
        assert list(store.lost_heads()) == [last]
        assert store.lost_head(last) is not None and store.lost_head("run000") is None
