"""Kill -9 in the middle of a run, resume it, and get exactly the uninterrupted result.

The run is a six-step script loop (each step sleeps a little); the test watches the
database for the number of finished scripts, kills the process after 1, 3 and 5 of
them, and resumes with ``graphrun resume``.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from graphrun.eventstore.events import (
    NodeCompleted,
    NodeEntered,
    RunCompleted,
    RunResumed,
    ScriptFinished,
)
from graphrun.eventstore.fold import fold
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine.driver import Driver, drive, start_run
from graphrun.runtime.graph.loader import load_graph

SIX_STEPS = """
    name: six
    version: "1.0"
    start: step
    initial_state:
      n: 0
      trail: ""
    nodes:
      step:
        type: script
        script: scripts/step.py
        state_updates:
          trail: "{{trail}}{{n}},"
      done:
        type: end
        output: "n={{n}} trail={{trail}} prompt={{initial_prompt}}"
"""


def step_script(sleep: float) -> dict[str, str]:
    return {
        "scripts/step.py": f"""
            import json, os, time
            state = json.loads(os.environ["GRAPH_STATE"])
            time.sleep({sleep})
            n = state["n"] + 1
            with open("ran.txt", "a") as fh:
                fh.write(f"{{n}}\\n")
            print(json.dumps({{"n": n, "square": n * n, "_next": "done" if n == 6 else "step"}}))
        """
    }


def count(db: Path, event_type: str) -> int:
    if not db.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            (n,) = conn.execute(
                "SELECT count(*) FROM events WHERE type = ?", (event_type,)
            ).fetchone()
        finally:
            conn.close()
    except sqlite3.OperationalError:  # the schema is not there yet
        return 0
    return int(n)


def kill_after(graphrun: Any, root: Path, scripts: int) -> str:
    """Start ``graphrun run``, SIGKILL it once ``scripts`` scripts have finished; the run id."""
    proc = graphrun.popen("run", str(root), "go")
    deadline = time.monotonic() + 30
    try:
        while count(graphrun.db, "ScriptFinished") < scripts:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the run made no progress"
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    store = SqliteStore(graphrun.db)
    try:
        (row,) = store.runs()
        assert row.status == "running" and not store.is_live(row.run_id)
    finally:
        store.close()
    return row.run_id


def baseline(tmp_path: Path, root: Path) -> tuple[str, dict[str, Any]]:
    """The output and state of the same graph run without interruption."""
    store = SqliteStore(tmp_path / "baseline.db")
    run_id = start_run(store, load_graph(root), prompt="go")
    outcome = drive(Driver(store, run_id))
    state = fold(store.read(run_id)).state
    store.close()
    assert outcome.status == "completed" and outcome.output is not None
    return outcome.output, state


def check_log(db: Path, run_id: str) -> list[Any]:
    """Nothing lost, nothing duplicated, the chain verifies; returns the events."""
    store = SqliteStore(db)
    try:
        events = store.read(run_id)
        assert store.verify(run_id) is None
    finally:
        store.close()
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    for kind in (NodeEntered, ScriptFinished, NodeCompleted):
        keys = [(e.node_id, e.visit) for e in events if isinstance(e, kind)]
        assert len(keys) == len(set(keys)), f"duplicate {kind.__name__}: {keys}"
    visits = [e.visit for e in events if isinstance(e, NodeEntered) and e.node_id == "step"]
    assert visits == [1, 2, 3, 4, 5, 6]
    assert [type(e) for e in events].count(RunCompleted) == 1
    assert isinstance(events[-1], RunCompleted)
    return events


@pytest.mark.parametrize("killed_after", [1, 3, 5])
def test_kill_9_then_resume_completes_exactly_once(
    graphrun: Any, agent: Any, tmp_path: Path, killed_after: int
) -> None:
    root = agent(SIX_STEPS, step_script(0.1))
    expected_output, expected_state = baseline(tmp_path, root)
    (root / "ran.txt").unlink()

    run_id = kill_after(graphrun, root, killed_after)
    assert count(graphrun.db, "ScriptFinished") >= killed_after
    assert count(graphrun.db, "RunCompleted") == 0

    resumed = graphrun("resume", run_id)
    assert resumed.code == 0, resumed.stderr
    assert resumed.stdout == expected_output + "\n"
    assert "▸ graph: six resumed (at: " in resumed.stderr

    events = check_log(graphrun.db, run_id)
    assert sum(isinstance(e, RunResumed) for e in events) == 1
    assert fold(events).state == expected_state
    assert fold(events).output == expected_output
    # Recorded results are never performed again: every step that finished before the
    # kill ran once; at most the step in flight at the kill ran twice.
    ran = (root / "ran.txt").read_text().split()
    recorded_before = [e for e in events if isinstance(e, ScriptFinished)][:killed_after]
    for e in recorded_before:
        assert ran.count(str(e.visit)) == 1, ran
    assert sorted(set(ran)) == ["1", "2", "3", "4", "5", "6"]


def test_resume_of_a_finished_run_is_refused(graphrun: Any, agent: Any) -> None:
    root = agent(SIX_STEPS, step_script(0))
    assert graphrun("run", str(root), "go").code == 0
    run_id = graphrun.last_run()
    result = graphrun("resume", run_id)
    assert result.code == 2
    assert result.stderr.strip() == (
        f"error: run {run_id} has already completed; there is nothing to resume"
    )


def test_runs_releases_the_lease_a_killed_process_left(graphrun: Any, agent: Any) -> None:
    """kill -9 leaves the run's lease row behind; `graphrun runs` releases it (the
    holder is dead) and shows the run as interrupted, not as held."""
    root = agent(SIX_STEPS, step_script(0.1))
    run_id = kill_after(graphrun, root, 1)

    def leases() -> list[str]:
        with sqlite3.connect(graphrun.db) as conn:
            return [r[0] for r in conn.execute("SELECT run_id FROM leases")]

    assert leases() == [run_id]
    listed = graphrun("runs")
    assert listed.code == 0, listed.stderr
    assert "interrupted" in listed.stdout
    assert leases() == []
    resumed = graphrun("resume", run_id)
    assert resumed.code == 0, resumed.stderr
    assert leases() == []
