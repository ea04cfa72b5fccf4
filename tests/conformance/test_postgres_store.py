"""The store contract on a real PostgreSQL server (tests/support/pg.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from graphrun.eventstore.ids import Clock
from tests.conformance.store_contract import StoreContract, started, step
from tests.support.pg import PgServer, pg_server  # noqa: F401  (the session fixture)

psycopg = pytest.importorskip("psycopg")

ROOT = Path(__file__).resolve().parents[2]


class TestPostgresStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _db(self, pg_server: PgServer) -> Iterator[None]:  # noqa: F811
        self.url = pg_server.new_schema()
        self.opened: list[Any] = []
        yield
        for store in self.opened:
            store.close()

    def open_store(self, clock: Clock | None = None) -> Any:
        from graphrun.eventstore.postgres import PostgresStore

        store = PostgresStore(self.url, clock=clock, max_connections=4)
        self.opened.append(store)
        return store

    def _sql(self, sql: str, args: tuple[Any, ...]) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql, args)

    def tamper(self, store: Any, run_id: str, seq: int, body: bytes) -> None:
        self._sql(
            "UPDATE events SET body = %s WHERE run_id = %s AND seq = %s",
            (body.decode(), run_id, seq),
        )

    def set_lease_pid(self, store: Any, run_id: str, pid: int) -> None:
        self._sql("UPDATE leases SET pid = %s WHERE run_id = %s", (pid, run_id))

    # -- PostgreSQL only ------------------------------------------------------------

    def test_racing_appenders_in_separate_processes(self) -> None:
        """Four processes extend one run at once, each retrying on
        ConcurrentAppendError: every step lands exactly once, in one gapless,
        verifying chain."""
        store = self.open_store()
        store.append("race", [started()])
        script = textwrap.dedent(
            """
            import sys
            from graphrun.eventstore.errors import ConcurrentAppendError
            from graphrun.eventstore.postgres import PostgresStore
            from tests.conformance.store_contract import step
            url, name = sys.argv[1], sys.argv[2]
            store = PostgresStore(url, max_connections=1)
            conflicts = 0
            for i in range(25):
                while True:
                    try:
                        store.append("race", step(f"{name}{i}", 1, i, None))
                        break
                    except ConcurrentAppendError:
                        conflicts += 1
            print(conflicts)
            """
        )
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", script, self.url, name],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in "abcd"
        ]
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0] * 4, [o[1] for o in outs]
        events = store.read("race")
        assert [e.seq for e in events] == list(range(1, 1 + 1 + 4 * 25 * 3))
        entered = [e.node_id for e in events if type(e).__name__ == "NodeEntered"]
        assert sorted(entered) == sorted(f"{n}{i}" for n in "abcd" for i in range(25))
        # A step's three events stay together: no writer interleaved inside a batch.
        for at in range(1, len(events), 3):
            assert len({getattr(e, "node_id", None) for e in events[at : at + 3]}) == 1
        assert store.verify("race") is None
        assert store.run("race").last_seq == len(events)

    def test_bodies_are_json_that_sql_reads(self) -> None:
        store = self.open_store()
        store.append("r1", [started(), *step("a", 1, 7, None)])
        with psycopg.connect(self.url, autocommit=True) as conn:
            got = conn.execute(
                "SELECT data->'output'->>'n' FROM run_events "
                "WHERE run_id = 'r1' AND type = 'ScriptFinished'"
            ).fetchone()
            raw = conn.execute("SELECT body, hash FROM events WHERE seq = 1").fetchone()
        assert got == ("7",)
        assert raw[1].startswith("sha256:")
        assert raw[0].encode() == next(iter(store.raw_rows("r1")))[1]

    def test_unknown_optional_field_verifies_without_re_encoding(self) -> None:
        """A body written by a newer graphrun (an extra field) is hashed as stored."""
        from graphrun.eventstore import codec

        store = self.open_store()
        store.append("r1", [started(), *step("a", 1, 1, None)])
        rows = list(store.raw_rows("r1"))
        body = rows[-1][1].replace(b'{"', b'{"added_later":true,"', 1)
        digest = codec.chain_hash(rows[-1][2], body)
        self._sql(
            "UPDATE events SET body = %s, hash = %s WHERE run_id = 'r1' AND seq = %s",
            (body.decode(), digest, rows[-1][0]),
        )
        self._sql("UPDATE runs SET last_hash = %s WHERE run_id = 'r1'", (digest,))
        assert store.verify("r1") is None
        assert store.read("r1")[-1].seq == rows[-1][0]

    def test_first_use_by_many_processes_at_once_migrates_once(self) -> None:
        script = (
            "import sys; from graphrun.eventstore.postgres import PostgresStore; "
            "PostgresStore(sys.argv[1], max_connections=1).close()"
        )
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", script, self.url], cwd=ROOT, stderr=subprocess.PIPE
            )
            for _ in range(6)
        ]
        errs = [p.communicate(timeout=120)[1] for p in procs]
        assert [p.returncode for p in procs] == [0] * 6, errs
        store = self.open_store()
        assert store.runs() == []

    def test_a_database_that_is_not_graphruns_is_refused(self) -> None:
        from graphrun.eventstore.errors import CorruptStoreError

        self._sql("CREATE TABLE events (id integer)", ())
        with pytest.raises(CorruptStoreError, match="events table that graphrun did not make"):
            self.open_store()

    def test_require_intact_names_the_first_bad_seq(self) -> None:
        from graphrun.eventstore.errors import CorruptStoreError

        store = self.open_store()
        store.append("r1", [started(), *step("a", 1, 1, None)])
        store.require_intact("r1")
        self._sql("DELETE FROM events WHERE run_id = 'r1' AND seq = 3", ())
        with pytest.raises(CorruptStoreError, match="run r1 does not verify at seq 3"):
            store.require_intact("r1")

    def test_no_server_is_one_store_error(self) -> None:
        from graphrun.eventstore.errors import StoreError
        from graphrun.eventstore.postgres import PostgresStore

        with pytest.raises(StoreError, match="cannot open the PostgreSQL event store"):
            PostgresStore("postgresql://nobody:secret@127.0.0.1:1/none?connect_timeout=2")
