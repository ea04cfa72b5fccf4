"""A join whose branch fails before it holds: an ``any``/``count`` join goes on
without the failed branch while it can still hold with the others (the branch is
recorded as failed in ``BranchesJoined`` and left out of the merge); it fails the
step only once it can no longer hold, cancelling the branches still running. Real
script subprocesses, a real SQLite file; replayed; kill -9 after the failure, then
``resume``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import msgspec
import pytest

from graphrun.eventstore.events import BranchesJoined, NodeFailed, RunFailed, ScriptFinished
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine.driver import Driver, RunOptions, drive, start_run
from graphrun.runtime.graph.loader import load_graph
from graphrun.runtime.replay.divergence import replay_events
from tests.conftest import GraphrunCli
from tests.integration.test_join import _agent, _env, _gone, _joined, _pids, _run, store

__all__ = ["store"]  # the fixture, shared with test_join

#: Like test_join's branch, but exits 1 when FAIL_<NODE> is set (after its sleep).
FAILING = """
    import json, os, sys, time
    node = __NODE__
    marks = os.environ["MARKS"]
    with open(marks, "a") as f:
        f.write(f"{node}-start {os.getpid()}\\n")
    time.sleep(float(os.environ.get("SLEEP_" + node.upper(), "0")))
    if os.environ.get("FAIL_" + node.upper()):
        print(f"{node} could not reach its source", file=sys.stderr)
        sys.exit(1)
    with open(marks, "a") as f:
        f.write(f"{node}-end\\n")
    print(json.dumps({"seen": node}))
"""


def _failing_agent(tmp_path: Path, join: str) -> Path:
    root = _agent(tmp_path, join)
    graph = (root / "graph.yaml").read_text()
    for node in "abc":
        body = textwrap.dedent(FAILING).replace("__NODE__", repr(node))
        (root / "scripts" / f"{node}.py").write_text(body)
        graph = graph.replace(
            f"{node}: {{type: script, script: scripts/branch.py",
            f"{node}: {{type: script, script: scripts/{node}.py",
        )
    (root / "graph.yaml").write_text(graph)
    return root


def test_a_count_join_goes_on_without_a_failed_branch(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _failing_agent(tmp_path, "{type: count, count: 2}")
    _env(monkeypatch, tmp_path, a=0, b=0.3, c=0.6)
    monkeypatch.setenv("FAIL_A", "1")
    outcome = _run(store, root)
    assert outcome.status == "completed", outcome.error  # not completed_with_errors
    assert json.loads(outcome.output or "") == ["b", "c"]
    [joined] = _joined(store, outcome.run_id)
    assert (joined.counted, joined.failed, joined.cancelled) == (["b", "c"], ["a"], [])
    assert joined.reason == "join satisfied"
    assert joined.errors == {"a": "script exited with code 1: a could not reach its source"}
    assert outcome.left_out == (
        {"step": 1, "branch": "a", "node": "a", "error": joined.errors["a"]},
    )
    result = replay_events(store.read(outcome.run_id))
    assert result.ok, result.divergence and result.divergence.format()
    assert result.final is not None and result.final.output == outcome.output


def test_any_skips_a_failed_first_branch_and_cancels_the_rest(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _failing_agent(tmp_path, "{type: any}")
    marks = _env(monkeypatch, tmp_path, a=0, b=0.4, c=10)
    monkeypatch.setenv("FAIL_A", "1")
    started = time.monotonic()
    outcome = _run(store, root)
    assert time.monotonic() - started < 5
    assert outcome.status == "completed", outcome.error
    assert json.loads(outcome.output or "") == ["b"]
    [joined] = _joined(store, outcome.run_id)
    assert (joined.counted, joined.failed, joined.cancelled) == (["b"], ["a"], ["c"])
    assert all(_gone(pid) for pid in _pids(marks, "c"))


def test_a_join_that_can_no_longer_hold_fails_the_step_at_once(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _failing_agent(tmp_path, "{type: count, count: 2}")
    marks = _env(monkeypatch, tmp_path, a=0, b=0.3, c=10)
    monkeypatch.setenv("FAIL_A", "1")
    monkeypatch.setenv("FAIL_B", "1")
    started = time.monotonic()
    outcome = _run(store, root)
    assert time.monotonic() - started < 5, "the step waited for a join that could not hold"
    assert outcome.status == "failed"
    reason = "join cannot hold: 2 of 3 branches failed (a, b), 2 needed"
    assert outcome.error == f"super-step 1: {reason}"
    events = store.read(outcome.run_id)
    [joined] = _joined(store, outcome.run_id)
    assert (joined.counted, joined.failed, joined.cancelled) == ([], ["a", "b"], ["c"])
    assert joined.reason == reason
    failed = {e.branch: e for e in events if isinstance(e, NodeFailed)}
    assert failed["a"].error_kind == "ScriptExit"
    assert "exit" in failed["a"].error
    assert failed["c"].error == f"cancelled: {reason}"
    assert all(_gone(pid) for pid in _pids(marks, "c"))
    assert isinstance(events[-1], RunFailed)
    result = replay_events(events)
    assert result.ok, result.divergence and result.divergence.format()
    assert result.final is not None and result.final.error == outcome.error


def test_kill_after_a_branch_failed_then_resume_completes(tmp_path: Path) -> None:
    """kill -9 once branch a failed (b and c still running), then `resume`: a stays
    failed, b and c are performed again and the count-2 join holds with them."""
    root = _failing_agent(tmp_path, "{type: count, count: 2}")
    db = tmp_path / "events.db"
    marks = tmp_path / "marks"
    env = {**os.environ, "MARKS": str(marks), "GRAPHRUN_DB": str(db), "FAIL_A": "1"}
    env.update({"SLEEP_A": "0", "SLEEP_B": "30", "SLEEP_C": "30"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "graphrun.cli", "run", str(root)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    store: SqliteStore | None = None
    while True:
        assert time.monotonic() < deadline, "branch a never finished"
        if db.exists():
            store = store or SqliteStore(db)
            runs = store.runs(limit=1)
            started = marks.read_text() if marks.exists() else ""
            if (
                runs
                and "b-start" in started
                and "c-start" in started
                and any(
                    isinstance(e, ScriptFinished) and e.branch == "a"
                    for e in store.read(runs[0].run_id)
                )
            ):
                break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    assert store is not None
    run_id = store.runs(limit=1)[0].run_id
    for node in "bc":
        for pid in _pids(marks, node):
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
    env.update({"SLEEP_B": "0.2", "SLEEP_C": "0.4"})
    resumed = subprocess.run(
        [sys.executable, "-m", "graphrun.cli", "resume", run_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == ["b", "c"]
    lines = marks.read_text().splitlines()
    assert sum(line.startswith("a-start") for line in lines) == 1  # a's failure kept
    events = store.read(run_id)
    [joined] = [e for e in events if isinstance(e, BranchesJoined)]
    assert (joined.counted, joined.failed, joined.cancelled) == (["b", "c"], ["a"], [])
    store.close()


def test_the_report_shows_the_failed_branch(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from graphrun.runtime.observe.report import render_report, view_run

    root = _failing_agent(tmp_path, "{type: count, count: 2}")
    _env(monkeypatch, tmp_path, a=0, b=0.2, c=0.4)
    monkeypatch.setenv("FAIL_A", "1")
    outcome = _run(store, root)
    assert outcome.status == "completed", outcome.error
    html = render_report([view_run(store.read(outcome.run_id), {})], {})
    assert "failed before the join held: left out (join satisfied)" in html
    assert "script exited with code 1: a could not reach its source" in html
    assert "Branches left out" in html


def test_the_picture_names_the_join(tmp_path: Path) -> None:
    from graphrun.runtime.observe.graphpic import build_picture, to_mermaid

    root = _failing_agent(tmp_path, "{type: count, count: 2, timeout: 15}")
    mermaid = to_mermaid(build_picture(load_graph(root).graph))
    assert mermaid.count('-->|"fan-out, join count 2 within 15s"|') == 3


def test_a_crash_between_the_join_and_its_failure_still_fails_the_step(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The join's record is durable, the failure after it is not: deciding again on
    what the log holds fails the step instead of merging the branches that are left."""
    from graphrun.eventstore.fold import fold
    from graphrun.runtime.engine import decider

    root = _failing_agent(tmp_path, "{type: count, count: 2}")
    _env(monkeypatch, tmp_path, a=0, b=0.2, c=10)
    monkeypatch.setenv("FAIL_A", "1")
    monkeypatch.setenv("FAIL_B", "1")
    outcome = _run(store, root)
    events = store.read(outcome.run_id)
    cut = next(i for i, e in enumerate(events) if isinstance(e, BranchesJoined)) + 1
    step = decider.decide(load_graph(root).graph, fold(events[:cut]))
    assert isinstance(step, decider.Append)
    [failed] = step.events
    assert isinstance(failed, RunFailed)
    assert failed.error == "super-step 1: join cannot hold: 0 branch(es) counted, 2 needed"


def test_a_branch_whose_effect_raised_is_left_out_with_its_error_and_replays(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Branch c is an llm node the recording has no answer for (``--llm-replay``): its
    effect raises, so nothing but the join records why it failed. The join keeps the
    error; the outcome names it; a replay serves it (and serves an empty one from a
    log written before joins kept errors), where it used to find no effect for c."""
    root = _failing_agent(tmp_path, "{type: count, count: 2}")
    graph = (root / "graph.yaml").read_text()
    graph = graph.replace(
        "c: {type: script, script: scripts/c.py, state_updates: {}, next: done}",
        "c: {type: llm, model: 'openai:gpt-4o', prompt: hi, next: done}",
    )
    assert "type: llm" in graph
    (root / "graph.yaml").write_text(graph)
    _env(monkeypatch, tmp_path, a=0.2, b=0.2)
    options = RunOptions()
    options.llm_replay = []  # a recording without this call
    run_id = start_run(store, load_graph(root))
    outcome = drive(Driver(store, run_id, options))
    assert outcome.status == "completed", outcome.error
    assert json.loads(outcome.output or "") == ["a", "b"]
    events = store.read(run_id)
    assert not [e for e in events if isinstance(e, NodeFailed)]  # only the join says it
    [joined] = _joined(store, run_id)
    assert (joined.counted, joined.failed) == (["a", "b"], ["c"])
    assert "no recorded LLM response matches" in joined.errors["c"]
    [left_out] = outcome.left_out
    assert (left_out["branch"], left_out["error"]) == ("c", joined.errors["c"])
    result = replay_events(events)
    assert result.ok, result.divergence and result.divergence.format()
    earlier = [
        msgspec.structs.replace(e, errors={}) if isinstance(e, BranchesJoined) else e
        for e in events
    ]
    result = replay_events(earlier)
    assert result.ok, result.divergence and result.divergence.format()


def test_run_show_and_json_name_the_branch_a_join_left_out(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    root = _failing_agent(tmp_path, "{type: count, count: 2}")
    env = {"MARKS": str(tmp_path / "marks"), "FAIL_A": "1", "SLEEP_B": "0.2", "SLEEP_C": "0.3"}
    ran = graphrun("run", str(root), **env)
    assert ran.code == 0, ran.stderr
    assert json.loads(ran.stdout) == ["b", "c"]
    error = "script exited with code 1: a could not reach its source"
    assert f"branch 'a' failed and the join of super-step 1 went on without it: {error}" in (
        ran.stderr
    )
    as_json = graphrun("run", str(root), "--json", **env)
    assert as_json.code == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["left_out_branches"] == [{"step": 1, "branch": "a", "node": "a", "error": error}]
    shown = graphrun("show", data["run_id"])
    assert shown.code == 0, shown.stderr
    assert f"left out by the join of super-step 1: branch a (node a) failed: {error}" in (
        shown.stdout
    )
    assert f"failed [a: {error[:39]}" in graphrun("events", data["run_id"]).stdout
