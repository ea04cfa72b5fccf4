"""What SQLite reports (disk full, read-only, locked, not a database, cannot open)
reaches the user as one line naming the database and what to do: never exit 70, the
log left consistent. Real files; a real small tmpfs when the suite runs as root."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from graphrun.eventstore.errors import (
    StoreError,
    StoreFullError,
    StoreIOError,
    StoreLockedError,
    StoreReadOnlyError,
)
from graphrun.eventstore.store import SqliteStore
from tests.conformance.store_contract import started, step


def big_step(visit: int, size: int = 64 * 1024) -> list[Any]:
    events = step(f"n{visit}", visit, visit, None)
    noise = os.urandom(size // 2).hex()  # does not compress
    events[1] = msgspec.structs.replace(events[1], output={"text": noise})
    return events


def test_a_full_database_is_a_one_line_error_and_the_run_continues(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    store = SqliteStore(db)
    store.append("r1", [started(), *step("a", 1, 1, None)])
    (pages,) = store.conn.execute("PRAGMA page_count").fetchone()
    store.conn.execute(f"PRAGMA max_page_count = {pages + 2}")
    with pytest.raises(StoreFullError) as info:
        store.append("r1", big_step(2))
    message = str(info.value)
    assert str(db) in message and "full" in message and "\n" not in message
    store.conn.execute("PRAGMA max_page_count = 1000000")
    (more,) = store.append("r1", [step("b", 1, 2, None)[0]])
    assert more.seq == 5
    assert store.verify("r1") is None
    store.close()


def test_a_database_locked_past_the_wait_is_a_one_line_error(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    store = SqliteStore(db, busy_seconds=0.2)
    store.append("r1", [started()])
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreLockedError, match=r"stayed locked by another process for over"):
            store.append("r2", [started()])
    finally:
        other.execute("ROLLBACK")
        other.close()
    store.append("r2", [started()])
    assert {r.run_id for r in store.runs()} == {"r1", "r2"}
    store.close()


def test_cli_storage_errors_exit_2_with_one_line(graphrun: Any, tmp_path: Path) -> None:
    folder = tmp_path / "a-folder.db"
    folder.mkdir()
    result = graphrun("runs", GRAPHRUN_DB=str(folder))
    assert result.code == 2, result.stderr
    assert str(folder) in result.stderr and len(result.stderr.strip().splitlines()) == 1
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite at all " * 300)
    result = graphrun("runs", GRAPHRUN_DB=str(junk))
    assert result.code == 2 and "is not a usable graphrun database" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_disk_and_a_read_only_file_system(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "mnt", "512k") as mnt:
        db = mnt / "events.db"
        store = SqliteStore(db)
        store.append("r1", [started()])
        errors: list[StoreError] = []
        for visit in range(1, 40):
            try:
                store.append("r1", big_step(visit))
            except StoreError as exc:
                errors.append(exc)
                break
        assert errors, "the disk never filled"
        assert isinstance(errors[0], StoreFullError | StoreIOError), errors[0]
        assert str(db) in str(errors[0]) and "\n" not in str(errors[0])
        # What was committed is intact, and another process reads it.
        assert store.verify("r1") is None
        last = store.run("r1").last_seq
        store.close()
        again = SqliteStore(db)
        assert again.run("r1").last_seq == last and again.verify("r1") is None
        again.close()
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        with pytest.raises(StoreError) as info:
            ro = SqliteStore(db)
            ro.append("r1", [step("z", 1, 1, None)[0]])
        assert isinstance(info.value, StoreReadOnlyError | StoreIOError), info.value
        assert str(db) in str(info.value)
