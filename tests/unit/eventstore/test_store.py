"""The SQLite and in-memory stores against the store contract, plus SQLite specifics."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from graphrun.eventstore.errors import CorruptStoreError, StoreError
from graphrun.eventstore.ids import Clock
from graphrun.eventstore.memory import MemoryBackend, MemoryStore
from graphrun.eventstore.store import SqliteStore
from tests.conformance.store_contract import StoreContract, started, step


class TestSqliteStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _db(self, tmp_path: Path) -> Any:
        self.db = tmp_path / "events.db"
        self.opened: list[SqliteStore] = []
        yield
        for store in self.opened:
            store.close()

    def open_store(self, clock: Clock | None = None) -> SqliteStore:
        store = SqliteStore(self.db, clock=clock)
        self.opened.append(store)
        return store

    def tamper(self, store: Any, run_id: str, seq: int, body: bytes) -> None:
        with sqlite3.connect(self.db) as conn:
            conn.execute(
                "UPDATE events SET body = ? WHERE run_id = ? AND seq = ?",
                (body.decode(), run_id, seq),
            )

    def set_lease_pid(self, store: Any, run_id: str, pid: int) -> None:
        with sqlite3.connect(self.db) as conn:
            conn.execute("UPDATE leases SET pid = ? WHERE run_id = ?", (pid, run_id))

    # -- SQLite only --------------------------------------------------------------

    def test_survives_reopening(self) -> None:
        store = self.open_store()
        written = store.append("r1", [started(), *step("a", 1, 1, None)])
        store.close()
        again = self.open_store()
        assert again.read("r1") == written
        assert again.verify("r1") is None
        (more,) = again.append("r1", [step("b", 1, 2, None)[0]])
        assert more.seq == 5

    def test_wal_mode(self) -> None:
        store = self.open_store()
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    def test_unknown_durability(self) -> None:
        with pytest.raises(StoreError, match="unknown durability 'fast'"):
            SqliteStore(self.db, durability="fast")

    def test_missing_db_without_create(self) -> None:
        with pytest.raises(StoreError, match="no event database at"):
            SqliteStore(self.db, create=False)
        assert not self.db.exists()

    @pytest.mark.parametrize("kind", ["random", "foreign", "newer"])
    def test_bad_files_are_refused_and_left_alone(self, kind: str) -> None:
        if kind == "random":
            self.db.write_bytes(bytes(range(256)) * 16)
        elif kind == "foreign":
            with sqlite3.connect(self.db) as conn:
                conn.execute("CREATE TABLE notes (x TEXT)")
                conn.execute("INSERT INTO notes VALUES ('keep me')")
            conn.close()
        else:
            self.open_store().close()
            with sqlite3.connect(self.db) as conn:
                conn.execute("PRAGMA user_version = 999")
            conn.close()
        before = hashlib.sha256(self.db.read_bytes()).hexdigest()
        with pytest.raises(CorruptStoreError) as info:
            SqliteStore(self.db)
        message = str(info.value)
        assert str(self.db) in message
        expected = {
            "random": "is not a usable graphrun database",
            "foreign": "is an SQLite database of something else (tables: notes)",
            "newer": "was written by a newer graphrun (schema 999",
        }[kind]
        assert expected in message
        assert hashlib.sha256(self.db.read_bytes()).hexdigest() == before


class TestMemoryStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _backend(self) -> None:
        self.backend = MemoryBackend()

    def open_store(self, clock: Clock | None = None) -> MemoryStore:
        return MemoryStore(self.backend, clock=clock)

    def tamper(self, store: Any, run_id: str, seq: int, body: bytes) -> None:
        store.tamper(run_id, seq, body)

    def set_lease_pid(self, store: Any, run_id: str, pid: int) -> None:
        from graphrun.eventstore.store import Lease

        lease = self.backend.leases[run_id]
        self.backend.leases[run_id] = Lease(run_id, lease.owner, pid, lease.host, lease.expires_at)
