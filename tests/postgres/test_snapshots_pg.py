"""State snapshots on a real PostgreSQL server: kept when a run waits, used only when
the verified log confirms them, ignored otherwise; a schema-3 database gains the table."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_snapshots import (
    check_every_seq,
    loop_gate,
    no_full_fold,
    read,
)
from tests.support.pg import PgServer, pg_server  # noqa: F401  (the session fixture)

pytest.importorskip("psycopg")


@pytest.fixture
def url(pg_server: PgServer) -> str:  # noqa: F811
    return pg_server.new_schema()


@pytest.fixture
def store(url: str) -> Iterator[Any]:
    from graphrun.eventstore.postgres import PostgresStore

    opened = PostgresStore(url, max_connections=4)
    yield opened
    opened.close()


def waiting_run(store: Any, tmp_path: Path) -> str:
    from graphrun.runtime.engine.driver import Driver, RunOptions, drive, start_run
    from graphrun.runtime.graph.loader import load_graph

    run_id = start_run(store, load_graph(loop_gate(tmp_path)))
    outcome = drive(Driver(store, run_id, RunOptions(interactive=False)))
    assert outcome.status == "waiting", outcome.error
    return run_id


def test_a_waiting_run_keeps_a_snapshot_the_answer_continues_from(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from graphrun.eventstore.fold import fold
    from graphrun.runtime.engine.answers import answer_run
    from graphrun.runtime.engine.driver import Driver, RunOptions, drive
    from graphrun.runtime.engine.runs import load_run

    run_id = waiting_run(store, tmp_path)
    full = check_every_seq(store, run_id)
    row = store.snapshot(run_id)
    assert row is not None and row[0] == full.last_seq == store.run(run_id).last_seq
    calls = no_full_fold(monkeypatch)
    loaded = load_run(store, run_id)
    assert calls == [0] and loaded.state == full
    _received, answered = answer_run(
        store, run_id, "approve", kind="approval", as_user="ann", channel="approve", loaded=loaded
    )
    outcome = drive(
        Driver(store, run_id, RunOptions(interactive=False), resumed_by="ann", loaded=answered)
    )
    assert outcome.status == "completed", outcome.error
    assert outcome.output == "approve after 12"
    assert store.snapshot(run_id) is None  # dropped with the run's end
    assert store.verify(run_id) is None
    assert fold(store.read(run_id)).status == "completed"


def test_a_snapshot_of_another_log_or_without_its_table_is_ignored(
    store: Any, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    from graphrun.eventstore.fold import fold
    from graphrun.runtime.engine.runs import keep_snapshot, load_run

    run_id = waiting_run(store, tmp_path)
    events, _hashes = read(store, run_id)
    seq, _digest, body, check = store.snapshot(run_id)
    store.keep_snapshot(run_id, seq, "sha256:" + "3" * 64, body, check)
    calls = no_full_fold(monkeypatch)
    assert load_run(store, run_id).state == fold(events)
    assert calls == [len(events)]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE snapshots")
    calls.clear()
    assert load_run(store, run_id).state == fold(events)
    assert calls == [len(events)]
    assert not keep_snapshot(store, run_id, "waiting")


def test_a_schema_3_database_gains_the_table(url: str, tmp_path: Path) -> None:
    import psycopg

    from graphrun.eventstore.postgres import SCHEMA_VERSION, PostgresStore
    from graphrun.runtime.engine.runs import load_run

    with PostgresStore(url, max_connections=2) as first:
        run_id = waiting_run(first, tmp_path)
        before = load_run(first, run_id).state
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE snapshots")
        conn.execute("UPDATE graphrun_meta SET value = '3' WHERE key = 'schema_version'")
    with PostgresStore(url, max_connections=2) as again:
        assert again.snapshot(run_id) is None
        assert load_run(again, run_id).state == before
    with psycopg.connect(url, autocommit=True) as conn:
        (version,) = conn.execute(
            "SELECT value FROM graphrun_meta WHERE key = 'schema_version'"
        ).fetchone()
        assert int(version) == SCHEMA_VERSION == 4
        assert conn.execute("SELECT to_regclass('snapshots')").fetchone()[0] is not None


def test_a_workers_claim_of_an_answered_run_folds_from_its_snapshot(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from graphrun.runtime.engine.answers import submit_answer
    from graphrun.runtime.engine.workers import drive_claimed, submit_run
    from graphrun.runtime.graph.loader import load_graph

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
    assert claim is not None and claim["run_id"] == run_id
    assert drive_claimed(store, claim, worker_name="w1").status == "waiting"
    store.finish_claim(run_id, "waiting")
    head = store.run(run_id).last_seq
    assert store.snapshot(run_id)[0] == head  # kept by the worker's drive

    submit_answer(store, run_id, "approve", kind="approval", as_user="ann", channel="approve")
    store.release_lease(run_id)
    claim = store.claim(seconds=30)
    assert claim is not None and claim["run_id"] == run_id
    calls = no_full_fold(monkeypatch)
    outcome = drive_claimed(store, claim, worker_name="w1")
    assert (outcome.status, outcome.output) == ("completed", "approve after 12")
    assert calls == [1]  # the answer, the one event after the snapshot
    assert store.snapshot(run_id) is None
