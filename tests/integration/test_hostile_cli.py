"""Hostile command lines and graph files through the real CLI: one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
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


def run_bytes(graphrun: Any, *args: bytes | str) -> tuple[int, str]:
    """Run graphrun with raw bytes arguments (as a shell passes them)."""
    proc = subprocess.run(
        [sys.executable, "-m", "graphrun.cli", *args],
        capture_output=True,
        env=graphrun.env(),
        cwd=graphrun.tmp_path,
        timeout=60,
    )
    return proc.returncode, proc.stderr.decode("utf-8", "replace")


def one_line(code: int, stderr: str) -> str:
    assert code == 2, stderr
    assert "Traceback" not in stderr and "internal error" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize(
    ("arg", "shown"),
    [
        (b"\xff\xfeticket", "argument 3 (\\xff\\xfeticket) is not valid UTF-8 (at character 0)"),
        (b"ok \xed\xa0\x80", "argument 3 (ok \\xed\\xa0\\x80) is not valid UTF-8 (at character 3)"),
    ],
)
def test_invalid_utf8_in_an_argument(graphrun: Any, agent: Any, arg: bytes, shown: str) -> None:
    root = agent(GRAPH)
    line = one_line(*run_bytes(graphrun, "run", str(root), arg))
    assert line == f"error: {shown}"
    assert not graphrun.db.exists()


def test_invalid_utf8_in_set_and_answer(graphrun: Any, agent: Any) -> None:
    root = agent(GRAPH)
    line = one_line(*run_bytes(graphrun, "run", str(root), "--set", b"v=\x80"))
    assert line == "error: argument 4 (v=\\x80) is not valid UTF-8 (at character 2)"
    line = one_line(*run_bytes(graphrun, "approve", "r1", b"ok\xc3", "--as", "bob"))
    assert line == "error: argument 3 (ok\\xc3) is not valid UTF-8 (at character 2)"


@pytest.mark.parametrize("depth", [65, 1_000, 60_000])
def test_set_json_nesting_is_bounded(graphrun: Any, agent: Any, depth: int) -> None:
    root = agent(GRAPH)
    value = "[" * depth + "]" * depth
    res = graphrun("run", str(root), "--set", f"v={value}")
    assert one_line(res.code, res.stderr) == "error: --set v: JSON nests deeper than 64 levels"
    assert not graphrun.db.exists() or graphrun("runs", "--json").stdout == ""


def test_set_json_within_the_limit_works(graphrun: Any, agent: Any) -> None:
    root = agent(GRAPH)
    value = "[" * 64 + "]" * 64
    res = graphrun("run", str(root), "--set", f"v={value}")
    assert res.code == 0, res.stderr
    assert res.stdout.strip() == value.replace("][", "], [")


def test_set_value_size_is_bounded(
    graphrun: Any, agent: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from graphrun.cli import main

    root = agent(GRAPH)
    big = "x" * (1024 * 1024 + 1)  # over what an OS passes in one argument: call main()
    monkeypatch.setenv("GRAPHRUN_DB", str(graphrun.db))
    with pytest.raises(SystemExit) as info:
        main(["run", str(root), "--set", f"v={big}"])
    assert info.value.code == 2
    assert capsys.readouterr().err == "error: --set v: the value is over 1,048,576 bytes\n"


def test_an_over_long_agent_path(graphrun: Any, agent: Any) -> None:
    res = graphrun("run", "a" * 300, "hi")
    line = one_line(res.code, res.stderr)
    assert line == f"error: path too long: {'a' * 60}… (300 characters)"
    res = graphrun("validate", str(graphrun.tmp_path / ("b" * 300) / "graph.yaml"))
    assert one_line(res.code, res.stderr).startswith("error: path too long: ")


def test_a_graph_field_that_becomes_an_over_long_path(graphrun: Any, agent: Any) -> None:
    name = "s" * 300
    root = agent(
        GRAPH.replace("start: done", "start: a") + f"  a:\n    type: script\n"
        f"    script: {name}.py\n    next: done\n"
    )
    res = graphrun("run", str(root))
    assert one_line(res.code, res.stderr).startswith("error: path too long: ")


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        ("initial_state:\n  v: !!binary aGVsbG8=\n", "!!binary values are not allowed"),
        ("initial_state:\n  v: !!timestamp 2026-11-20\n", "!!timestamp values are not allowed"),
        ("initial_state:\n  v: !!int abc\n", "'abc' is not a valid !!int value"),
        ('initial_state:\n  v: "a\\0b"\n', "a string holds a NUL character"),
        ("initial_state:\n  v: " + "[" * 500 + "]" * 500 + "\n", "nest deeper than 64 levels"),
        (
            "initial_state:\n  v: " + "[" * 30_000 + "]" * 30_000 + "\n",
            "nest deeper than 64 levels",
        ),
    ],
)
@pytest.mark.parametrize("command", ["validate", "run"])
def test_hostile_graph_files(
    graphrun: Any, agent: Any, command: str, tail: str, expected: str
) -> None:
    root = agent(GRAPH + tail)
    res = graphrun(command, str(root))
    assert res.code == 2, res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr
    assert expected in res.stderr
    assert graphrun("runs", "--json").stdout == "" if graphrun.db.exists() else True
