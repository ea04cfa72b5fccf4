"""`graphrun cancel` of a run another process is driving: the request is recorded
outside the run's log, the driving process sees it, kills its effects' process
groups, records `RunCancelled` by whoever asked and exits 1. Real processes, a
real database."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from graphrun.eventstore.events import RunCancelled
from graphrun.eventstore.fold import fold
from graphrun.eventstore.migrations import SCHEMA_USER_VERSION
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine.driver import Driver, RunOptions, drive, start_run
from graphrun.runtime.graph.loader import load_text
from tests.support.sleepy import NAP_SH, SLEEPY


def wait_for(predicate, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        try:  # a zombie is gone for our purposes
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        return False
    return True


def test_cancel_from_another_process_stops_the_driving_process(
    graphrun, agent, tmp_path: Path
) -> None:
    root = agent(SLEEPY, {"scripts/nap.sh": NAP_SH})
    pids = tmp_path / "pids"
    proc = graphrun.popen("run", str(root), PIDS=str(pids), NAP="60")
    try:
        wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2)
        run_id = graphrun.last_run()

        asked_at = time.monotonic()
        res = graphrun("cancel", run_id, "--as", "ops", "--reason", "no longer needed")
        took = time.monotonic() - asked_at
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    assert res.code == 0, res.stderr
    assert f"▸ asked the process driving run {run_id}" in res.stderr
    assert res.stderr.rstrip().endswith(f"▸ run {run_id} cancelled")
    assert took < 10, f"the cancel took {took:.1f}s"
    # The driving process stops cleanly, exit 1, naming who cancelled.
    assert proc.returncode == 1, err
    assert "no longer needed" in err and "ops" in err
    assert "Traceback" not in err
    # The script's whole process group is gone.
    wait_for(lambda: _gone([int(p) for p in pids.read_text().split()]), timeout=10)

    events = graphrun("events", run_id, "--json").json_lines()
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    last = events[-1]
    assert (last["type"], last["by"], last["reason"]) == ("RunCancelled", "ops", "no longer needed")
    finished = [e for e in events if e["type"] == "ScriptFinished"]
    assert len(finished) == 1 and "cancelled" in finished[0]["error"]
    assert [r["status"] for r in graphrun("runs", "--json").json_lines()] == ["cancelled"]

    audit = graphrun("audit", run_id)
    assert audit.code == 0, audit.stderr
    assert "ops" in audit.stdout and "no longer needed" in audit.stdout
    assert graphrun("audit", run_id, "--verify").code == 0

    resumed = graphrun("resume", run_id)
    assert resumed.code == 2
    assert "already cancelled" in resumed.stderr
    # The request is a row of its own, not an event of the run.
    with sqlite3.connect(graphrun.db) as db:
        rows = db.execute("SELECT run_id, requested_by, reason FROM cancel_requests").fetchall()
    assert rows == [(run_id, "ops", "no longer needed")]


def test_cancel_of_a_finished_run_or_an_unknown_one_is_refused(graphrun, agent) -> None:
    root = agent(SLEEPY, {"scripts/nap.sh": NAP_SH})
    done = graphrun("run", str(root), PIDS=os.devnull)
    assert done.code == 0, done.stderr
    run_id = graphrun.last_run()
    res = graphrun("cancel", run_id)
    assert res.code == 2
    assert res.stderr == f"error: run {run_id} has already completed\n"
    res = graphrun("cancel", "nosuchrun")
    assert res.code == 2
    assert res.stderr.startswith("error: no run 'nosuchrun'")


def test_a_driver_acts_on_a_request_recorded_before_it_started(tmp_path: Path, monkeypatch) -> None:
    """The request is durable: a run resumed after it was asked to stop is cancelled
    at once, by whoever asked, and its script never starts."""
    root = tmp_path / "sleepy"
    (root / "scripts").mkdir(parents=True)
    (root / "graph.yaml").write_text(SLEEPY)
    (root / "scripts" / "nap.sh").write_text(NAP_SH)
    pids = tmp_path / "pids"
    monkeypatch.setenv("PIDS", str(pids))
    with SqliteStore(tmp_path / "events.db") as store:
        loaded = load_text(SLEEPY, path=root / "graph.yaml", agent_dir=root)
        run_id = start_run(store, loaded)
        store.request_cancel(run_id, "ann", "stop it")
        outcome = drive(Driver(store, run_id, RunOptions()))
        events = store.read(run_id)
    assert outcome.status == "cancelled"
    assert outcome.error == "stop it (requested by ann)"
    assert isinstance(events[-1], RunCancelled)
    assert (events[-1].by, events[-1].reason) == ("ann", "stop it")
    assert fold(events).status == "cancelled"
    assert not pids.exists()


def test_a_schema_4_database_gains_the_cancel_requests_table(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    with SqliteStore(db) as store:
        loaded = load_text(SLEEPY, path=tmp_path / "graph.yaml", agent_dir=tmp_path)
        run_id = start_run(store, loaded)
    with sqlite3.connect(db) as conn:  # the file as the previous schema left it
        conn.execute("DROP TABLE cancel_requests")
        conn.execute("PRAGMA user_version = 4")
    with SqliteStore(db) as store:
        assert store.cancel_requested(run_id) is None
        store.request_cancel(run_id, "ann", "why")
        assert store.cancel_requested(run_id) == ("ann", "why")
        assert store.verify(run_id) is None
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_USER_VERSION


FAN = """
name: fan
version: "1.0"
start: fan
settings: {max_concurrency: 4}
reducers: {slept: append}
nodes:
  fan: {type: script, script: scripts/fan.py, next: [a, b, c]}
  a: {type: script, script: scripts/nap.sh, timeout: 120, state_updates: {}, next: join}
  b: {type: script, script: scripts/nap.sh, timeout: 120, state_updates: {}, next: join}
  c: {type: script, script: scripts/nap.sh, timeout: 120, state_updates: {}, next: join}
  join: {type: end, output: "{{slept}}"}
"""


def test_cancel_stops_every_branch_of_a_parallel_step(graphrun, agent, tmp_path: Path) -> None:
    root = agent(FAN, {"scripts/fan.py": "print('{}')\n", "scripts/nap.sh": NAP_SH})
    pids = tmp_path / "pids"
    proc = graphrun.popen("run", str(root), PIDS=str(pids), NAP="60")
    try:
        wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 6)
        run_id = graphrun.last_run()
        res = graphrun("cancel", run_id, "--as", "ops")
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert res.code == 0, res.stderr
    assert proc.returncode == 1, err
    wait_for(lambda: _gone([int(p) for p in pids.read_text().split()]), timeout=10)
    events = graphrun("events", run_id, "--json").json_lines()
    assert (events[-1]["type"], events[-1]["by"]) == ("RunCancelled", "ops")
    assert not [e for e in events if e["type"] in ("RunFailed", "NodeFailed")]
    assert graphrun("audit", run_id, "--verify").code == 0


LLM = """
name: slowmodel
version: "1.0"
model: openai:gpt-test
start: think
nodes:
  think:
    type: llm
    prompt: "{{initial_prompt}}"
    state_updates: {reply: "{{output}}"}
    next: done
  done: {type: end, output: "{{reply}}"}
"""


def test_cancel_aborts_an_llm_call_in_flight(graphrun, agent, fake_llm) -> None:
    from tests.support.fake_llm import text

    root = agent(LLM)
    fake_llm.script(text("too late", delay=60))
    env = {"OPENAI_BASE_URL": fake_llm.url_openai, "OPENAI_API_KEY": "sk-x"}
    proc = graphrun.popen("run", str(root), "think", **env)
    try:
        wait_for(lambda: len(fake_llm.requests) == 1)
        run_id = graphrun.last_run()
        res = graphrun("cancel", run_id, "--as", "ops")
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert res.code == 0, res.stderr
    assert proc.returncode == 1, err
    events = graphrun("events", run_id, "--json").json_lines()
    assert (events[-1]["type"], events[-1]["by"]) == ("RunCancelled", "ops")
    assert [r["status"] for r in graphrun("runs", "--json").json_lines()] == ["cancelled"]


BOSS = """
name: boss
version: "1.0"
start: delegate
nodes:
  delegate: {type: agent, agent: sleeper, prompt: nap, next: done}
  done: {type: end}
"""


def test_cancel_of_a_parent_cancels_its_running_child_in_both_logs(
    graphrun, agent, tmp_path: Path
) -> None:
    agents = tmp_path / "agents"
    agent(SLEEPY, {"scripts/nap.sh": NAP_SH}, name="agents/sleeper")
    root = agent(BOSS)
    pids = tmp_path / "pids"
    proc = graphrun.popen("run", str(root), "--agents-dir", str(agents), PIDS=str(pids), NAP="60")
    try:
        wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2)
        rows = graphrun("runs", "--json").json_lines()
        (top,) = [r["run_id"] for r in rows if r["parent_run_id"] is None]
        (child,) = [r["run_id"] for r in rows if r["parent_run_id"] is not None]
        res = graphrun("cancel", top, "--as", "ops")
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert res.code == 0, res.stderr
    assert proc.returncode == 1, err
    wait_for(lambda: _gone([int(p) for p in pids.read_text().split()]), timeout=10)
    statuses = {r["run_id"]: r["status"] for r in graphrun("runs", "--json").json_lines()}
    assert statuses == {top: "cancelled", child: "cancelled"}
    top_events = graphrun("events", top, "--json").json_lines()
    assert (top_events[-1]["type"], top_events[-1]["by"]) == ("RunCancelled", "ops")
    assert graphrun("events", child, "--json").json_lines()[-1]["type"] == "RunCancelled"
    # The agent effect records the child's end and its cancellation together.
    assert [e["type"] for e in top_events if e.get("child_run_id") == child] == [
        "ChildRunStarted",
        "ChildRunFinished",
        "ChildCancelled",
    ]
    for run_id in (top, child):
        assert graphrun("audit", run_id, "--verify").code == 0


def test_a_driver_that_dies_after_the_request_is_cancelled_by_the_canceller(
    graphrun, agent, tmp_path: Path
) -> None:
    """The canceller waits for the driver; when the driver is gone without having
    acted (here: stopped, then killed), the canceller cancels the run itself."""
    import signal
    import subprocess
    import sys

    root = agent(SLEEPY, {"scripts/nap.sh": NAP_SH})
    pids = tmp_path / "pids"
    proc = graphrun.popen("run", str(root), PIDS=str(pids), NAP="60")
    canceller = None
    try:
        wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2)
        run_id = graphrun.last_run()
        proc.send_signal(signal.SIGSTOP)  # alive, but no longer looking
        canceller = subprocess.Popen(
            [sys.executable, "-m", "graphrun.cli", "cancel", run_id, "--as", "ops"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=graphrun.env(),
        )
        with sqlite3.connect(graphrun.db) as db:
            wait_for(lambda: db.execute("SELECT count(*) FROM cancel_requests").fetchone()[0])
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
        _out, err = canceller.communicate(timeout=30)
    finally:
        for p in (proc, canceller):
            if p is not None and p.poll() is None:
                p.kill()
                p.communicate()
        # A driver killed with -9 leaves its script running (in its own group).
        for pid in pids.read_text().split() if pids.exists() else ():
            try:
                os.killpg(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    assert canceller.returncode == 0, err
    assert "▸ asked the process driving run" in err
    events = graphrun("events", run_id, "--json").json_lines()
    assert (events[-1]["type"], events[-1]["by"]) == ("RunCancelled", "ops")
    assert graphrun("audit", run_id, "--verify").code == 0


def test_the_canceller_reports_a_run_that_ends_otherwise_or_keeps_running(
    tmp_path: Path,
) -> None:
    import pytest

    from graphrun.eventstore.events import RunCompleted
    from graphrun.runtime.engine.lifecycle import cancel
    from graphrun.runtime.errors import AnswerError, RunError
    from tests.conformance.store_contract import started

    db = tmp_path / "events.db"
    with SqliteStore(db) as driver, SqliteStore(db) as canceller:
        driver.append("r1", [started()])
        driver.acquire_lease("r1")  # a live process (this one) drives r1
        seen: list[object] = []
        with pytest.raises(RunError, match=r"run r1 is still running 0\.3s after process"):
            cancel(canceller, "r1", reason="why", by="ops", wait=0.3, asked=seen.append)
        assert seen == [driver.lease("r1")]
        assert canceller.cancel_requested("r1") == ("ops", "why")
        assert [type(e) for e in driver.read("r1")] == [type(started())]

        def finish(_lease: object) -> None:  # the driver completes the run meanwhile
            driver.append("r1", [RunCompleted(output="done", node_id="end")])
            driver.release_lease("r1")

        with pytest.raises(AnswerError, match="run r1 completed before it could be cancelled"):
            cancel(canceller, "r1", reason="why", by="ops", wait=5, asked=finish)
