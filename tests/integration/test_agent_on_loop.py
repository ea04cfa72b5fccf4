"""An agent node awaits its child run on the run's loop: while the child runs, no
thread of the parent waits for it (the child is driven by a supervisor of its own)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine.driver import Driver, RunOptions, drive, start_run
from graphrun.runtime.graph.loader import load_graph
from tests.conftest import write_agent

BOSS = """
name: boss
version: "1.0"
start: delegate
nodes:
  delegate:
    type: agent
    agent: waiter
    prompt: "wait for {{initial_prompt}}"
    state_updates: {answer: "{{output}}"}
    next: done
  done: {type: end, output: "boss got {{answer}}"}
"""
WAITER = """
name: waiter
version: "1.0"
start: hold
nodes:
  hold: {type: script, script: scripts/hold.sh, timeout: 60, next: done}
  done: {type: end, output: "{{held}}"}
"""
# Says it runs, then waits (bounded) for the test's go-ahead.
HOLD_SH = """\
touch "$MARK_DIR/running"
for _ in $(seq 200); do [ -e "$MARK_DIR/go" ] && break; sleep 0.05; done
echo '{"held": "released"}'
"""


def _waiting_for_the_child() -> list[str]:
    """The threads whose stack is an agent node waiting for its child run."""
    waiting = []
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        stack: list[str] = []
        walk: Any = frame
        while walk is not None:
            stack.append(walk.f_code.co_qualname)
            walk = walk.f_back
        if "AgentActor.perform" in stack or "_ChildDriving.drive" in stack:
            waiting.append(f"{names.get(ident, ident)}: {' < '.join(stack[:6])}")
    return waiting


def test_no_thread_waits_for_an_agent_nodes_child_run(tmp_path: Path, monkeypatch) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("MARK_DIR", str(marks))
    agents = tmp_path / "agents"
    write_agent(agents / "waiter", WAITER, {"scripts/hold.sh": HOLD_SH})
    boss = write_agent(tmp_path / "boss", BOSS)
    store = SqliteStore(tmp_path / "graphrun.db")
    try:
        run_id = start_run(store, load_graph(boss), prompt="the signal")
        ended: dict[str, Any] = {}
        driving = threading.Thread(
            target=lambda: ended.update(
                outcome=drive(Driver(store, run_id, RunOptions(agents_dir=agents)))
            )
        )
        driving.start()
        deadline = time.monotonic() + 30
        while not (marks / "running").exists():
            assert time.monotonic() < deadline and driving.is_alive(), ended
            time.sleep(0.02)
        # The child's script runs: its parent's agent node is in flight.
        waiting = _waiting_for_the_child()
        (marks / "go").touch()
        driving.join(30)
    finally:
        store.close()
    assert waiting == [], waiting
    outcome = ended["outcome"]
    assert (outcome.status, outcome.output) == ("completed", "boss got released")
