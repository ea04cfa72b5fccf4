"""``graphrun audit``: human decisions of a run and its child runs, the hash chain;
``graphrun replay`` of runs with human answers."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from tests.integration.test_human_answers import GATED, _agent, _waiting_run
from tests.integration.test_human_nodes import events, of_type


def _decided_run(graphrun: Any, agent: Any) -> str:
    """A run with two decisions: an approval (approve command) and an input (answer)."""
    run_id = _waiting_run(graphrun, agent, GATED)
    assert graphrun("approve", run_id, "--other", "split the release", "--as", "alice").code == 3
    res = graphrun("answer", run_id, "ship docs first", "--as", "carol")
    assert res.code == 0, res.stderr
    return run_id


def test_audit_table_lists_every_decision(graphrun, agent):
    run_id = _decided_run(graphrun, agent)
    res = graphrun("audit", run_id)
    assert res.code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == [
        "WHEN", "(UTC)", "NODE", "QUESTION", "ANSWER", "BY", "IDENTITY", "VIA", "RUN"
    ]  # fmt: skip
    assert len(lines) == 3
    import getpass
    import socket

    me = f"({getpass.getuser()}@{socket.gethostname()})"
    assert "review   Ship v2.1?" in lines[1]
    assert f"split the release  alice {me}" in lines[1]
    assert lines[1].rstrip().endswith(f"approve  {run_id}")
    assert "clarify  What should change in v2.1 (split the release)?" in lines[2]
    assert f"ship docs first    carol {me}" in lines[2]
    assert lines[2].rstrip().endswith(f"answer   {run_id}")


def test_audit_json_for_tools(graphrun, agent):
    run_id = _decided_run(graphrun, agent)
    res = graphrun("audit", run_id, "--json")
    assert res.code == 0, res.stderr
    report = res.json()
    assert report["run_id"] == run_id  # type: ignore[index]
    first, second = report["decisions"]  # type: ignore[index]
    assert {k: first[k] for k in ("node_id", "question", "options", "answer", "by", "via")} == {
        "node_id": "review",
        "question": "Ship v2.1?",
        "options": ["approve", "reject"],
        "answer": "split the release",
        "by": "alice",
        "via": "approve",
    }
    assert first["requested_at"] <= first["ts"] <= second["ts"]
    assert first["os_user"] and first["host"] and first["depth"] == 0
    assert (second["node_id"], second["by"], second["via"]) == ("clarify", "carol", "answer")
    assert second["used"] == "ship docs first"


def test_verify_passes_then_names_the_first_tampered_seq(graphrun, agent):
    run_id = _decided_run(graphrun, agent)
    res = graphrun("audit", run_id, "--verify")
    assert res.code == 0, res.stderr
    total = len(events(graphrun.db, run_id))
    assert f"ok: run {run_id}: {total} events verify" in res.stderr
    # Someone rewrites who approved.
    (received,) = [e for e in of_type(events(graphrun.db, run_id), "HumanInputReceived")][:1]
    forged = dict(received, by="bob")
    with sqlite3.connect(graphrun.db) as conn:
        conn.execute(
            "UPDATE events SET body = ? "
            "WHERE id = (SELECT id FROM run_events WHERE run_id = ? AND seq = ?)",
            (json.dumps(forged), run_id, received["seq"]),
        )
    res = graphrun("audit", run_id, "--verify")
    assert res.code == 1
    assert f"BROKEN: run {run_id}: first bad seq {received['seq']}" in res.stderr
    report = graphrun("audit", run_id, "--verify", "--json")
    assert report.code == 1
    (check,) = report.json()["verify"]  # type: ignore[index]
    assert (check["ok"], check["seq"]) == (False, received["seq"])


def test_a_run_without_decisions(graphrun, agent):
    res = graphrun("run", str(_agent(agent)), "--answer", "review=approve")
    assert res.code == 0
    run_id = graphrun.last_run()
    (received,) = of_type(events(graphrun.db, run_id), "HumanInputReceived")
    assert received["channel"] == "flag"
    other = graphrun(
        "run",
        str(
            agent(
                """
                version: "1.0"
                name: plain
                start: done
                nodes:
                  done:
                    type: end
                    output: "hi"
                """
            )
        ),
    )
    assert other.code == 0
    res = graphrun("audit", graphrun.last_run())
    assert res.code == 0
    assert res.stdout == ""
    assert res.stderr == f"no human decisions in run {graphrun.last_run()} or its child runs\n"


def test_replay_reproduces_a_run_with_answers_without_asking(graphrun, agent):
    run_id = _decided_run(graphrun, agent)
    res = graphrun("replay", run_id)  # no terminal, no --answer
    assert res.code == 0, res.stderr
    assert f"ok: run {run_id}" in res.stderr
    assert "waits" not in res.stderr


def test_audit_includes_child_runs_and_approve_reaches_a_waiting_child(graphrun, agent, tmp_path):
    agents = tmp_path / "agents"
    agents.mkdir()
    child = _agent(agent, GATED.replace("name: gate", "name: child")).rename(agents / "child")
    assert child.is_dir()
    parent = agent(
        """
        version: "1.0"
        name: parent
        start: sub
        nodes:
          sub:
            type: agent
            agent: child
            prompt: "release"
            state_updates:
              got: "{{output}}"
            next: fin
          fin:
            type: end
            output: "parent: {{got}}"
        """
    )
    env = {"GRAPHRUN_AGENTS_DIR": str(agents)}
    res = graphrun("run", str(parent), **env)
    assert res.code == 3, res.stderr
    rows = graphrun("runs", "--json").json_lines()
    parent_id = next(r["run_id"] for r in rows if r["graph_name"] == "parent")  # type: ignore[index]
    child_id = next(r["run_id"] for r in rows if r["graph_name"] == "child")  # type: ignore[index]
    assert f"answer with: graphrun approve {child_id} " in res.stderr
    # Answering the parent reaches the one child run that waits.
    res = graphrun("approve", parent_id, "approve", "--as", "bob", **env)
    assert res.code == 0, res.stderr
    assert res.stdout == "parent: shipped v2.1 (approve)\n"
    report = graphrun("audit", parent_id, "--json", "--verify").json()
    (decision,) = report["decisions"]  # type: ignore[index]
    assert (decision["run_id"], decision["depth"], decision["by"]) == (child_id, 1, "bob")
    assert [c["run_id"] for c in report["verify"]] == [parent_id, child_id]  # type: ignore[index]
    table = graphrun("audit", parent_id).stdout.splitlines()
    assert table[1].split()[2] == "review" and table[1].rstrip().endswith(child_id)
