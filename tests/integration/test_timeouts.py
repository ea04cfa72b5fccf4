"""Timeouts kill for real: the run's ``settings.timeout`` and a script node's ``timeout``.

Each script writes its own pid and the pid of a child it started; after the timeout
both processes must be gone (killed as a process group), not left running.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from graphrun.eventstore.events import NodeCompleted, NodeEntered, ScriptFinished, TimeoutFired
from graphrun.eventstore.fold import apply, fold
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine.decider import Perform, decide
from graphrun.runtime.engine.driver import Driver, RunOptions, drive, graph_of, start_run
from graphrun.runtime.graph.loader import load_graph

SLEEPER = {
    "scripts/sleep.sh": """
        sleep 10 &
        echo $! > child.pid
        echo $$ > self.pid
        wait
        echo '{"late": true}'
    """
}


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie waiting for its reaper counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, within: float = 3.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.02)
    return False


def pids(root: Path) -> tuple[int, int]:
    return int((root / "self.pid").read_text()), int((root / "child.pid").read_text())


def test_run_timeout_fails_the_run_fast_and_kills_the_script(graphrun: Any, agent: Any) -> None:
    root = agent(
        """
        name: slow
        version: "1.0"
        start: s
        settings:
          timeout: 1
        nodes:
          s: {type: script, script: scripts/sleep.sh, next: done}
          done: {type: end, output: "finished"}
        """,
        SLEEPER,
    )
    started = time.monotonic()
    result = graphrun("run", str(root))
    elapsed = time.monotonic() - started
    assert result.code == 1, result.stderr
    assert elapsed < 5
    assert "Traceback" not in result.stderr
    assert "run timed out after 1s (settings.timeout) in node 's'" in result.stderr
    assert "▸ timeout fired after 1s" in result.stderr
    script_pid, child_pid = pids(root)
    assert wait_gone(script_pid) and wait_gone(child_pid)
    events = graphrun("events", graphrun.last_run(), "--json").json_lines()
    types = [e["type"] for e in events]  # type: ignore[index]
    # The policy fires once, and nothing follows the run's end.
    assert types == ["RunStarted", "NodeEntered", "ScriptFinished", "TimeoutFired", "RunFailed"]
    fired = events[-2]
    assert (fired["scope"], fired["timeout_s"], fired["node_id"]) == ("run", 1.0, "s")  # type: ignore[index]


@pytest.mark.parametrize(
    ("routes", "status", "output"),
    [
        ("fallback: late\n            next: done", "completed", "late: script timed out after 1s"),
        ("next: done", "completed_with_errors", "done"),
        ("", "failed", None),
    ],
)
def test_node_timeout_kills_the_group_and_routes_tolerant_fail(
    tmp_path: Path, agent: Any, routes: str, status: str, output: str | None
) -> None:
    root = agent(
        f"""
        name: node-timeout
        version: "1.0"
        start: s
        nodes:
          s:
            type: script
            script: scripts/sleep.sh
            timeout: 1
            {routes}
          late: {{type: end, output: "late: {{{{_error.message}}}}"}}
          done: {{type: end, output: "done"}}
        """,
        SLEEPER,
    )
    store = SqliteStore(tmp_path / "events.db")
    started = time.monotonic()
    run_id = start_run(store, load_graph(root))
    outcome = drive(Driver(store, run_id, RunOptions()))
    assert time.monotonic() - started < 5
    assert (outcome.status, outcome.output) == (status, output)
    if status == "failed":
        assert outcome.error == "node 's': script timed out after 1s"
    events = store.read(run_id)
    (finished,) = [e for e in events if isinstance(e, ScriptFinished)]
    assert finished.timed_out and finished.exit_code is None
    assert not any(isinstance(e, TimeoutFired) for e in events)
    if status == "completed":
        (completed,) = [e for e in events if isinstance(e, NodeCompleted) and e.node_id == "s"]
        assert completed.failed
    script_pid, child_pid = pids(root)
    assert wait_gone(script_pid) and wait_gone(child_pid)
    store.close()


def test_script_timeout_defaults_to_30_seconds(tmp_path: Path, agent: Any) -> None:
    root = agent(
        """
        name: d
        version: "1.0"
        start: s
        nodes:
          s: {type: script, script: scripts/sleep.sh, next: done}
          t: {type: script, script: scripts/sleep.sh, timeout: 2.5, next: done}
          done: {type: end}
        """,
        SLEEPER,
    )
    store = SqliteStore(tmp_path / "events.db")
    run_id = start_run(store, load_graph(root))
    state = fold(store.read(run_id))
    graph = graph_of(state).graph
    entered = apply(state, NodeEntered(seq=2, node_id="s", node_type="script", visit=1))
    step = decide(graph, entered)
    assert isinstance(step, Perform) and step.task.timeout == 30.0
    entered = apply(state, NodeEntered(seq=2, node_id="t", node_type="script", visit=1))
    step = decide(graph, entered)
    assert isinstance(step, Perform) and step.task.timeout == 2.5
    store.close()
