"""The SQLite and in-memory stores against the store contract, plus SQLite specifics."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest

from graphrun.eventstore import codec
from graphrun.eventstore.errors import CorruptStoreError, StoreError
from graphrun.eventstore.events import HumanInputReceived
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
                "UPDATE events SET body = ? "
                "WHERE id = (SELECT id FROM run_events WHERE run_id = ? AND seq = ?)",
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

    def big_step(self, node: str, visit: int) -> list[Any]:
        """A step whose script printed ~3 KB of repetitive (compressible) text."""
        events = step(node, visit, visit, None)
        events[1] = msgspec.structs.replace(events[1], output={"text": "lorem ipsum " * 250})
        return events

    def test_rows_hold_bodies_without_the_envelope_large_ones_compressed(self) -> None:
        store = self.open_store()
        written = store.append("r1", [started(), *self.big_step("a", 1)])
        rows = store.conn.execute(
            "SELECT seq, type, body, hash FROM run_events WHERE run_id = 'r1' ORDER BY seq"
        ).fetchall()
        assert [seq for seq, *_ in rows] == [1, 2, 3, 4]
        kinds = {kind: body for _seq, kind, body, _hash in rows}
        assert '"run_id":"r1"' in kinds["RunStarted"]  # kept whole: the log names its run
        assert '"run_id"' not in kinds["NodeEntered"] and '"seq"' not in kinds["NodeEntered"]
        assert isinstance(kinds["ScriptFinished"], bytes)  # compressed
        assert len(kinds["ScriptFinished"]) < 300
        assert all(isinstance(h, bytes) and len(h) == 32 for *_, h in rows)
        assert store.read("r1") == written
        # The chain is over the whole canonical event, however it is stored.
        prev = codec.GENESIS
        for event in written:
            prev = codec.chain_hash(prev, codec.encode(event))
        assert store.run("r1").last_hash == prev
        assert store.verify("r1") is None

    def test_human_decisions_stay_plain_json_for_sql(self) -> None:
        store = self.open_store()
        store.append("r1", [started()])
        long_answer = "yes, because " * 100
        store.append(
            "r1",
            [
                HumanInputReceived(
                    node_id="ok", visit=1, question="ship?", answer=long_answer, by="ann"
                )
            ],
        )
        (by, answer) = store.conn.execute(
            "SELECT json_extract(body, '$.by'), json_extract(body, '$.answer') "
            "FROM events WHERE type = 'HumanInputReceived'"
        ).fetchone()
        assert (by, answer) == ("ann", long_answer)

    def test_a_damaged_compressed_body_names_its_seq(self) -> None:
        store = self.open_store()
        store.append("r1", [started(), *self.big_step("a", 1), *self.big_step("b", 2)])
        with sqlite3.connect(self.db) as conn:
            (body,) = conn.execute(
                "SELECT body FROM run_events WHERE run_id = 'r1' AND seq = 6"
            ).fetchone()
            damaged = body[:40] + bytes([body[40] ^ 0xFF]) + body[41:]
            conn.execute(
                "UPDATE events SET body = ? "
                "WHERE id = (SELECT id FROM run_events WHERE run_id = 'r1' AND seq = 6)",
                (damaged,),
            )
        conn.close()
        problem = self.open_store().verify("r1")
        assert problem is not None and problem.seq == 6

    def test_runs_rebuild_from_events_alone(self) -> None:
        store = self.open_store()
        store.append("r1", [started(), *step("a", 1, 1, None)])
        store.append("r2", [started("h"), *self.big_step("b", 1)])
        before = {r.run_id: r for r in store.runs()}
        store.conn.execute("DELETE FROM runs")
        assert store.rebuild_runs() == 2
        again = self.open_store()
        assert {r.run_id: r for r in again.runs()} == before
        assert again.read("r2")[-1].run_id == "r2"
        # Numbers survive the rebuild: a new run does not reuse one.
        again.append("r3", [started()])
        numbers = [n for (n,) in again.conn.execute("SELECT run_no FROM runs ORDER BY run_no")]
        assert numbers == [1, 2, 3]

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
