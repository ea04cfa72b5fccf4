"""One writer per run: two processes resuming the same run at once."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from graphrun.eventstore.errors import LeaseHeldError
from graphrun.eventstore.events import NodeEntered, RunCompleted, ScriptFinished
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine.driver import Driver, drive, start_run
from graphrun.runtime.graph.loader import load_graph
from tests.integration.test_crash_resume import SIX_STEPS, check_log, kill_after, step_script


def test_two_resumes_at_once_one_proceeds(graphrun: Any, agent: Any) -> None:
    root = agent(SIX_STEPS, step_script(0.3))
    run_id = kill_after(graphrun, root, 1)
    first = graphrun.popen("resume", run_id)
    second = graphrun.popen("resume", run_id)
    results = [(p.wait(timeout=60), *p.communicate()) for p in (first, second)]
    codes = sorted(code for code, _out, _err in results)
    assert codes == [0, 2], results
    (loser,) = [r for r in results if r[0] == 2]
    (winner,) = [r for r in results if r[0] == 0]
    assert winner[1].startswith("n=6 ")
    lines = [line for line in loser[2].splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in loser[2]
    assert lines[0].startswith(f"error: run {run_id} is being extended by process ")
    assert (
        f" on {socket.gethostname()} (wait for it to finish or stop it; the lease expires in "
        in lines[0]
    )
    assert loser[1] == ""
    events = check_log(graphrun.db, run_id)
    assert isinstance(events[-1], RunCompleted)
    assert graphrun("audit", run_id, "--verify").code == 0


def test_a_leased_run_refuses_a_second_driver(tmp_path: Path, agent: Any) -> None:
    root = agent(SIX_STEPS, step_script(0.2))
    db = tmp_path / "events.db"
    a, b = SqliteStore(db), SqliteStore(db)
    run_id = start_run(a, load_graph(root), prompt="go")
    outcome: list[Any] = []
    worker = threading.Thread(target=lambda: outcome.append(drive(Driver(a, run_id))))
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while a.lease(run_id) is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(LeaseHeldError, match=f"run {run_id} is being extended by process"):
            Driver(b, run_id).drive()
    finally:
        worker.join(timeout=30)
    assert outcome and outcome[0].status == "completed"
    events = b.read(run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert sum(isinstance(e, ScriptFinished) for e in events) == 6
    assert sum(isinstance(e, NodeEntered) for e in events) == 7
    assert b.verify(run_id) is None
    assert b.lease(run_id) is None  # released at the end
    a.close()
    b.close()
