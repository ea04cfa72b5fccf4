"""Live progress: on a terminal, a slow node shows its elapsed time; piped, nothing extra."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pexpect

from tests.conftest import GraphrunCli

SLOW = """
name: slow
version: "1.0"
start: work
nodes:
  work:
    type: script
    script: scripts/work.sh
    next: done
  done: {type: end, output: "ok"}
"""
WORK_SH = """
    #!/usr/bin/env bash
    sleep 2.5
    echo '{}'
"""


def _agent(agent) -> Path:  # type: ignore[no-untyped-def]
    root = agent(SLOW, {"scripts/work.sh": WORK_SH})
    os.chmod(root / "scripts" / "work.sh", 0o755)
    return root


def test_a_pending_script_shows_elapsed_time_on_a_terminal(graphrun: GraphrunCli, agent, tmp_path):
    root = _agent(agent)
    env = dict(graphrun.env(), TERM="xterm")
    env.pop("NO_COLOR", None)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "graphrun.cli", "run", str(root), "go"],
        env=env,
        cwd=str(tmp_path),
        encoding="utf-8",
        timeout=30,
        dimensions=(30, 120),
    )
    child.expect(r"work \(script\)")  # the narration line
    child.expect(r"0:00:02")  # the spinner's elapsed time, ticking
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_piped_narration_has_no_progress_output(graphrun: GraphrunCli, agent):
    res = graphrun("run", str(_agent(agent)), "go")
    assert res.code == 0, res.stderr
    assert "\x1b" not in res.stderr and "0:00:0" not in res.stderr
    assert res.stderr.splitlines()[:3] == [
        "▸ graph: slow (start: work)",
        "▸ work (script)",
        "▸ work -> done",
    ]


def test_graphrun_test_shows_a_progress_bar_on_a_terminal(graphrun: GraphrunCli, tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = dict(graphrun.env(), TERM="xterm")
    env.pop("NO_COLOR", None)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "graphrun.cli", "test", str(root / "replays")],
        env=env,
        cwd=str(root),
        encoding="utf-8",
        timeout=120,
        dimensions=(30, 160),
    )
    child.expect(r"graphrun test")  # the bar's label, on the terminal's stderr
    child.expect(r"\d+ passed, 0 failed")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    piped = graphrun("test", str(root / "replays"))
    assert "\x1b" not in piped.stderr and "graphrun test" not in piped.stderr
