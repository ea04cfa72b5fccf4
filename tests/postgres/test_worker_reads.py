"""A worker's claim reads the claimed run's log (in the claim's own statement); the
worker verifies and folds it once, then the driver continues it from there (no
second read, verification or fold)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import write_agent
from tests.integration.test_human_nodes import APPROVAL, DRAFT
from tests.support.pg import PgServer, pg_server  # noqa: F401  (the session fixture)

pytest.importorskip("psycopg")


@pytest.fixture
def store(pg_server: PgServer) -> Iterator[Any]:  # noqa: F811
    from graphrun.eventstore.postgres import PostgresStore

    opened = PostgresStore(pg_server.new_schema(), max_connections=4)
    yield opened
    opened.close()


def counting(monkeypatch: pytest.MonkeyPatch, store: Any) -> Counter[str]:
    """Count the store's log reads and every fold, from now on."""
    from graphrun.eventstore import fold as fold_module
    from graphrun.runtime.engine import driver, runs, workers

    calls: Counter[str] = Counter()

    def counted(name: str, real: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapper

    for name in ("read", "read_verified", "raw_rows"):
        monkeypatch.setattr(store, name, counted(name, getattr(store, name)))
    folded = counted("fold", fold_module.fold)
    for module in (fold_module, driver, runs, workers):
        monkeypatch.setattr(module, "fold", folded)
    return calls


def test_a_claimed_answered_run_is_read_once(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from graphrun.runtime.engine.answers import submit_answer
    from graphrun.runtime.engine.workers import drive_claimed, submit_run
    from graphrun.runtime.graph.loader import load_graph

    agent = write_agent(tmp_path / "gate", APPROVAL, DRAFT)
    (agent / "scripts" / "draft.sh").chmod(0o755)
    run_id = submit_run(
        store,
        load_graph(agent),
        prompt="",
        overrides={},
        as_user="ann",
        agents_dir=None,
        config_dir=tmp_path / "config",
    )
    claim = store.claim(seconds=30)
    assert claim is not None and claim["run_id"] == run_id
    assert [seq for seq, *_ in claim["log"]] == [1]  # the claim read the log: RunStarted
    calls = counting(monkeypatch, store)
    assert drive_claimed(store, claim, worker_name="w1").status == "waiting"
    store.finish_claim(run_id, "waiting")
    assert calls == {"fold": 1}

    submit_answer(store, run_id, "approve", kind="approval", as_user="ann", channel="approve")
    store.release_lease(run_id)
    claim = store.claim(seconds=30)
    assert claim is not None and claim["run_id"] == run_id
    assert len(claim["log"]) == len(store.read(run_id))  # the answer is in it
    calls.clear()
    outcome = drive_claimed(store, claim, worker_name="w1")
    assert (outcome.status, outcome.output) == ("completed", "shipped v2.1 (approve)")
    assert calls == {"fold": 1}


def test_a_claim_without_its_log_reads_it_once(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim that brings no log (a store that cannot read it with the claim) is
    read and verified by the worker, once."""
    from graphrun.runtime.engine.workers import drive_claimed, submit_run
    from graphrun.runtime.graph.loader import load_graph

    agent = write_agent(tmp_path / "gate", APPROVAL, DRAFT)
    (agent / "scripts" / "draft.sh").chmod(0o755)
    submit_run(
        store,
        load_graph(agent),
        prompt="",
        overrides={},
        as_user="ann",
        agents_dir=None,
        config_dir=tmp_path / "config",
    )
    claim = store.claim(seconds=30)
    assert claim is not None
    del claim["log"]
    calls = counting(monkeypatch, store)
    assert drive_claimed(store, claim, worker_name="w1").status == "waiting"
    # (PostgreSQL's read_verified reads its rows through raw_rows: one read.)
    assert calls == {"read_verified": 1, "raw_rows": 1, "fold": 1}


def test_a_claimed_log_that_does_not_verify_is_refused(
    store: Any,
    tmp_path: Path,
    pg_server: PgServer,  # noqa: F811
) -> None:
    """The log a claim brings is verified as a read one is: an edited event stops
    the worker before anything is appended."""
    from graphrun.eventstore.errors import BrokenLogError
    from graphrun.runtime.engine.workers import drive_claimed, submit_run
    from graphrun.runtime.graph.loader import load_graph

    agent = write_agent(tmp_path / "gate", APPROVAL, DRAFT)
    (agent / "scripts" / "draft.sh").chmod(0o755)
    run_id = submit_run(
        store,
        load_graph(agent),
        prompt="tampered",
        overrides={},
        as_user="ann",
        agents_dir=None,
        config_dir=tmp_path / "config",
    )
    with store.pool.connection() as conn:
        conn.execute(
            "UPDATE events SET body = replace(body, 'tampered', 'tempered') WHERE run_id = %s",
            (run_id,),
        )
    claim = store.claim(seconds=30)
    assert claim is not None and claim["run_id"] == run_id
    with pytest.raises(BrokenLogError, match="does not verify at seq 1"):
        drive_claimed(store, claim, worker_name="w1")
    assert len(store.read(run_id)) == 1
