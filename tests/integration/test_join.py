"""Join policies on a fan-out: `join: {type: all|any|count, count, timeout}`.

Real script subprocesses and a real SQLite file: the losing branches are cancelled
(their processes gone), recorded as cancelled, left out of the merge; a replay
serves the recorded join without waiting; kill -9 after the first branch finished,
then `resume`, keeps it and performs only the unfinished ones.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from graphrun.eventstore.events import BranchesJoined, NodeFailed, ScriptFinished
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine.driver import Driver, RunOptions, RunOutcome, drive, start_run
from graphrun.runtime.graph.loader import load_graph
from tests.conftest import GraphrunCli, write_agent

GRAPH = """
    name: joined
    version: "1.0"
    start: fan
    reducers: {{seen: append}}
    nodes:
      fan:
        type: script
        script: scripts/fan.py
        next: [a, b, c]
        join: {join}
      a: {{type: script, script: scripts/branch.py, state_updates: {{}}, next: done}}
      b: {{type: script, script: scripts/branch.py, state_updates: {{}}, next: done}}
      c: {{type: script, script: scripts/branch.py, state_updates: {{}}, next: done}}
      done: {{type: end, output: "{{{{seen}}}}"}}
"""
FAN = "import json\nprint(json.dumps({}))\n"
#: Each branch notes its pid and start, sleeps SLEEP_<NODE> seconds, notes its end.
BRANCH = """
    import json, os, time
    node = __NODE__
    marks = os.environ["MARKS"]
    with open(marks, "a") as f:
        f.write(f"{node}-start {os.getpid()}\\n")
    time.sleep(float(os.environ.get("SLEEP_" + node.upper(), "0")))
    with open(marks, "a") as f:
        f.write(f"{node}-end\\n")
    print(json.dumps({"seen": node}))
"""


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "events.db")
    yield s
    s.close()


def _agent(tmp_path: Path, join: str) -> Path:
    root = tmp_path / "agent"
    (root / "scripts").mkdir(parents=True, exist_ok=True)
    (root / "graph.yaml").write_text(textwrap.dedent(GRAPH.format(join=join)))
    (root / "scripts" / "fan.py").write_text(FAN)
    (root / "scripts" / "branch.py").write_text(textwrap.dedent(BRANCH))
    return root


def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **sleeps: float) -> Path:
    marks = tmp_path / "marks"
    monkeypatch.setenv("MARKS", str(marks))
    for node, seconds in sleeps.items():
        monkeypatch.setenv(f"SLEEP_{node.upper()}", str(seconds))
    return marks


def _run(store: SqliteStore, root: Path) -> RunOutcome:
    run_id = start_run(store, load_graph(root))
    return drive(Driver(store, run_id, RunOptions()))


def _pids(marks: Path, node: str) -> list[int]:
    return [
        int(line.split()[1])
        for line in marks.read_text().splitlines()
        if line.startswith(f"{node}-start ")
    ]


def _gone(pid: int) -> bool:
    """The process ended (or is a zombie nobody waits for: it runs no more)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _per_node_scripts(root: Path) -> None:
    """One script file per branch (each knows its own name)."""
    body = textwrap.dedent(BRANCH)
    graph = (root / "graph.yaml").read_text()
    for node in "abc":
        (root / "scripts" / f"{node}.py").write_text(body.replace("__NODE__", repr(node)))
        graph = graph.replace(
            f"{node}: {{type: script, script: scripts/branch.py",
            f"{node}: {{type: script, script: scripts/{node}.py",
        )
    (root / "graph.yaml").write_text(graph)


def _joined(store: SqliteStore, run_id: str) -> list[BranchesJoined]:
    return [e for e in store.read(run_id) if isinstance(e, BranchesJoined)]


def test_count_two_of_three_goes_on_after_the_second_branch(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _agent(tmp_path, "{type: count, count: 2}")
    _per_node_scripts(root)
    marks = _env(monkeypatch, tmp_path, a=0.2, b=0.8, c=10)
    started = time.monotonic()
    outcome = _run(store, root)
    elapsed = time.monotonic() - started
    assert outcome.status == "completed", outcome.error
    assert elapsed < 5, f"the join waited for the slow branch ({elapsed:.1f}s)"
    assert json.loads(outcome.output or "") == ["a", "b"]  # node-id order
    [joined] = _joined(store, outcome.run_id)
    assert (joined.counted, joined.cancelled) == (["a", "b"], ["c"])
    assert joined.reason == "join satisfied"
    [pid] = _pids(marks, "c")
    assert _gone(pid), "the cancelled branch's process is still running"
    assert "c-end" not in marks.read_text().splitlines()
    finished = {e.branch for e in store.read(outcome.run_id) if isinstance(e, ScriptFinished)}
    assert "c" not in finished


def test_any_takes_the_first_branch_to_finish(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _agent(tmp_path, "{type: any}")
    _per_node_scripts(root)
    marks = _env(monkeypatch, tmp_path, a=10, b=0.1, c=10)
    started = time.monotonic()
    outcome = _run(store, root)
    assert outcome.status == "completed", outcome.error
    assert time.monotonic() - started < 5
    assert json.loads(outcome.output or "") == ["b"]
    [joined] = _joined(store, outcome.run_id)
    assert (joined.counted, joined.cancelled) == (["b"], ["a", "c"])
    assert all(_gone(pid) for node in "ac" for pid in _pids(marks, node))


def test_timeout_cancels_the_rest_and_fails_the_step(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _agent(tmp_path, "{type: all, timeout: 1}")
    _per_node_scripts(root)
    marks = _env(monkeypatch, tmp_path, a=0.1, b=0.1, c=10)
    started = time.monotonic()
    outcome = _run(store, root)
    assert time.monotonic() - started < 6
    assert outcome.status == "failed"
    assert "2 of 3 branches finished within the join timeout (1s); cancelled: c" in (
        outcome.error or ""
    )
    events = store.read(outcome.run_id)
    [joined] = [e for e in events if isinstance(e, BranchesJoined)]
    assert (joined.counted, joined.cancelled) == (["a", "b"], ["c"])
    assert joined.reason == "join timeout (1s)"
    failed = [e for e in events if isinstance(e, NodeFailed)]
    assert [(e.node_id, e.branch) for e in failed] == [("c", "c")]
    assert "cancelled" in failed[0].error
    assert all(_gone(pid) for pid in _pids(marks, "c"))


def test_a_count_join_satisfied_before_the_timeout_goes_on(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _agent(tmp_path, "{type: count, count: 1, timeout: 5}")
    _per_node_scripts(root)
    _env(monkeypatch, tmp_path, a=0.1, b=10, c=10)
    outcome = _run(store, root)
    assert outcome.status == "completed", outcome.error
    assert json.loads(outcome.output or "") == ["a"]


def test_without_a_policy_every_branch_counts(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _agent(tmp_path, "{type: all}")
    _per_node_scripts(root)
    _env(monkeypatch, tmp_path, a=0.1, b=0.3, c=0.2)
    outcome = _run(store, root)
    assert outcome.status == "completed", outcome.error
    assert json.loads(outcome.output or "") == ["a", "b", "c"]
    assert _joined(store, outcome.run_id) == []


def test_replay_serves_the_recorded_join_without_waiting(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from graphrun.runtime.replay.divergence import replay_events

    root = _agent(tmp_path, "{type: count, count: 2}")
    _per_node_scripts(root)
    _env(monkeypatch, tmp_path, a=0.2, b=0.5, c=10)
    outcome = _run(store, root)
    assert outcome.status == "completed", outcome.error
    for node in "abc":  # a replay performs nothing
        (root / "scripts" / f"{node}.py").write_text("raise SystemExit('must not run')\n")
    started = time.monotonic()
    result = replay_events(store.read(outcome.run_id))
    assert time.monotonic() - started < 5
    assert result.ok, result.divergence and result.divergence.format()
    assert result.final is not None and result.final.output == outcome.output

    root2 = _agent(tmp_path / "t", "{type: any, timeout: 1}")
    _per_node_scripts(root2)
    _env(monkeypatch, tmp_path, a=10, b=10, c=10)
    timed_out = _run(store, root2)
    assert timed_out.status == "failed"
    started = time.monotonic()
    result2 = replay_events(store.read(timed_out.run_id))
    assert time.monotonic() - started < 5
    assert result2.ok, result2.divergence and result2.divergence.format()
    assert result2.final is not None and result2.final.error == timed_out.error


def test_kill_after_the_first_branch_then_resume_completes(tmp_path: Path) -> None:
    """kill -9 once branch a finished (b and c still running), then `resume`: a is
    kept, b and c are performed again until the join (count 2) holds."""
    root = _agent(tmp_path, "{type: count, count: 2}")
    _per_node_scripts(root)
    db = tmp_path / "events.db"
    marks = tmp_path / "marks"
    env = {
        **os.environ,
        "MARKS": str(marks),
        "GRAPHRUN_DB": str(db),
        "SLEEP_A": "0",
        "SLEEP_B": "30",
        "SLEEP_C": "30",
    }
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
    # The killed run's branch processes die with it or are left to sleep: end them.
    for node in "bc":
        for pid in _pids(marks, node):
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
    env["SLEEP_B"] = "0.2"
    began = time.monotonic()
    resumed = subprocess.run(
        [sys.executable, "-m", "graphrun.cli", "resume", run_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert time.monotonic() - began < 20
    assert json.loads(resumed.stdout) == ["a", "b"]
    lines = marks.read_text().splitlines()
    assert sum(line.startswith("a-start") for line in lines) == 1  # a kept
    assert sum(line.startswith("b-start") for line in lines) == 2  # b performed again
    assert "c-end" not in lines
    assert all(_gone(pid) for pid in _pids(marks, "c"))
    events = store.read(run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    [joined] = [e for e in events if isinstance(e, BranchesJoined)]
    assert (joined.counted, joined.cancelled) == (["a", "b"], ["c"])
    store.close()


@pytest.mark.parametrize(
    ("join", "next_", "line", "path", "message"),
    [
        (
            "{type: first}",
            "[a, b, c]",
            10,
            "$.nodes.fan.join.type",
            "join.type 'first' is not one of all, any, count",
        ),
        ("{type: count}", "[a, b, c]", 10, "$.nodes.fan.join", "join.type count needs join.count"),
        (
            "{type: count, count: 4}",
            "[a, b, c]",
            10,
            "$.nodes.fan.join.count",
            "join.count must be between 1 and 3 (the fan-out's branches), not 4",
        ),
        (
            "{type: count, count: 0}",
            "[a, b, c]",
            10,
            "$.nodes.fan.join.count",
            "join.count must be between 1 and 3",
        ),
        (
            "{type: any, timeout: 0}",
            "[a, b, c]",
            10,
            "$.nodes.fan.join.timeout",
            "join.timeout must be more than 0 seconds",
        ),
        (
            "{type: any}",
            "a",
            10,
            "$.nodes.fan.join",
            "join needs a fan-out: a `next` list of two or more nodes",
        ),
    ],
)
def test_validate_checks_the_join(
    graphrun: GraphrunCli,
    tmp_path: Path,
    join: str,
    next_: str,
    line: int,
    path: str,
    message: str,
) -> None:
    root = write_agent(
        tmp_path / "v",
        f"""
        name: joined
        version: "1.0"
        start: fan
        reducers: {{seen: append}}
        nodes:
          fan:
            type: script
            script: scripts/fan.py
            next: {next_}
            join: {join}
          a: {{type: script, script: scripts/b.py, state_updates: {{}}, next: done}}
          b: {{type: script, script: scripts/b.py, state_updates: {{}}, next: done}}
          c: {{type: script, script: scripts/b.py, state_updates: {{}}, next: done}}
          done: {{type: end, output: "{{{{seen}}}}"}}
        """,
        {"scripts/fan.py": FAN, "scripts/b.py": FAN},
    )
    result = graphrun("validate", str(root))
    assert result.code == 2, result.stderr
    f = root / "graph.yaml"
    assert f"error: {f}:{line} ({path}): node 'fan': {message}" in result.stderr


SLEEPER = """\
    name: sleeper
    version: "1.0"
    start: nap
    nodes:
      nap: {type: script, script: scripts/nap.sh, timeout: 60, next: done}
      done: {type: end, output: rested}
"""
NAP_SH = """\
    #!/usr/bin/env bash
    echo $$ > "$PID_FILE"
    sleep 30 &
    echo $! >> "$PID_FILE"
    wait
    echo '{}'
"""


def test_a_losing_agent_branch_cancels_its_child_run(graphrun: GraphrunCli, tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    write_agent(agents / "sleeper", SLEEPER, {"scripts/nap.sh": NAP_SH})
    parent = write_agent(
        tmp_path / "boss",
        """\
        name: boss
        version: "1.0"
        start: fan
        nodes:
          fan: {type: script, script: scripts/fan.py, next: [quick, slow], join: {type: any}}
          quick: {type: script, script: scripts/quick.py, state_updates: {}, next: done}
          slow: {type: agent, agent: sleeper, prompt: nap, next: done}
          done: {type: end, output: "{{winner}}"}
        """,
        {
            "scripts/fan.py": FAN,
            # Finishes once the child run's script has started.
            "scripts/quick.py": """\
                import json, os, time
                while not os.path.exists(os.environ["PID_FILE"]):
                    time.sleep(0.05)
                time.sleep(0.3)
                print(json.dumps({"winner": "quick"}))
            """,
        },
    )
    pid_file = tmp_path / "pids"
    began = time.monotonic()
    res = graphrun("run", str(parent), "--agents-dir", str(agents), PID_FILE=str(pid_file))
    assert res.code == 0, res.stderr
    assert time.monotonic() - began < 20
    assert res.stdout.strip() == "quick"
    rows = graphrun("runs", "--json").json_lines()
    child = next(r for r in rows if r["parent_run_id"] is not None)  # type: ignore[index]
    assert child["status"] == "cancelled"  # type: ignore[index]
    pids = [int(line) for line in pid_file.read_text().split()]
    deadline = time.monotonic() + 3
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in pids)
    top = next(r for r in rows if r["parent_run_id"] is None)  # type: ignore[index]
    replayed = graphrun("replay", top["run_id"])  # type: ignore[index]
    assert replayed.code == 0, replayed.stdout + replayed.stderr


def test_validate_refuses_a_join_over_a_map_branch(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = write_agent(
        tmp_path / "m",
        """
        name: mapped
        version: "1.0"
        start: fan
        nodes:
          fan:
            type: script
            script: scripts/fan.py
            next: [each, b]
            join: {type: any}
          each: {type: map, over: "{{items}}", as: item, branch: b, collect_into: out, next: done}
          b: {type: script, script: scripts/fan.py, state_updates: {}, next: done}
          done: {type: end, output: "x"}
        """,
        {"scripts/fan.py": FAN},
    )
    result = graphrun("validate", str(root))
    assert result.code == 2, result.stderr
    assert (
        f"error: {root / 'graph.yaml'}:9 ($.nodes.fan.join): node 'fan': join cannot count a "
        "map branch (each)"
    ) in result.stderr
