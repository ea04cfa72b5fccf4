"""What a worker asks PostgreSQL per run: the claim is one statement (however many
runs it takes, their logs included), the hand-back one, the driver's own lease and
first cancel look none, each step one; nothing is read twice.

Statements are counted on psycopg's cursors (each ``execute`` is a round trip; a
transaction block adds its ``BEGIN`` and ``COMMIT``), against a real server."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import write_agent
from tests.support.pg import PgServer, pg_server  # noqa: F401  (the session fixture)

pytest.importorskip("psycopg")

CHAIN = """
    name: chain
    version: "1.0"
    model: openai:gpt-test
    start: n0
    settings:
      validate_before_run: false
    nodes:
      n0:
        type: llm
        prompt: "step 0 {{initial_prompt}}"
        next: n1
      n1:
        type: llm
        prompt: "step 1 {{initial_prompt}}"
        next: n2
      n2:
        type: llm
        prompt: "step 2 {{initial_prompt}}"
        next: done
      done:
        type: end
        output: "ok"
"""


class Statements:
    """Every statement psycopg sends from now on, by its first words; those sent in
    a pipeline (one round trip for the lot) are counted as ``pipelined: ...``, and
    each pipeline as ``PIPELINE``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import psycopg

        self.seen: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._local = threading.local()
        for name in ("execute", "executemany"):
            real = getattr(psycopg.Cursor, name)
            monkeypatch.setattr(psycopg.Cursor, name, self._counted(real))
        real_transaction = psycopg.Connection.transaction
        real_pipeline = psycopg.Connection.pipeline

        @contextlib.contextmanager
        def transaction(conn: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            self._add("BEGIN")
            with real_transaction(conn, *args, **kwargs) as tx:
                yield tx
            self._add("COMMIT")

        @contextlib.contextmanager
        def pipeline(conn: Any) -> Iterator[Any]:
            if not getattr(self._local, "depth", 0):  # (psycopg nests its own)
                self._add("PIPELINE")
            self._local.depth = getattr(self._local, "depth", 0) + 1
            try:
                with real_pipeline(conn) as pipe:
                    yield pipe
            finally:
                self._local.depth -= 1

        monkeypatch.setattr(psycopg.Connection, "transaction", transaction)
        monkeypatch.setattr(psycopg.Connection, "pipeline", pipeline)

    def _counted(self, real: Any) -> Any:
        def execute(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            self._add(" ".join(str(query).split()[:3]))
            return real(cursor, query, *args, **kwargs)

        return execute

    def _add(self, what: str) -> None:
        if getattr(self._local, "depth", 0):
            what = f"pipelined: {what}"
        with self._lock:
            self.seen[what] += 1


@pytest.fixture
def agent(tmp_path: Path, fake_llm: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    from graphrun.runtime.agents import load_agent

    monkeypatch.setenv("OPENAI_BASE_URL", fake_llm.url_openai)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    return load_agent(write_agent(tmp_path / "chain", CHAIN), config_dir=None)


@pytest.fixture
def open_store(pg_server: PgServer) -> Iterator[Any]:  # noqa: F811
    from graphrun.eventstore.postgres import PostgresStore

    url = pg_server.new_schema()
    opened: list[Any] = []

    def make(durability: str = "full") -> Any:
        store = PostgresStore(url, durability=durability, max_connections=4)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def submit(store: Any, agent: Any, count: int) -> list[str]:
    from graphrun.runtime.engine.workers import submit_run

    return [
        submit_run(
            store,
            agent,
            prompt=f"r{i}",
            overrides={},
            as_user="ann",
            agents_dir=None,
            config_dir=None,
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_a_worker_run_costs_a_claim_a_read_a_statement_per_step_and_a_hand_back(
    open_store: Any, agent: Any, monkeypatch: pytest.MonkeyPatch, durability: str
) -> None:
    from graphrun.runtime.engine.workers import Worker

    store = open_store(durability)
    (run_id,) = submit(store, agent, 1)
    statements = Statements(monkeypatch)
    # (A long poll: an empty queue is looked at again only when a run ends.)
    worker = Worker(store, concurrency=1, once=True, poll=30, say=lambda _line: None)
    began = time.monotonic()
    stats = worker.run()
    took = time.monotonic() - began
    seen = dict(statements.seen)
    assert (stats.claimed, stats.completed) == (1, 1)
    steps = store.run(run_id).last_seq
    # Opening connections (the pool's, the one claims and locks are on).
    for opening in [k for k in seen if k.startswith("SET ") and not k.startswith("SET LOCAL")]:
        del seen[opening]
    # The claim (and the one ahead of the slot, which finds the queue empty), the
    # runs row the driver checks the log's head against, and the hand-back with
    # the next claim (which finds the queue empty): one statement.
    assert seen.pop("WITH alive AS") == 2
    assert seen.pop("SELECT run_id, graph_name,") == 1
    assert seen.pop("WITH queue AS") == 1
    # The driver looks for a cancel request every 0.25 s; its first look is
    # answered by what the claim read, when it comes within 0.2 s of the claim.
    assert seen.pop("SELECT requested_by, reason", 0) <= took / 0.2
    # At most a look for dead processes on this host (once a second).
    assert seen.pop("SELECT DISTINCT l.owner,", 0) <= 1
    # Each commit of the drive is one statement, at `full`; at `normal` the one
    # that ends the run is a transaction that waits for the flush.
    commits = seen.pop("WITH added AS", 0)
    if durability == "normal":
        assert seen.pop("BEGIN") == seen.pop("COMMIT") == 1
        assert seen.pop("SET LOCAL synchronous_commit") == 1
        assert seen.pop("SELECT 1 FROM") == 2  # its lease and its head, in the transaction
        assert seen.pop("INSERT INTO events") == seen.pop("INSERT INTO runs") == 1
        assert seen.pop("DELETE FROM snapshots") == 1  # an ended run keeps none
        commits += 1
    # One commit per llm step and one for the end (RunStarted was the submit's).
    assert 1 <= commits <= 4 < steps
    assert seen == {}, seen


def test_one_claim_takes_several_runs_with_their_logs(open_store: Any, agent: Any) -> None:
    a, b = open_store(), open_store()
    ids = submit(a, agent, 3)
    claims = a.claim_many(5, seconds=30)
    assert [c["run_id"] for c in claims] == ids  # oldest first, all of them
    for claim in claims:
        assert [seq for seq, *_ in claim["log"]] == [1]
        assert claim["attempts"] == 1 and not claim["taken_over"]
        assert a.queued(claim["run_id"])["state"] == "running"  # type: ignore[index]
        assert b.is_live(claim["run_id"])  # its lock held, its lease live
    assert b.claim_many(5, seconds=30) == []
    assert a.claim_many(5, seconds=30) == []  # not twice by its own worker either
    for run_id in ids:
        a.finish_claim(run_id, "queued")
    again = b.claim_many(2, seconds=30)
    assert [c["run_id"] for c in again] == ids[:2]
    assert all(c["attempts"] == 2 and not c["taken_over"] for c in again)


def test_the_lock_key_is_the_same_in_sql_and_python(open_store: Any) -> None:
    from graphrun.eventstore.postgres import _LOCK_KEY

    store = open_store()
    ids = ["01JABCDEF", "r1", "ünï-cödé", "x" * 40]
    with store.pool.connection() as conn:
        for run_id in ids:
            sql = "SELECT " + _LOCK_KEY.format(schema="current_schema()", run="%s")
            (key,) = conn.execute(sql, (run_id,)).fetchone()
            assert key == store._lock_key(run_id)
            assert 0 <= key < 1 << 63


def test_racing_batched_claims_take_each_run_once(open_store: Any, agent: Any) -> None:
    first = open_store()
    ids = submit(first, agent, 24)
    workers = [open_store() for _ in range(4)]
    taken: list[str] = []
    lock = threading.Lock()

    def work(store: Any) -> None:
        while claims := store.claim_many(3, seconds=30):
            with lock:
                taken.extend(c["run_id"] for c in claims)

    threads = [threading.Thread(target=work, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(taken) == sorted(ids)
    # Every lock taken is held by exactly one session, its claimer's.
    with first.pool.connection() as conn:
        (locks,) = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
            "AND ((classid::bigint << 32) | objid::bigint) IN (SELECT lock_key FROM leases)"
        ).fetchone()
    assert locks == len(ids)


def test_a_worker_fills_its_free_slots_from_one_claim(
    open_store: Any, agent: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four free slots and four queued runs: one claim takes them all, and every
    slot drives one."""
    from graphrun.runtime.engine.workers import Worker

    store = open_store()
    ids = submit(store, agent, 4)
    taken: list[tuple[int, int]] = []  # (runs asked for, runs taken) of each claim
    finish_claims = store.finish_claims

    def claimed(done: Any, **kwargs: Any) -> Any:
        claims = finish_claims(done, **kwargs)
        if kwargs.get("claim"):
            taken.append((kwargs["claim"], len(claims)))
        return claims

    monkeypatch.setattr(store, "finish_claims", claimed)
    worker = Worker(store, concurrency=4, once=True, poll=0.01, say=lambda _line: None)
    stats = worker.run()
    assert stats.completed == 4 and sorted(stats.runs) == sorted(ids)
    # The first claim asked for a run per slot and one ahead, and took all four;
    # every later look found the queue empty.
    assert taken[0] == (5, 4) and {n for _, n in taken[1:]} == {0}
    assert all(store.queued(r)["state"] == "done" for r in ids)  # type: ignore[index]
    assert stats.handed_back == 0  # every run handed back as done, none left over


def test_slots_drain_a_longer_queue_each_run_once(open_store: Any, agent: Any) -> None:
    """More runs than slots, two workers: each hand-back takes the next run; every
    run is driven once and handed back done."""
    from graphrun.runtime.engine.workers import Worker

    a, b = open_store(), open_store()
    ids = submit(a, agent, 12)
    workers = [
        Worker(store, concurrency=3, once=True, poll=0.01, say=lambda _line: None)
        for store in (a, b)
    ]
    threads = [threading.Thread(target=w.run) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    runs = [r for w in workers for r in w.stats.runs]
    assert sorted(runs) == sorted(ids)
    assert sum(w.stats.completed for w in workers) == 12
    assert all(w.stats.handed_back == 0 and w.failure is None for w in workers)
    assert a.queue_counts() == {"done": 12}
    with a.pool.connection() as conn:
        assert conn.execute("SELECT count(*) FROM leases").fetchone() == (0,)


def test_a_hand_back_takes_the_next_run_in_the_same_transaction(
    open_store: Any, agent: Any
) -> None:
    a, b = open_store(), open_store()
    first, second = submit(a, agent, 2)
    assert [c["run_id"] for c in a.claim_many(1, seconds=30)] == [first]
    claims = a.finish_claim(first, "done", claim=3, seconds=30)
    assert [c["run_id"] for c in claims] == [second]
    assert [seq for seq, *_ in claims[0]["log"]] == [1]
    assert a.queued(first)["state"] == "done"  # type: ignore[index]
    assert a.lease(first) is None and not b.is_live(first)
    assert a.queued(second)["state"] == "running" and b.is_live(second)  # type: ignore[index]
    # Its lock went with the hand-back; the new run's is held.
    with a.pool.connection() as conn:
        held = {
            key
            for (key,) in conn.execute(
                "SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks "
                "WHERE locktype = 'advisory' AND objsubid = 1"
            ).fetchall()
        }
    assert a._lock_key(second) in held and a._lock_key(first) not in held
    assert a.finish_claim(second, "done", claim=3, seconds=30) == []
    assert b.claim_many(3, seconds=30) == []


def test_a_claim_reads_the_head_of_a_long_queue_not_all_of_it(open_store: Any) -> None:
    """A claim walks the queue's (state, queued_at) index from its oldest run: with
    2,000 runs queued it reads a handful of queue rows, not 2,000 (the plan, as
    PostgreSQL ran it)."""
    import json

    import psycopg

    from graphrun.eventstore.postgres import _CLAIM

    store = open_store()
    with store.pool.connection() as conn:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO run_queue (run_id, state, settings, queued_at, updated_at) "
                "VALUES (%s, %s, '{}', %s, %s)",
                [(f"q{i:05d}", "queued", float(i), float(i)) for i in range(2000)],
            )
        conn.execute("ANALYZE run_queue")
    assert [c["run_id"] for c in store.claim_many(3, seconds=30)] == ["q00000", "q00001", "q00002"]
    args = {
        "schema": store._schema,
        "skip": ["q00000", "q00001", "q00002"],
        "now": 0.0,
        "dead": [],
        "n": 3,
        "owner": "explain",
        "pid": 1,
        "host": "nowhere",
        "until": 30.0,
        "started": 0.0,
    }
    with store.pool.connection() as conn, conn.transaction() as tx:
        (plan,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + _CLAIM, args).fetchone()
        conn.execute("SELECT pg_advisory_unlock_all()")
        raise psycopg.Rollback(tx)  # (nothing of the explained claim stays)
    read: list[int] = []

    def walk(node: dict[str, Any]) -> None:
        if node.get("Relation Name") == "run_queue" and "Scan" in node["Node Type"]:
            read.append(int(node["Actual Rows"]) * int(node.get("Actual Loops", 1)))
        for child in node.get("Plans", []):
            walk(child)

    walk((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"])
    assert read and sum(read) <= 10, read
    assert store.queue_counts() == {"queued": 1997, "running": 3}


def test_the_claim_statements_fit_psycopgs_statement_cache() -> None:
    """psycopg parses once (and prepares, after a few uses) only statements up to
    4,096 bytes: the claim's must fit, or every claim pays for both again."""
    from graphrun.eventstore.postgres import _CLAIM, _FINISH, _FINISH_AND_CLAIM

    assert max(len(_CLAIM), len(_FINISH), len(_FINISH_AND_CLAIM)) <= 4096


def test_several_runs_are_handed_back_in_one_statement(open_store: Any, agent: Any) -> None:
    a, b = open_store(), open_store()
    ids = submit(a, agent, 4)
    assert len(a.claim_many(4, seconds=30)) == 4
    states = ["done", "waiting", "queued", "stuck"]
    assert a.finish_claims(list(zip(ids, states, strict=True))) == []
    assert [a.queued(r)["state"] for r in ids] == states  # type: ignore[index]
    assert all(a.lease(r) is None and not b.is_live(r) for r in ids)
    with a.pool.connection() as conn:
        (locks,) = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"
        ).fetchone()
    assert locks == 0  # every run's lock went with its hand-back
    # The queued one is claimable again, by anyone.
    assert [c["run_id"] for c in b.claim_many(4, seconds=30)] == [ids[2]]


def test_a_stopped_worker_hands_back_the_run_it_claimed_ahead(
    open_store: Any, agent: Any, fake_llm: Any
) -> None:
    """One slot drives a run while the next one waits, claimed ahead; a stop lets
    the first finish and hands the second back to the queue, never started."""
    from graphrun.runtime.engine.workers import Worker
    from tests.support.fake_llm import text

    fake_llm.default = lambda request: text("ok", delay=0.3)
    store = open_store()
    ids = submit(store, agent, 3)
    worker = Worker(store, concurrency=1, poll=0.01, grace=30, say=lambda _line: None)
    thread = threading.Thread(target=worker.run)
    thread.start()
    deadline = time.monotonic() + 30
    while store.queue_counts().get("running", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.queue_counts().get("running") == 2  # the one driven, the one ahead
    worker.stop("test")
    thread.join(60)
    assert not thread.is_alive()
    assert worker.stats.runs == ids[:1] and worker.stats.completed == 1
    assert worker.stats.handed_back == 0
    assert [store.queued(r)["state"] for r in ids] == ["done", "queued", "queued"]  # type: ignore[index]
    assert store.queued(ids[1])["attempts"] == 0  # type: ignore[index]  # (never started)
    with store.pool.connection() as conn:
        assert conn.execute("SELECT count(*) FROM leases").fetchone() == (0,)


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_a_claimed_answered_run_folds_from_its_snapshot_and_ends_without_one(
    open_store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: str
) -> None:
    """The claim brings the run's snapshot with its log: the worker folds only what
    follows it; the run's end (one statement at `full`) drops the snapshot."""
    from graphrun.runtime.engine.answers import submit_answer
    from graphrun.runtime.engine.workers import drive_claimed, submit_run
    from graphrun.runtime.graph.loader import load_graph
    from tests.integration.test_snapshots import loop_gate, no_full_fold

    store = open_store(durability)
    run_id = submit_run(
        store,
        load_graph(loop_gate(tmp_path)),
        prompt="",
        overrides={},
        as_user="ann",
        agents_dir=None,
        config_dir=tmp_path / "config",
    )
    claim = store.claim(seconds=30)
    assert claim is not None and claim["snapshot"] is None
    assert drive_claimed(store, claim, worker_name="w1").status == "waiting"
    store.finish_claim(run_id, "waiting")
    head = store.run(run_id).last_seq
    submit_answer(store, run_id, "approve", kind="approval", as_user="ann", channel="approve")
    store.release_lease(run_id)
    claim = store.claim(seconds=30)
    assert claim is not None and claim["snapshot"][0] == head  # type: ignore[index]
    calls = no_full_fold(monkeypatch)
    outcome = drive_claimed(store, claim, worker_name="w1")
    assert (outcome.status, outcome.output) == ("completed", "approve after 12")
    assert calls == [1]  # the answer, the one event after the snapshot
    assert store.snapshot(run_id) is None
