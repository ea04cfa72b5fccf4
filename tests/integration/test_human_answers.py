"""Waiting runs answered later: ``approve`` / ``answer`` from other processes, races,
refusals, approvers, and ``runs --status waiting``."""

from __future__ import annotations

import getpass
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.test_human_nodes import APPROVAL, DRAFT, events, of_type

GATED = APPROVAL.replace(
    "    on_other: clarify\n", "    on_other: clarify\n    approvers: [alice, bob]\n"
)


def _agent(agent: Any, graph: str = APPROVAL) -> Path:
    path: Path = agent(graph, DRAFT)
    (path / "scripts" / "draft.sh").chmod(0o755)
    return path


def _waiting_run(graphrun: Any, agent: Any, graph: str = APPROVAL) -> str:
    res = graphrun("run", str(_agent(agent, graph)))
    assert res.code == 3, res.stderr
    return graphrun.last_run()  # type: ignore[no-any-return]


def test_a_paused_run_survives_its_process_and_approve_completes_it(graphrun, agent):
    run_id = _waiting_run(graphrun, agent)
    # The process that started the run has exited: the run waits in the log only.
    row = graphrun("runs", "--json").json_lines()[0]
    assert row["status"] == "waiting" and row["live"] is False  # type: ignore[index]
    res = graphrun("approve", run_id, "approve", "--as", "alice")
    assert res.code == 0, res.stderr
    assert res.stdout == "shipped v2.1 (approve)\n"
    assert "▸ recorded 'approve' from alice at node 'review' (seq 7)" in res.stderr
    evs = events(graphrun.db, run_id)
    types = [e["type"] for e in evs]
    assert types[5:8] == ["HumanInputRequested", "HumanInputReceived", "RunResumed"]
    assert types[-1] == "RunCompleted"
    got = evs[6]
    assert (got["by"], got["channel"], got["answer"]) == ("alice", "approve", "approve")
    assert got["question"] == "Ship v2.1?" and got["options"] == ["approve", "reject"]
    assert got["os_user"] and got["host"]


def test_answer_resumes_to_the_next_wait_then_to_the_end(graphrun, agent):
    run_id = _waiting_run(graphrun, agent)
    res = graphrun("approve", run_id, "--other", "not yet", "--as", "bob")
    assert res.code == 3
    assert f"▸ run {run_id} waits at input node 'clarify':" in res.stderr
    assert f"answer with: graphrun answer {run_id} <text> --as <you>" in res.stderr
    assert "default (an empty answer): v2.1 as is" in res.stderr
    res = graphrun("answer", run_id, "", "--as", "carol")
    assert res.code == 0, res.stderr
    assert res.stdout == "noted not yet / v2.1 as is\n"
    got = of_type(events(graphrun.db, run_id), "HumanInputReceived")
    assert [(g["by"], g["channel"]) for g in got] == [("bob", "approve"), ("carol", "answer")]


def test_racing_approvals_record_exactly_one(graphrun, agent):
    for _ in range(3):
        run_id = _waiting_run(graphrun, agent)
        procs = [
            graphrun.popen("approve", run_id, choice, "--as", who)
            for choice, who in (("approve", "alice"), ("reject", "bob"))
        ]
        results = [(p.wait(timeout=60), *p.communicate()) for p in procs]
        codes = sorted(code for code, _, _ in results)
        assert codes == [0, 2], results
        got = of_type(events(graphrun.db, run_id), "HumanInputReceived")
        assert len(got) == 1
        winner = got[0]["by"]
        (loser_err,) = [err for code, _, err in results if code == 2]
        assert f"node 'review' of run {run_id} was already answered by {winner}" in loser_err
        assert loser_err.count("\n") == 1 and "Traceback" not in loser_err


def _count(graphrun: Any, run_id: str) -> int:
    return len(events(graphrun.db, run_id))


def test_answers_that_cannot_be_taken_are_one_line_errors_and_change_nothing(graphrun, agent):
    waiting = _waiting_run(graphrun, agent)
    done = graphrun("run", str(_agent(agent)), "--answer", "review=approve")
    assert done.code == 0
    finished = graphrun.last_run()
    before = {r: _count(graphrun, r) for r in (waiting, finished)}
    cases = [
        (
            ("approve", finished, "approve", "--as", "alice"),
            f"error: node 'review' of run {finished} was already answered by "
            f"{getpass.getuser()} ('approve' via flag, seq 7); the run has completed\n",
        ),
        (
            ("approve", waiting, "approve", "--as", "alice", "--node", "reviwe"),
            f"error: run {waiting} (graph gate) has no node 'reviwe' (did you mean 'review'?)",
        ),
        (
            ("approve", waiting, "approve", "--as", "alice", "--node", "draft"),
            f"error: node 'draft' of run {waiting} is a script node, not approval",
        ),
        (
            ("answer", waiting, "text", "--as", "alice"),
            f"error: run {waiting} waits at approval node 'review', which graphrun answer "
            f"cannot answer (use graphrun approve {waiting} ...)",
        ),
        (
            ("approve", "01nosuchrun", "approve", "--as", "alice"),
            "error: no run '01nosuchrun'",
        ),
        (
            ("approve", waiting, "approve", "--as", " "),
            "error: --as was given an empty name",
        ),
    ]
    for args, message in cases:
        res = graphrun(*args)
        assert res.code == 2, (args, res.stderr)
        assert res.stderr.startswith(message), (args, res.stderr)
        assert res.stderr.count("\n") == 1, res.stderr
        assert res.stdout == ""
    assert {r: _count(graphrun, r) for r in (waiting, finished)} == before


def test_an_answer_to_a_run_that_waits_for_nothing(graphrun, agent):
    graph = """
    version: "1.0"
    name: slow
    start: work
    nodes:
      work:
        type: script
        script: scripts/work.sh
      done:
        type: end
        output: "{{initial_prompt}}"
    """
    ag = agent(graph, {"scripts/work.sh": "#!/bin/sh\nexit 3\n"})
    (ag / "scripts" / "work.sh").chmod(0o755)
    res = graphrun("run", str(ag))
    assert res.code == 1
    run_id = graphrun.last_run()
    before = _count(graphrun, run_id)
    res = graphrun("approve", run_id, "yes", "--as", "alice")
    assert res.code == 2
    assert res.stderr == f"error: run {run_id} has failed: nothing waits for an answer\n"
    assert _count(graphrun, run_id) == before


def test_approvers_refuse_anyone_else_on_every_channel(graphrun, agent):
    ag = _agent(agent, GATED)
    # --answer with a name that is not an approver: refused before it is recorded.
    res = graphrun("run", str(ag), "--answer", "review=approve", "--as", "mallory")
    assert res.code == 2
    run_id = graphrun.last_run()
    assert res.stderr.count("error: ") == 1
    assert (
        "error: 'mallory' may not answer approval node 'review' "
        "(approvers: alice, bob; pass --as NAME)" in res.stderr
    )
    assert f"answer with: graphrun approve {run_id} <approve|reject> --as <alice|bob>" in res.stderr
    evs = events(graphrun.db, run_id)
    assert evs[-1]["type"] == "HumanInputRequested"
    assert evs[-1]["approvers"] == ["alice", "bob"]
    assert not of_type(evs, "HumanInputReceived") and not of_type(evs, "RunFailed")
    # The approve command: refused, nothing appended.
    count = len(evs)
    res = graphrun("approve", run_id, "approve", "--as", "mallory")
    assert res.code == 2
    assert res.stderr == (
        "error: 'mallory' may not answer approval node 'review' (approvers: alice, bob; "
        "pass --as NAME with one of them to graphrun approve)\n"
    )
    assert _count(graphrun, run_id) == count
    # resume --answer as a non-approver: refused, and not even a RunResumed appended.
    res = graphrun("resume", run_id, "--answer", "review=approve", "--as", "mallory")
    assert res.code == 2
    assert "error: 'mallory' may not answer approval node 'review'" in res.stderr
    assert _count(graphrun, run_id) == count
    # An approver is accepted.
    res = graphrun("approve", run_id, "approve", "--as", "bob")
    assert res.code == 0, res.stderr
    (got,) = of_type(events(graphrun.db, run_id), "HumanInputReceived")
    assert got["by"] == "bob"


def test_runs_lists_what_waits_where_and_for_whom(graphrun, agent):
    gated = _waiting_run(graphrun, agent, GATED)
    free = _waiting_run(graphrun, agent)
    graphrun("run", str(_agent(agent)), "--answer", "review=approve")
    res = graphrun("runs", "--status", "waiting")
    assert res.code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == [
        "RUN", "GRAPH", "VERSION", "STATUS", "STARTED", "(UTC)", "EVENTS", "NODE", "WAITS",
        "FOR", "BY"
    ]  # fmt: skip
    assert len(lines) == 3
    by_id = {line.split()[0]: line for line in lines[1:]}
    assert "review  approval: alice, bob" in by_id[gated]
    assert "review  approval: anyone" in by_id[free]
    rows = graphrun("runs", "--status", "waiting", "--json").json_lines()
    waits = {r["run_id"]: r["waiting"] for r in rows}  # type: ignore[index]
    assert waits[gated]["approvers"] == ["alice", "bob"]
    assert waits[free] == {
        "node_id": "review",
        "kind": "approval",
        "question": "Ship v2.1?",
        "options": ["approve", "reject"],
        "default": None,
        "approvers": [],
    }


def test_cancel_a_waiting_run_then_answering_it_is_refused(graphrun, agent):
    run_id = _waiting_run(graphrun, agent)
    res = graphrun("cancel", run_id, "--as", "alice")
    assert res.code == 0, res.stderr
    res = graphrun("approve", run_id, "approve", "--as", "alice")
    assert res.code == 2
    assert res.stderr == f"error: run {run_id} has cancelled: nothing waits for an answer\n"


def test_resume_with_answer_answers_a_waiting_run(graphrun, agent):
    run_id = _waiting_run(graphrun, agent)
    res = graphrun("resume", run_id, "--answer", "review=reject", "--as", "dana")
    assert res.code == 0, res.stderr
    assert res.stdout == "dropped (reject)\n"
    (got,) = of_type(events(graphrun.db, run_id), "HumanInputReceived")
    assert (got["by"], got["channel"]) == ("dana", "flag")


def test_module_runs_without_the_console_script():
    out = subprocess.run(
        [sys.executable, "-m", "graphrun.cli", "approve", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--as USER" in out.stdout and "--node NODE" in out.stdout
