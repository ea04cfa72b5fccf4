"""``approval`` and ``input`` nodes as the spec says, answered with ``--answer``."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from graphrun.eventstore.codec import unpack_body

APPROVAL = """
version: "1.0"
name: gate
start: draft
nodes:
  draft:
    type: script
    script: scripts/draft.sh
    next: review
  review:
    type: approval
    question: "Ship {{title}}?"
    options: [approve, reject]
    routes: {approve: shipped, reject: dropped}
    on_other: clarify
    state_updates:
      decision: "{{choice}}"
  clarify:
    type: input
    question: "What should change in {{title}} ({{decision}})?"
    default: "{{title}} as is"
    validation: "len(input) >= 5"
    state_updates:
      note: "{{input}}"
    next: noted
  noted:
    type: end
    output: "noted {{decision}} / {{note}}"
  shipped:
    type: end
    output: "shipped {{title}} ({{decision}})"
  dropped:
    type: end
    output: "dropped ({{decision}})"
"""

DRAFT = {"scripts/draft.sh": '#!/bin/sh\necho \'{"title": "v2.1"}\'\n'}


def _agent(agent: Any, graph: str = APPROVAL) -> Path:
    path: Path = agent(graph, DRAFT)
    (path / "scripts" / "draft.sh").chmod(0o755)
    return path


def events(db: Path, run_id: str | None = None) -> list[dict[str, Any]]:
    """The stored events (decoded bodies with their envelope), oldest first."""
    with sqlite3.connect(db) as conn:
        sql = "SELECT run_id, seq, ts, body FROM run_events"
        args: tuple[str, ...] = ()
        if run_id:
            sql += " WHERE run_id = ?"
            args = (run_id,)
        rows = conn.execute(sql + " ORDER BY run_id, seq", args).fetchall()
    return [
        json.loads(unpack_body(body)) | {"run_id": rid, "seq": seq, "ts": ts}
        for rid, seq, ts, body in rows
    ]


def of_type(evs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in evs if e["type"] == name]


def test_an_option_routes_through_routes_and_is_recorded_with_identity(graphrun, agent):
    ag = _agent(agent)
    res = graphrun("run", str(ag), "--answer", "review=approve", "--as", "alice")
    assert res.code == 0, res.stderr
    assert res.stdout == "shipped v2.1 (approve)\n"
    evs = events(graphrun.db)
    (asked,) = of_type(evs, "HumanInputRequested")
    (got,) = of_type(evs, "HumanInputReceived")
    assert asked["question"] == "Ship v2.1?"
    assert asked["options"] == ["approve", "reject"]
    assert got["answer"] == "approve"
    assert got["by"] == "alice"
    assert got["channel"] == "flag"
    assert got["question"] == "Ship v2.1?"
    assert got["options"] == ["approve", "reject"]
    assert got["os_user"] and got["host"]
    assert got["ts"] > 0
    assert got["seq"] == asked["seq"] + 1


def test_the_os_user_answers_when_no_name_is_claimed(graphrun, agent):
    import getpass

    ag = _agent(agent)
    res = graphrun("run", str(ag), "--answer", "review=reject")
    assert res.code == 0, res.stderr
    assert res.stdout == "dropped (reject)\n"
    (got,) = of_type(events(graphrun.db), "HumanInputReceived")
    assert got["by"] == got["os_user"] == getpass.getuser()


def test_an_option_matches_regardless_of_case(graphrun, agent):
    res = graphrun("run", str(_agent(agent)), "--answer", "review=APPROVE")
    assert res.code == 0, res.stderr
    assert res.stdout == "shipped v2.1 (approve)\n"


def test_free_form_answer_goes_to_on_other_with_its_text_in_choice(graphrun, agent):
    res = graphrun(
        "run",
        str(_agent(agent)),
        "--other",
        "review=needs a changelog entry",
        "--answer",
        "clarify=add the entry",
    )
    assert res.code == 0, res.stderr
    assert res.stdout == "noted needs a changelog entry / add the entry\n"
    evs = events(graphrun.db)
    asked = of_type(evs, "HumanInputRequested")
    # The input's question and default are templated against the state.
    assert asked[1]["question"] == "What should change in v2.1 (needs a changelog entry)?"
    assert asked[1]["default"] == "v2.1 as is"


def test_empty_input_takes_the_templated_default_which_is_not_validated(graphrun, agent):
    graph = APPROVAL.replace('validation: "len(input) >= 5"', 'validation: "len(input) > 40"')
    res = graphrun("run", str(_agent(agent, graph)), "--other", "review=?", "--answer", "clarify=")
    assert res.code == 0, res.stderr
    assert res.stdout == "noted ? / v2.1 as is\n"
    got = of_type(events(graphrun.db), "HumanInputReceived")
    assert got[1]["answer"] == ""  # recorded as given; the graph took the default


def test_an_answer_failing_validation_is_refused_before_the_run_starts(graphrun, agent):
    res = graphrun("run", str(_agent(agent)), "--other", "review=hmm", "--answer", "clarify=ok")
    assert res.code == 2
    assert res.stdout == ""
    assert res.stderr == (
        "error: --answer clarify=ok: answer to input node 'clarify' fails its validation "
        "'len(input) >= 5' (got 2 characters) (give an answer that satisfies it; "
        "the run keeps waiting)\n"
    )
    assert not graphrun.db.exists() or events(graphrun.db) == []


def test_validation_operators(graphrun, agent):
    cases = [
        ("len(input) == 3", "abc", 0),
        ("len(input) == 3", "abcd", 2),
        ("len(input) < 3", "abc", 2),
        ("len(input)<=3", "abc", 0),
        ("len(input) > 0", "x", 0),
        ("len(input) > 0", "", 0),  # empty takes the default, not validated
    ]
    for rule, text, code in cases:
        graph = APPROVAL.replace('"len(input) >= 5"', json.dumps(rule))
        ag = _agent(agent, graph)
        res = graphrun("run", str(ag), "--other", "review=x", "--answer", f"clarify={text}")
        assert res.code == code, (rule, text, res.stderr)


def test_validation_outside_the_grammar_is_an_invalid_graph(graphrun, agent):
    graph = APPROVAL.replace('"len(input) >= 5"', "\"input != ''\"")
    res = graphrun("run", str(_agent(agent, graph)), "--other", "review=x")
    assert res.code == 2
    assert "len(input) <op> <integer>" in res.stderr
    assert "Traceback" not in res.stderr


def test_scoped_choice_and_input_do_not_leak_into_later_nodes(graphrun, agent):
    graph = APPROVAL.replace(
        'output: "noted {{decision}} / {{note}}"', 'output: "noted {{choice}} {{input}}"'
    )
    res = graphrun(
        "run", str(_agent(agent, graph)), "--other", "review=?", "--answer", "clarify=fine."
    )
    assert res.code == 1
    assert "node 'noted': {{choice}} in noted.output: 'choice' is not in state" in res.stderr
    evs = events(graphrun.db)
    final = of_type(evs, "NodeCompleted")
    updates = [e.get("updates", {}) for e in final]
    assert all("choice" not in u and "input" not in u for u in updates)


def test_a_node_visited_twice_takes_the_next_answer(graphrun, agent):
    graph = """
    version: "1.0"
    name: loop
    start: ask
    nodes:
      ask:
        type: input
        question: "Round {{round}}: name?"
        state_updates:
          last: "{{input}}"
        next: count
      count:
        type: script
        script: scripts/count.py
      done:
        type: end
        output: "{{names}}"
    initial_state:
      round: 1
      names: ""
    """
    count = """
    import json, os
    s = json.loads(os.environ["GRAPH_STATE"])
    names = (s["names"] + " " + s["last"]).strip()
    nxt = "done" if s["round"] >= 2 else "ask"
    print(json.dumps({"names": names, "round": s["round"] + 1, "_next": nxt}))
    """
    ag = agent(graph, {"scripts/count.py": count})
    res = graphrun("run", str(ag), "--answer", "ask=ada", "--answer", "ask=bob")
    assert res.code == 0, res.stderr
    assert res.stdout == "ada bob\n"
    got = of_type(events(graphrun.db), "HumanInputReceived")
    assert [(g["answer"], g["visit"], g["question"]) for g in got] == [
        ("ada", 1, "Round 1: name?"),
        ("bob", 2, "Round 2: name?"),
    ]


def test_without_a_terminal_or_answer_the_run_waits_and_says_how_to_answer(graphrun, agent):
    ag = _agent(agent)
    res = graphrun("run", str(ag), "--db", str(graphrun.db))
    assert res.code == 3
    assert res.stdout == ""
    run_id = graphrun.last_run()
    assert f"▸ run {run_id} waits at approval node 'review':" in res.stderr
    assert "  Ship v2.1?" in res.stderr
    command = f"graphrun approve {run_id} <approve|reject> --as <you> --db {graphrun.db}"
    assert f"  answer with: {command}\n" in res.stderr
    evs = events(graphrun.db)
    assert evs[-1]["type"] == "HumanInputRequested"
    assert not of_type(evs, "HumanInputReceived")


def test_waiting_as_json(graphrun, agent):
    res = graphrun("run", str(_agent(agent)), "--json")
    assert res.code == 3
    data = res.json()
    assert data["status"] == "waiting"  # type: ignore[index]
    assert data["waiting"] == {  # type: ignore[index]
        "node_id": "review",
        "kind": "approval",
        "question": "Ship v2.1?",
        "options": ["approve", "reject"],
        "default": None,
        "approvers": [],
    }
    assert data["answer_with"].startswith(f"graphrun approve {data['run_id']} ")  # type: ignore[index]
