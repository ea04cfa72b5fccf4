"""Choices must be options (or their numbers), free-form text goes through
``--other``, inputs are validated before they are recorded, ``@last`` names the
latest run, and ``resume --answer`` leaves out what the log already holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.test_human_nodes import APPROVAL, DRAFT, events, of_type

# A gate that loops back to itself through a clarifying input: the approval node
# is visited twice when the first answer is free-form.
LOOP = (
    APPROVAL.replace("    next: noted\n", "    next: back\n", 1)
    .replace(
        '    output: "shipped {{title}} ({{decision}})"',
        '    output: "shipped {{title}} ({{decision}}; {{note}})"',
    )
    .replace("  noted:\n", "  back:\n    type: script\n    script: scripts/back.sh\n  noted:\n")
)
BACK = {"scripts/back.sh": '#!/bin/sh\necho \'{"_next": "review"}\'\n'}


def _agent(agent: Any, graph: str = APPROVAL) -> Path:
    path: Path = agent(graph, {**DRAFT, **BACK})
    for script in ("draft.sh", "back.sh"):
        (path / "scripts" / script).chmod(0o755)
    return path


def _waiting(graphrun: Any, agent: Any, graph: str = APPROVAL) -> str:
    res = graphrun("run", str(_agent(agent, graph)))
    assert res.code == 3, res.stderr
    return graphrun.last_run()  # type: ignore[no-any-return]


def test_a_misspelt_choice_is_refused_names_the_options_and_appends_nothing(graphrun, agent):
    run_id = _waiting(graphrun, agent)
    before = events(graphrun.db, run_id)
    res = graphrun("approve", run_id, "aprove", "--as", "alice")
    assert res.code == 2
    assert res.stdout == ""
    assert res.stderr == (
        "error: 'aprove' is not an option of approval node 'review' (options: 1. approve, "
        "2. reject) (give an option or its number; free-form text goes with --other TEXT)\n"
    )
    assert events(graphrun.db, run_id) == before
    # Still waiting: a correct choice goes through.
    res = graphrun("approve", run_id, "approve", "--as", "alice")
    assert res.code == 0, res.stderr


def test_a_choice_by_number_picks_that_option_and_records_it(graphrun, agent):
    run_id = _waiting(graphrun, agent)
    res = graphrun("approve", run_id, "2", "--as", "alice")
    assert res.code == 0, res.stderr
    assert res.stdout == "dropped (reject)\n"
    (got,) = of_type(events(graphrun.db, run_id), "HumanInputReceived")
    assert got["answer"] == "reject"
    assert graphrun("approve", _waiting(graphrun, agent), "3", "--as", "a").code == 2


def test_other_reaches_on_other_and_an_option_given_as_other_is_refused(graphrun, agent):
    run_id = _waiting(graphrun, agent)
    res = graphrun("approve", run_id, "--other", "approve", "--as", "alice")
    assert res.code == 2
    assert "error: --other 'approve' is an option of approval node 'review'" in res.stderr
    res = graphrun("approve", run_id, "--other", "needs a changelog", "--as", "alice")
    assert res.code == 3, res.stderr
    assert f"▸ run {run_id} waits at input node 'clarify':" in res.stderr
    (got,) = of_type(events(graphrun.db, run_id), "HumanInputReceived")
    assert (got["answer"], got["channel"]) == ("needs a changelog", "approve")


def test_approve_takes_a_choice_or_other_not_both(graphrun, agent):
    run_id = _waiting(graphrun, agent)
    for args in (("approve", run_id, "--as", "a"), ("approve", run_id, "1", "--other", "x")):
        res = graphrun(*args, "--as", "a")
        assert res.code == 2
        assert res.stderr.startswith("error: approve takes a CHOICE or --other TEXT")


def test_an_invalid_answer_is_refused_and_the_run_keeps_waiting(graphrun, agent):
    run_id = _waiting(graphrun, agent)
    assert graphrun("approve", run_id, "--other", "hmm", "--as", "bob").code == 3
    before = events(graphrun.db, run_id)
    res = graphrun("answer", run_id, "ok", "--as", "carol")
    assert res.code == 2
    assert res.stderr == (
        "error: answer to input node 'clarify' fails its validation 'len(input) >= 5' "
        "(got 2 characters) (give an answer that satisfies it; the run keeps waiting)\n"
    )
    assert events(graphrun.db, run_id) == before
    row = graphrun("runs", "--json").json_lines()[0]
    assert row["status"] == "waiting" and row["waiting_node"] == "clarify"  # type: ignore[index]
    res = graphrun("answer", run_id, "fine then", "--as", "carol")
    assert res.code == 0, res.stderr
    assert res.stdout == "noted hmm / fine then\n"


def test_answer_flags_follow_the_same_rules_before_the_run_starts(graphrun, agent):
    path = _agent(agent)
    res = graphrun("run", str(path), "--answer", "review=aprove")
    assert res.code == 2
    assert res.stderr.startswith(
        "error: --answer review=aprove: 'aprove' is not an option of approval node 'review'"
    )
    assert not graphrun.db.exists() or events(graphrun.db) == []
    res = graphrun("run", str(path), "--answer", "review=1")
    assert res.code == 0, res.stderr
    assert res.stdout == "shipped v2.1 (approve)\n"


def test_answer_and_other_are_used_in_the_order_given(graphrun, agent):
    path = _agent(agent, LOOP)
    res = graphrun(
        "run",
        str(path),
        "--other",
        "review=needs notes",
        "--answer",
        "clarify=notes added",
        "--answer",
        "review=approve",
    )
    assert res.code == 0, res.stderr
    assert res.stdout == "shipped v2.1 (approve; notes added)\n"


def test_run_prints_its_id_and_at_last_names_the_latest_run(graphrun, agent):
    res = graphrun("run", str(_agent(agent)), "--answer", "review=approve")
    assert res.code == 0
    run_id = graphrun.last_run()
    assert res.stderr.endswith(f"▸ run {run_id} completed\n")
    shown = graphrun("show", "@last", "--json")
    assert shown.code == 0, shown.stderr
    assert run_id in shown.stdout
    empty = graphrun("show", "@last", "--db", str(graphrun.tmp_path / "empty.db"))
    assert empty.code == 2
    assert "error: " in empty.stderr and "Traceback" not in empty.stderr


def test_narration_after_approve_names_the_answered_node(graphrun, agent):
    run_id = _waiting(graphrun, agent)
    res = graphrun("approve", run_id, "approve", "--as", "alice")
    assert "▸ graph: gate resumed (at: review)\n" in res.stderr


def test_resume_with_the_original_answers_skips_those_the_log_holds(graphrun, agent):
    path = _agent(agent, LOOP)
    # Started with answers for the first visit only: the run waits at the second.
    res = graphrun(
        "run", str(path), "--other", "review=needs notes", "--answer", "clarify=notes added"
    )
    assert res.code == 3, res.stderr
    run_id = graphrun.last_run()
    # The original flags again: on their own they answer nothing new.
    again = ("--other", "review=needs notes", "--answer", "clarify=notes added")
    res = graphrun("resume", run_id, *again)
    assert res.code == 2
    assert res.stderr.startswith(
        "error: --answer review=…: the log already holds 1 answer(s) for node 'review' "
        "('needs notes'); all of them are for earlier visits; visit 2 still needs an answer"
    )
    assert len(of_type(events(graphrun.db, run_id), "HumanInputReceived")) == 2
    # The original flags plus the next answer: only the new one is used.
    res = graphrun("resume", run_id, *again, "--answer", "review=approve")
    assert res.code == 0, res.stderr
    assert res.stdout == "shipped v2.1 (approve; notes added)\n"
    got = of_type(events(graphrun.db, run_id), "HumanInputReceived")
    assert [(g["node_id"], g["visit"], g["answer"]) for g in got] == [
        ("review", 1, "needs notes"),
        ("clarify", 1, "notes added"),
        ("review", 2, "approve"),
    ]


def test_resume_with_only_the_new_answer(graphrun, agent):
    path = _agent(agent, LOOP)
    res = graphrun("run", str(path), "--other", "review=x y", "--answer", "clarify=notes added")
    assert res.code == 3, res.stderr
    res = graphrun("resume", "@last", "--answer", "review=2")
    assert res.code == 0, res.stderr
    assert res.stdout == "dropped (reject)\n"
