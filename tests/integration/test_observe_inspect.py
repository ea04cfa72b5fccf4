"""The inspection commands: interrupted runs, cancellations, forks, diffs, pipes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import GraphrunCli

APPROVAL = """
name: gate
version: "1.0"
start: review
nodes:
  review:
    type: approval
    question: "Ship it?"
    options: [approve, reject]
    routes: {approve: shipped, reject: held}
    on_other: held
  shipped: {type: end, output: "shipped"}
  held: {type: end, output: "held"}
"""

SLOW = """
name: slow
version: "1.0"
start: work
nodes:
  work:
    type: script
    script: scripts/work.sh
    timeout: 60
    next: done
  done: {type: end, output: "ok"}
"""
SLOW_SH = """
    #!/usr/bin/env bash
    sleep 30
    echo '{}'
"""

LONG = """
name: long
version: "1.0"
start: say
nodes:
  say:
    type: script
    script: scripts/say.py
    next: done
  done: {type: end, output: "{{text}}"}
"""
SAY_PY = """
    import json, os
    if "GRAPH_STATE" in os.environ:
        state = json.loads(os.environ["GRAPH_STATE"])
    else:
        with open(os.environ["GRAPH_STATE_FILE"]) as f:
            state = json.load(f)
    shared = "the same long opening sentence that both runs share " * 2
    print(json.dumps({"text": shared + state["initial_prompt"][:40000]}))
"""


def _waiting(graphrun: GraphrunCli, agent) -> str:  # type: ignore[no-untyped-def]
    res = graphrun("run", str(agent(APPROVAL)), "go")
    assert res.code == 3, res.stderr
    return graphrun.last_run()


def test_a_cancelled_run_does_not_show_waiting_at(graphrun, agent):
    run_id = _waiting(graphrun, agent)
    assert "waiting at: review" in graphrun("show", run_id).stdout
    assert graphrun("cancel", run_id, "--as", "alice").code == 0
    shown = graphrun("show", run_id)
    assert "status cancelled" in shown.stdout
    assert "waiting at" not in shown.stdout
    data = shown_json = graphrun("show", run_id, "--json").json()
    assert isinstance(shown_json, dict)
    assert data["waiting"] is None and data["waiting_node"] is None  # type: ignore[index]


def test_cancellations_are_in_audit(graphrun, agent):
    run_id = _waiting(graphrun, agent)
    assert graphrun("cancel", run_id, "--as", "alice").code == 0
    report = graphrun("audit", run_id, "--json").json()
    (row,) = report["decisions"]  # type: ignore[index]
    assert (row["via"], row["by"], row["node_id"]) == ("cancel", "alice", "review")
    assert row["answer"].startswith("cancelled")
    text = graphrun("audit", run_id).stdout
    assert "cancel" in text and "alice" in text


def test_runs_status_interrupted_lists_a_killed_run(graphrun, agent):
    root = agent(SLOW, {"scripts/work.sh": SLOW_SH})
    os.chmod(root / "scripts" / "work.sh", 0o755)
    proc = graphrun.popen("run", str(root), "go")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = graphrun("runs", "--json").json_lines()
            if rows and rows[0]["current_node"] == "work":  # type: ignore[index]
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run never reached its script")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    run_id = graphrun.last_run()
    res = graphrun("runs", "--status", "interrupted")
    assert res.code == 0, res.stderr
    assert run_id in res.stdout and "interrupted" in res.stdout
    assert graphrun("runs", "--status", "completed").stdout.count(run_id) == 0
    rows = graphrun("runs", "--status", "interrupted", "--json").json_lines()
    assert [r["run_id"] for r in rows] == [run_id]  # type: ignore[index]
    assert rows[0]["display_status"] == "interrupted"  # type: ignore[index]


def test_a_fork_is_listed_by_when_it_was_made(graphrun, agent):
    root = agent(APPROVAL)
    assert graphrun("run", str(root), "go", "--answer", "review=approve").code == 0
    source = graphrun.last_run()
    time.sleep(1.1)
    assert graphrun("run", str(root), "go", "--answer", "review=approve").code == 0
    newer = graphrun("runs", "--json").json_lines()[0]["run_id"]  # type: ignore[index]
    assert newer != source
    time.sleep(1.1)
    forked = graphrun("fork", source, "--at", "2", "--answer", "review=reject")
    assert forked.code == 0, forked.stderr
    rows = graphrun("runs", "--json").json_lines()
    fork = rows[0]
    assert fork["forked_from"] == source  # type: ignore[index]
    table = graphrun("runs").stdout.splitlines()
    assert table[1].startswith(fork["run_id"])  # type: ignore[index]


def test_diff_shows_where_two_long_values_differ(graphrun, agent):
    root = agent(LONG, {"scripts/say.py": SAY_PY})
    assert graphrun("run", str(root), "apples").code == 0
    a = graphrun.last_run()
    time.sleep(0.05)
    assert graphrun("run", str(root), "pears").code == 0
    b = next(
        r["run_id"]
        for r in graphrun("runs", "--json").json_lines()
        if r["run_id"] != a  # type: ignore[index]
    )
    out = graphrun("diff", a, b).stdout.splitlines()
    # Both values share their first 100 characters: each line shows its own ending.
    first_a = next(line for line in out if line.startswith("  a: "))
    first_b = next(line for line in out if line.startswith("  b: "))
    assert {"apples", "pears"} == {w for w in ("apples", "pears") if w in first_a + first_b}
    assert ("apples" in first_a) != ("apples" in first_b)
    final = next(line for line in out if line.startswith("  text: a="))
    assert "apples" in final and "pears" in final


def test_events_json_into_a_closed_pipe_exits_0(graphrun, agent):
    root = agent(LONG, {"scripts/say.py": SAY_PY})
    for word in ("one", "two", "three"):
        assert graphrun("run", str(root), word * 5000).code == 0
    run_id = graphrun.last_run()
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run(
        [sys.executable, "-m", "graphrun.cli", "events", run_id, "--json"],
        stdout=write,
        stderr=subprocess.PIPE,
        env=graphrun.env(),
        timeout=60,
        check=False,
    )
    os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
