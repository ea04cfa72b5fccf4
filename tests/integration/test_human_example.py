"""The ``examples/release-checklist`` agent and its recorded run in ``replays/``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import ROOT
from tests.integration.test_human_nodes import events, of_type

EXAMPLE = ROOT / "examples" / "release-checklist"
RECORDED = ROOT / "replays" / "release-checklist.run.jsonl"

CLARIFY = "Not yet: the config rename needs upgrade notes"


def test_clarify_loops_back_to_the_gate_then_approve(graphrun):
    res = graphrun(
        "run",
        str(EXAMPLE),
        "--as",
        "alice",
        "--other",
        f"review={CLARIFY}",
        "--answer",
        "clarify=add upgrade notes for cache.dir -> cache.path",
        "--answer",
        "review=approve",
    )
    assert res.code == 0, res.stderr
    assert res.stdout == (
        "Release 2.4.0 approved.\n"
        "[x] VERSION is a semantic version (2.4.0)\n"
        "[x] CHANGELOG.md has a section for 2.4.0\n"
        "[x] the section is dated (2026-11-20)\n"
        "[x] 2.4.0 is newer than the last release (2.3.1)\n"
        "[ ] 1 breaking change(s) come with upgrade notes\n"
        "[ ] reviewer asked: add upgrade notes for cache.dir -> cache.path\n"
    )
    evs = events(graphrun.db)
    asked = of_type(evs, "HumanInputRequested")
    assert [(a["node_id"], a["visit"]) for a in asked] == [
        ("review", 1),
        ("clarify", 1),
        ("review", 2),
    ]
    assert asked[0]["question"].startswith(
        "Release 2.4.0 (after 2.3.1): 5 changes, 1 breaking, 1 open checklist item(s).\n"
    )
    assert "2 open checklist item(s)" in asked[2]["question"]
    assert asked[1]["question"] == (
        f'You answered "{CLARIFY}". What must change before 2.4.0 ships? '
        '(start with "hold" to postpone)'
    )
    assert asked[0]["approvers"] == ["alice", "bob"]
    got = of_type(evs, "HumanInputReceived")
    assert {g["by"] for g in got} == {"alice"}


def test_waiting_gate_answered_later_by_an_approver_and_hold(graphrun):
    res = graphrun("run", str(EXAMPLE))
    assert res.code == 3
    run_id = graphrun.last_run()
    assert f"answer with: graphrun approve {run_id} <approve|reject> --as <alice|bob>" in res.stderr
    assert graphrun("approve", run_id, "approve", "--as", "mallory").code == 2
    res = graphrun("approve", run_id, "--other", "wait for the docs", "--as", "bob")
    assert res.code == 3
    res = graphrun("answer", run_id, "hold until the docs are out", "--as", "bob")
    assert res.code == 0, res.stderr
    assert res.stdout == "Release 2.4.0 on hold: hold until the docs are out\n"
    res = graphrun("audit", run_id)
    assert [line.split()[2] for line in res.stdout.splitlines()[1:]] == ["review", "clarify"]


def test_reject(graphrun):
    res = graphrun("run", str(EXAMPLE), "--as", "bob", "--answer", "review=reject")
    assert res.code == 0, res.stderr
    assert res.stdout == "Release 2.4.0 rejected.\n"


def test_a_version_without_a_changelog_section_is_not_reviewed(graphrun, tmp_path):
    copy = Path(shutil.copytree(EXAMPLE, tmp_path / "release"))
    (copy / "VERSION").write_text("2.5.0\n", encoding="utf-8")
    res = graphrun("run", str(copy))
    assert res.code == 0, res.stderr
    assert res.stdout.startswith("Release not ready for review: ")
    assert "CHANGELOG.md has no section for version 2.5.0" in res.stdout
    assert not of_type(events(graphrun.db), "HumanInputRequested")


def test_the_recorded_run_replays_offline(graphrun):
    header = json.loads(RECORDED.read_text(encoding="utf-8").splitlines()[0])
    (run_id,) = header["runs"]
    assert header["agent_dirs"] == {run_id: "../examples/release-checklist"}
    lines = RECORDED.read_text(encoding="utf-8").splitlines()[1:]
    recorded = [json.loads(line)["event"] for line in lines if not line.startswith('{"trailer"')]
    received = [e for e in recorded if e["type"] == "HumanInputReceived"]
    assert [(e["node_id"], e["by"], e["channel"]) for e in received] == [
        ("review", "alice", "flag"),
        ("clarify", "alice", "flag"),
        ("review", "alice", "flag"),
    ]
    res = graphrun("test", str(RECORDED))
    assert res.code == 0, res.stdout + res.stderr
    assert "1 passed, 0 failed" in res.stdout
