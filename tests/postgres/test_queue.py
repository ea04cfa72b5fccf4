"""The run queue of the PostgreSQL store: claims, expiry, fencing, answers."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from graphrun.eventstore.errors import LeaseHeldError
from graphrun.eventstore.events import HumanInputReceived, HumanInputRequested, NodeEntered
from tests.conformance.store_contract import FakeClock, started, step
from tests.support.pg import PgServer, pg_server  # noqa: F401  (the session fixture)

pytest.importorskip("psycopg")


@pytest.fixture
def stores(pg_server: PgServer) -> Iterator[Any]:  # noqa: F811
    from graphrun.eventstore.postgres import PostgresStore

    url = pg_server.new_schema()
    opened: list[Any] = []

    def open_store(clock: Any = None) -> Any:
        store = PostgresStore(url, clock=clock, max_connections=4)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


def submit(store: Any, run_id: str, parent: str | None = None) -> None:
    store.queue_on_start(run_id, {"as_user": "ann"})
    store.append(run_id, [started(parent=parent)])


def test_a_claim_is_one_workers_until_its_lease_expires(stores: Any) -> None:
    clock = FakeClock()
    a, b = stores(clock), stores(clock)
    submit(a, "r1")
    claim = a.claim(seconds=30)
    assert claim is not None and claim["run_id"] == "r1" and claim["settings"] == {"as_user": "ann"}
    assert not claim["taken_over"]
    assert b.claim(seconds=30) is None
    assert a.claim(seconds=30) is None  # not twice by its own worker either
    clock.t += 25
    assert a.heartbeat(seconds=30) == []
    clock.t += 25
    assert b.claim(seconds=30) is None  # the heartbeat kept it
    clock.t += 31
    taken = b.claim(seconds=30)
    assert taken is not None and taken["taken_over"] and taken["attempts"] == 2
    # The stalled worker finds out at its next append; nothing of it is stored.
    with pytest.raises(LeaseHeldError, match="taken over by another worker"):
        a.append("r1", step("a", 1, 1, None))
    assert a.heartbeat(seconds=30) == ["r1"]
    # b took the run without its lock (a held it); a let go of it, b takes it now.
    assert b.heartbeat(seconds=30) == []
    assert b.is_live("r1")
    b.append("r1", step("a", 1, 1, None))
    assert [e.seq for e in b.read("r1")] == [1, 2, 3, 4]
    a.finish_claim("r1", "done")  # the old claim's hand-back changes nothing
    assert b.queued("r1")["state"] == "running"  # type: ignore[index]
    b.finish_claim("r1", "done")
    assert b.queued("r1")["state"] == "done"  # type: ignore[index]
    assert b.lease("r1") is None


def test_a_worker_whose_connection_goes_frees_its_runs_at_once(
    stores: Any,
    pg_server: PgServer,  # noqa: F811
) -> None:
    """A claim holds an advisory lock on a connection of its worker's own: when
    PostgreSQL sees that connection go (the worker died, on whatever host), the
    run is claimable at once, long before its lease expires."""
    clock = FakeClock()
    a, b, c = stores(clock), stores(clock), stores(clock)
    submit(a, "r1")
    submit(a, "r2")
    assert a.claim(seconds=30)["run_id"] == "r1"  # type: ignore[index]
    assert b.claim(seconds=30)["run_id"] == "r2"  # type: ignore[index]
    assert c.claim(seconds=30) is None
    assert c.is_live("r1") and c.is_live("r2")
    # PostgreSQL ends the session of a's locks, as it does when a's process dies.
    with a.pool.connection() as conn:
        backend = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid::bigint = "
            "(SELECT lock_key & 4294967295 FROM leases WHERE run_id = 'r1')"
        ).fetchone()[0]
    # (with a timeout, the call waits until the session has ended)
    pg_server.psql(f"SELECT pg_terminate_backend({int(backend)}, 10000)")
    clock.t += 1  # far from the lease's 30 s
    assert not c.is_live("r1") and c.is_live("r2")
    taken = c.claim(seconds=30)
    assert taken is not None and taken["run_id"] == "r1" and taken["taken_over"]
    assert c.claim(seconds=30) is None  # r2's worker lives
    # Were a still running, it could not write to r1 any more, and it learns so.
    with pytest.raises(LeaseHeldError, match="taken over by another worker"):
        a.append("r1", step("a", 1, 1, None))
    assert a.heartbeat(seconds=30) == ["r1"]
    assert b.heartbeat(seconds=30) == [] and c.heartbeat(seconds=30) == []
    c.append("r1", step("a", 1, 1, None))
    c.finish_claim("r1", "done")
    assert [e.seq for e in c.read("r1")] == [1, 2, 3, 4]
    assert c.queued("r1")["state"] == "done"  # type: ignore[index]


def test_racing_claims_take_each_run_once(stores: Any) -> None:
    first = stores()
    for i in range(30):
        submit(first, f"r{i:02d}")
    workers = [stores() for _ in range(5)]
    taken: list[str] = []
    lock = threading.Lock()

    def work(store: Any) -> None:
        while (claim := store.claim(seconds=30)) is not None:
            with lock:
                taken.append(claim["run_id"])

    threads = [threading.Thread(target=work, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(taken) == [f"r{i:02d}" for i in range(30)]
    assert Counter(taken).most_common(1)[0][1] == 1


def test_an_answer_queues_the_waiting_run_again(stores: Any) -> None:
    store = stores()
    submit(store, "p")
    assert store.claim(seconds=30)["run_id"] == "p"  # type: ignore[index]
    ask = [
        NodeEntered(node_id="ask", node_type="input", visit=1),
        HumanInputRequested(node_id="ask", visit=1, kind="input", question="?"),
    ]
    store.append("p", ask)
    store.finish_claim("p", "waiting")
    assert store.claim(seconds=30) is None
    store.append("p", [HumanInputReceived(node_id="ask", visit=1, answer="a", by="ann")])
    row = store.queued("p")
    assert (row["state"], row["resume_run"]) == ("queued", "p")  # type: ignore[index]
    assert store.claim(seconds=30)["run_id"] == "p"  # type: ignore[index]


def test_an_answer_to_a_child_run_queues_its_queued_ancestor(stores: Any) -> None:
    store = stores()
    submit(store, "root")
    store.claim(seconds=30)
    store.finish_claim("root", "waiting")
    store.append("mid", [started(parent="root")])
    store.append("leaf", [started(parent="mid")])
    store.append(
        "leaf",
        [
            NodeEntered(node_id="ask", node_type="input", visit=1),
            HumanInputRequested(node_id="ask", visit=1, kind="input", question="?"),
        ],
    )
    assert store.queued("leaf")["run_id"] == "root"  # type: ignore[index]
    store.append("leaf", [HumanInputReceived(node_id="ask", visit=1, answer="a", by="ann")])
    row = store.queued("root")
    assert (row["state"], row["resume_run"]) == ("queued", "leaf")  # type: ignore[index]


def test_a_run_answered_before_its_worker_let_go_is_not_left_waiting(stores: Any) -> None:
    store = stores()
    submit(store, "r1")
    store.claim(seconds=30)
    store.append(
        "r1",
        [
            NodeEntered(node_id="ask", node_type="input", visit=1),
            HumanInputRequested(node_id="ask", visit=1, kind="input", question="?"),
            HumanInputReceived(node_id="ask", visit=1, answer="a", by="ann"),
        ],
    )
    store.finish_claim("r1", "waiting")
    assert store.queued("r1")["state"] == "queued"  # type: ignore[index]
