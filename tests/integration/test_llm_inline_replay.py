"""Where an llm node's effect runs: replayed calls without tools need no actor thread."""

from __future__ import annotations

import threading
from typing import Any

from graphrun.eventstore.events import LlmCalled
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine.driver import Driver, RunOptions, drive, start_run
from graphrun.runtime.graph.loader import load_graph
from tests.support.fake_llm import text, tool_calls

GRAPH = """
name: where
version: "1.0"
model: openai:gpt-test
start: first
nodes:
  first:
    type: llm
    prompt: "one"
    next: second
  second:
    type: llm
    prompt: "two"
    tools: [shout]
    next: done
  done:
    type: end
    output: "{{initial_prompt}}"
"""

TOOLS_PY = '''
def shout(text: str) -> str:
    """Shout.

    Args:
        text: What to shout.
    """
    return text.upper()
'''


def _run(store: SqliteStore, root: Any, replay: list[Any] | None) -> tuple[str, dict[str, str]]:
    """Drive the graph in this process; returns the run id and, per node, the name
    of the thread that recorded its LLM calls."""
    threads: dict[str, str] = {}
    run_id = start_run(store, load_graph(root))
    driver = Driver(store, run_id, RunOptions(llm_replay=replay))
    record = driver.record_effects

    def spy(events: Any, branch: str = "") -> None:
        for event in events:
            if isinstance(event, LlmCalled):
                threads[event.node_id] = threading.current_thread().name
        record(events, branch)

    driver.record_effects = spy  # type: ignore[method-assign]
    outcome = drive(driver)
    assert outcome.status == "completed", outcome.error
    return run_id, threads


def test_replayed_calls_without_tools_are_served_on_the_supervisor_thread(
    tmp_path, agent, fake_llm, monkeypatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", fake_llm.url_openai)
    root = agent(GRAPH, {"tools.py": TOOLS_PY})
    fake_llm.script(text("first"), tool_calls(("shout", {"text": "hi"})), text("second"))
    store = SqliteStore(tmp_path / "events.db")
    try:
        run_id, live = _run(store, root, None)
        recorded = [e for e in store.read(run_id) if isinstance(e, LlmCalled)]
        fake_llm.stop()
        _, replayed = _run(store, root, recorded)
    finally:
        store.close()
    supervisor = "RunSupervisor"
    # Live, every call goes through the llm actor's own thread.
    assert not live["first"].startswith(supervisor)
    assert not live["second"].startswith(supervisor)
    # Replayed: a node with no tools does no I/O, so no hand-off; one with tools
    # still runs them (real processes) on the actor's thread.
    assert replayed["first"].startswith(supervisor)
    assert not replayed["second"].startswith(supervisor)
