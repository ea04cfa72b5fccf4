"""A damaged byte in one run never takes the others down: listings skip and name
the run (``--strict`` fails), commands on that run name it and its seq, exit 2."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

GRAPH = """\
name: echo
version: "1.0"
start: done
nodes:
  done:
    type: end
    output: "{{v}}"
"""


def two_runs(graphrun: Any, agent: Any) -> tuple[str, str]:
    """Two completed runs, the first one's ``RunStarted`` then made not UTF-8 (one
    byte, 0xDF, as a flipped bit leaves it)."""
    root = agent(GRAPH)
    assert graphrun("run", str(root), "--set", "v=first").code == 0
    damaged = graphrun.last_run()
    assert graphrun("run", str(root), "--set", "v=second").code == 0
    sound = graphrun.last_run()
    conn = sqlite3.connect(graphrun.db, isolation_level=None)
    changed = conn.execute(
        'UPDATE events SET body = replace(body, \'"graph_name":"echo"\', '
        "'\"graph_name\":\"' || CAST(X'DF' AS TEXT) || 'cho\"') WHERE id = (1 << 32) | 1"
    ).rowcount
    conn.close()
    assert changed == 1
    return damaged, sound


def test_runs_skips_and_names_the_damaged_run(graphrun: Any, agent: Any) -> None:
    damaged, sound = two_runs(graphrun, agent)
    for args in (("runs",), ("runs", "--json"), ("runs", "--usage")):
        res = graphrun(*args)
        assert res.code == 0, res.stderr
        assert sound in res.stdout and damaged not in res.stdout
        assert res.stderr == (
            f"warning: skipped a damaged run: run {damaged}: event seq 1 in {graphrun.db} "
            f"does not decode (not valid UTF-8) (`graphrun audit {damaged} --verify` "
            "checks the whole run)\n"
        )
    res = graphrun("runs", "--strict")
    assert res.code == 2
    assert res.stderr.startswith(f"error: run {damaged}: event seq 1 in ")
    assert graphrun("runs", "--strict", "--json").code == 2


@pytest.mark.parametrize(
    "command",
    [
        ["show", "R"],
        ["show", "R", "--json"],
        ["events", "R"],
        ["export", "R", "-o", "out.jsonl"],
        ["audit", "R"],
        ["logs", "R"],
        ["report", "R", "-o", "r.html"],
        ["diff", "R", "S"],
        ["tail", "R"],
    ],
)
def test_commands_on_the_damaged_run_name_it_and_its_seq(
    graphrun: Any, agent: Any, command: list[str]
) -> None:
    damaged, sound = two_runs(graphrun, agent)
    res = graphrun(*[{"R": damaged, "S": sound}.get(a, a) for a in command])
    assert res.code == 2, res.stderr
    assert res.stderr.startswith(f"error: run {damaged}: event seq 1 in "), res.stderr
    assert "internal error" not in res.stderr and len(res.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    "command",
    [["audit", "R", "--verify"], ["replay", "R"], ["resume", "R"], ["fork", "R", "--at", "1"]],
)
def test_checking_commands_name_the_seq(graphrun: Any, agent: Any, command: list[str]) -> None:
    damaged, _sound = two_runs(graphrun, agent)
    res = graphrun(*[damaged if a == "R" else a for a in command])
    assert res.code in (1, 2), res.stderr
    assert "seq 1" in res.stdout + res.stderr
    assert "internal error" not in res.stderr


def test_a_runs_row_that_is_not_text(graphrun: Any, agent: Any) -> None:
    damaged, sound = two_runs(graphrun, agent)
    conn = sqlite3.connect(graphrun.db, isolation_level=None)
    conn.execute("UPDATE events SET body = replace(body, X'DF', 'e')")  # mend the event
    conn.execute(
        "UPDATE run_heads SET started_by = CAST(X'FF66' AS TEXT), status = 7 WHERE run_id = ?",
        (damaged,),
    )
    conn.close()
    res = graphrun("runs")
    assert res.code == 0, res.stderr
    assert sound in res.stdout and damaged not in res.stdout
    assert res.stderr.startswith(f"warning: skipped a damaged run: run {damaged}: ")
    res = graphrun("show", damaged)
    assert res.code == 2 and res.stderr.startswith(f"error: run {damaged}: "), res.stderr


@pytest.mark.parametrize("value", ['"\\ud800"', '["\\udfff"]', '{"a": "x\\udc00"}'])
def test_set_with_a_lone_surrogate(graphrun: Any, agent: Any, value: str) -> None:
    root = agent(GRAPH)
    res = graphrun("run", str(root), "--set", f"k={value}")
    assert res.code == 2, res.stderr
    assert res.stderr == (
        "error: --set k: the JSON value holds a lone surrogate (a \\uD800-\\uDFFF escape "
        "without its pair), which is not text\n"
    )
    assert not graphrun.db.exists() or graphrun("runs", "--json").stdout == ""
