"""A worker awaits every run's effects on one event loop of its own: its runs' LLM
calls share that loop's connections (a run does not open its own), and no run
starts a loop of its own."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import write_agent
from tests.support.fake_llm import FakeLlm, RecordedRequest, Reply, text
from tests.support.pg import PgServer, pg_server  # noqa: F401  (the session fixture)

pytest.importorskip("psycopg")

TWO_CALLS = """
    name: two-calls
    version: "1.0"
    model: openai:gpt-test
    start: one
    nodes:
      one:
        type: llm
        prompt: "{{initial_prompt}} one"
        next: two
      two:
        type: llm
        prompt: "{{initial_prompt}} two"
        state_updates:
          said: "{{output}}"
        next: done
      done:
        type: end
        output: "{{said}}"
"""


@pytest.fixture
def store(pg_server: PgServer) -> Iterator[Any]:  # noqa: F811
    from graphrun.eventstore.postgres import PostgresStore

    opened = PostgresStore(pg_server.new_schema(), max_connections=4)
    yield opened
    opened.close()


def test_a_workers_runs_share_its_loop_and_connections(
    store: Any, fake_llm: FakeLlm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from graphrun.runtime.agents import load_agent
    from graphrun.runtime.engine.workers import Worker, submit_run

    monkeypatch.setenv("OPENAI_BASE_URL", fake_llm.url_openai)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    threads: list[set[str]] = []

    def reply(request: RecordedRequest) -> Reply:
        threads.append({t.name for t in threading.enumerate()})
        return text("said " + request.body["messages"][-1]["content"])

    fake_llm.default = reply
    loaded = load_agent(write_agent(tmp_path / "two", TWO_CALLS), config_dir=None)
    runs = [
        submit_run(
            store,
            loaded,
            prompt=f"job{i}",
            overrides={},
            as_user="tester",
            agents_dir=None,
            config_dir=None,
        )
        for i in range(3)
    ]
    stats = Worker(store, concurrency=1, once=True, say=lambda line: None).run()
    assert stats.completed == 3, [store.read(r)[-1] for r in runs]
    for run_id in runs:
        assert type(store.read(run_id)[-1]).__name__ == "RunCompleted"
    assert len(fake_llm.requests) == 6
    # Every call of the three runs went over the one connection the worker keeps.
    assert len({r.peer for r in fake_llm.requests}) == 1
    # ... awaited on the worker's loop: no run started a loop of its own.
    assert all("graphrun-worker-effects" in names for names in threads)
    assert not any(name.startswith("graphrun-loop-") for names in threads for name in names)
    # The worker stopped its loop (and closed its connections) when it stopped.
    assert "graphrun-worker-effects" not in {t.name for t in threading.enumerate()}
