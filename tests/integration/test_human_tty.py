"""``graphrun run`` on a real pseudo-terminal: the prompt, arrows, typing, defaults."""

from __future__ import annotations

import getpass
import io
import re
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pexpect
import pytest

from tests.integration.test_human_answers import GATED, _agent
from tests.integration.test_human_nodes import APPROVAL, events, of_type

DOWN, UP, ENTER, CTRL_C = "\x1b[B", "\x1b[A", "\r", "\x03"
CPR_REQUEST = "\x1b[6n"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][0-9A-Za-z]")

pytestmark = pytest.mark.timeout(30)


@dataclass
class Terminal:
    """``graphrun`` on a pseudo-terminal (stdin, stderr); its stdout goes to a file."""

    child: pexpect.spawn
    out: Path
    screen: io.StringIO

    def expect(self, pattern: str | type[pexpect.EOF]) -> None:
        """Wait for ``pattern``, answering cursor-position requests as a terminal does."""
        while True:
            if self.child.expect([pattern, re.escape(CPR_REQUEST)]) == 0:
                return
            self.child.send("\x1b[5;1R")

    def finish(self) -> tuple[int, str, str]:
        """(exit status, stdout, what the terminal showed without escapes)."""
        self.expect(pexpect.EOF)
        self.child.close()
        return self.child.exitstatus, self.out.read_text(), ANSI.sub("", self.screen.getvalue())


@pytest.fixture
def terminal(tmp_path: Path, graphrun: Any) -> Iterator[Any]:
    children: list[pexpect.spawn] = []

    def start(*args: str, term: str = "xterm") -> Terminal:
        env = {k: v for k, v in graphrun.env().items() if not k.startswith("PROMPT_TOOLKIT")}
        env.pop("GRAPHRUN_NO_TTY", None)
        env.update(TERM=term, OUT=str(tmp_path / "stdout.txt"))
        child = pexpect.spawn(
            "/bin/sh",
            ["-c", 'exec "$@" >"$OUT"', "sh", sys.executable, "-m", "graphrun.cli", *args],
            env=env,
            cwd=str(tmp_path),
            encoding="utf-8",
            timeout=15,
            dimensions=(30, 120),
        )
        screen = io.StringIO()
        child.logfile_read = screen
        children.append(child)
        return Terminal(child, tmp_path / "stdout.txt", screen)

    yield start
    for child in children:
        if child.isalive():
            child.terminate(force=True)


def test_choose_by_number_records_the_os_user(terminal, graphrun, agent):
    term = terminal("run", str(_agent(agent)))
    term.expect("own text")
    term.child.send("1" + ENTER)
    status, out, screen = term.finish()
    assert status == 0, screen
    assert out == "shipped v2.1 (approve)\n"
    for shown in ("Ship v2.1?", "1. approve", "2. reject", "3. Other (type your own answer)"):
        assert shown in screen
    (got,) = of_type(events(graphrun.db), "HumanInputReceived")
    assert (got["answer"], got["channel"]) == ("approve", "tty")
    assert got["by"] == got["os_user"] == getpass.getuser()
    assert got["question"] == "Ship v2.1?" and got["options"] == ["approve", "reject"]


def test_choose_by_arrow_keys_as_a_named_person(terminal, graphrun, agent):
    term = terminal("run", str(_agent(agent)), "--as", "alice")
    term.expect("own text")
    term.child.send(DOWN + DOWN + UP + ENTER)
    status, out, screen = term.finish()
    assert status == 0, screen
    assert out == "dropped (reject)\n"
    (got,) = of_type(events(graphrun.db), "HumanInputReceived")
    assert (got["answer"], got["by"], got["channel"]) == ("reject", "alice", "tty")


def test_free_text_then_an_input_that_takes_its_default(terminal, graphrun, agent):
    term = terminal("run", str(_agent(agent)))
    term.expect("own text")
    term.child.send("needs a changelog entry" + ENTER)
    term.expect(re.escape("What should change in v2.1 (needs a changelog entry)?"))
    term.expect(re.escape("[v2.1 as is]"))
    term.child.send(ENTER)
    status, out, screen = term.finish()
    assert status == 0, screen
    assert out == "noted needs a changelog entry / v2.1 as is\n"
    got = of_type(events(graphrun.db), "HumanInputReceived")
    assert [(g["node_id"], g["answer"], g["channel"]) for g in got] == [
        ("review", "needs a changelog entry", "tty"),
        ("clarify", "", "tty"),  # empty: the graph took the default
    ]
    res = graphrun("audit", graphrun.last_run())
    assert "(empty: default 'v2.1 as is')" in res.stdout


def test_typed_input_replaces_the_default(terminal, graphrun, agent):
    term = terminal("run", str(_agent(agent)))
    term.expect("own text")
    term.child.send("3" + ENTER)  # "Other", then the text
    term.expect("Your answer")
    term.child.send("2" + ENTER)  # after Other, a number is text
    term.expect(re.escape("[v2.1 as is]"))
    term.child.send("bump the minor version" + ENTER)
    status, out, screen = term.finish()
    assert status == 0, screen
    assert out == "noted 2 / bump the minor version\n"


def test_a_person_who_is_not_an_approver_is_not_asked(terminal, graphrun, agent):
    term = terminal("run", str(_agent(agent, GATED)))
    status, out, screen = term.finish()
    assert status == 2, screen
    assert out == ""
    user = getpass.getuser()
    assert f"error: '{user}' may not answer approval node 'review'" in screen
    assert "own text" not in screen
    run_id = graphrun.last_run()
    assert f"graphrun approve {run_id} <approve|reject> --as <alice|bob>" in screen
    evs = events(graphrun.db, run_id)
    assert evs[-1]["type"] == "HumanInputRequested"
    # The run still waits, and an approver can answer it later.
    res = graphrun("approve", run_id, "approve", "--as", "alice")
    assert res.code == 0, res.stderr


def test_ctrl_c_at_the_prompt_leaves_the_run_waiting(terminal, graphrun, agent):
    term = terminal("run", str(_agent(agent)))
    term.expect("own text")
    term.child.send(CTRL_C)
    status, out, screen = term.finish()
    assert status == 130, screen
    assert out == ""
    assert "error: no answer: the prompt was interrupted (Ctrl-C)" in screen
    run_id = graphrun.last_run()
    assert f"answer with: graphrun approve {run_id}" in screen
    assert events(graphrun.db, run_id)[-1]["type"] == "HumanInputRequested"


def test_replay_on_a_terminal_asks_nobody(terminal, graphrun, agent):
    res = graphrun("run", str(_agent(agent)), "--answer", "review=approve")
    assert res.code == 0, res.stderr
    run_id = graphrun.last_run()
    term = terminal("replay", run_id)
    status, _, screen = term.finish()
    assert status == 0, screen
    assert "own text" not in screen
    assert f"ok: run {run_id}" in screen


# The same gate, with a run timeout of 2 s.
TIMED = APPROVAL.replace("start: draft\n", "start: draft\nsettings:\n  timeout: 2\n")


def _approved_late(shown: Terminal) -> tuple[int, str, str]:
    """The first option chosen 3 s after the question shows (past a 2 s timeout)."""
    shown.expect("own text")
    time.sleep(3)
    shown.child.send("1" + ENTER)
    return shown.finish()


@pytest.mark.parametrize("term", ["xterm", "dumb"])
def test_time_at_the_prompt_does_not_count_against_the_run_timeout(terminal, graphrun, agent, term):
    # xterm: prompt_toolkit's widget; dumb: the plain numbered prompt. The person
    # answers after the 2 s the run may take: a run that waits for a person is
    # not charged for it, on a terminal as when it pauses (exit 3) for `approve`.
    shown = terminal("run", str(_agent(agent, TIMED)), term=term)
    status, out, screen = _approved_late(shown)
    assert status == 0, screen
    assert out == "shipped v2.1 (approve)\n"
    evs = events(graphrun.db, graphrun.last_run())
    (got,) = of_type(evs, "HumanInputReceived")
    assert (got["answer"], got["channel"]) == ("approve", "tty")
    assert evs[-1]["type"] == "RunCompleted"


def test_sigterm_closes_the_prompt_and_leaves_the_run_resumable(terminal, graphrun, agent):
    shown = terminal("run", str(_agent(agent)))
    shown.expect("own text")
    shown.child.kill(signal.SIGTERM)
    status, out, screen = shown.finish()
    assert status == 143, screen  # 128 + SIGTERM, as a shell reports it
    assert out == "" and "Traceback" not in screen
    run_id = graphrun.last_run()
    evs = events(graphrun.db, run_id)
    assert not of_type(evs, "HumanInputReceived")
    assert evs[-1]["type"] == "RunInterrupted"
    res = graphrun("resume", run_id, "--answer", "review=reject")
    assert res.code == 0, res.stderr
    assert res.stdout == "dropped (reject)\n"


def test_a_cancel_from_another_process_closes_the_prompt(terminal, graphrun, agent):
    shown = terminal("run", str(_agent(agent)))
    shown.expect("own text")
    run_id = graphrun.last_run()
    res = graphrun("cancel", run_id, "--as", "ops", "--reason", "superseded")
    assert res.code == 0, res.stderr
    status, out, screen = shown.finish()
    assert status == 1, screen
    assert out == ""
    assert "superseded" in screen and "Traceback" not in screen
    evs = events(graphrun.db, run_id)
    assert not of_type(evs, "HumanInputReceived")
    assert not of_type(evs, "NodeFailed")
    last = evs[-1]
    assert (last["type"], last["by"], last["reason"]) == ("RunCancelled", "ops", "superseded")


# A parent whose agent node hands the gate to a child run.
DELEGATING = """
version: "1.0"
name: boss
start: delegate
nodes:
  delegate:
    type: agent
    agent: gate
    prompt: "ship it"
    state_updates: {said: "{{output}}"}
    next: done
  done:
    type: end
    output: "boss: {{said}}"
"""


@pytest.mark.parametrize(
    "limit",
    [
        ("start: delegate\n", "start: delegate\nsettings:\n  timeout: 2\n"),  # the parent run's
        ("    agent: gate\n", "    agent: gate\n    timeout: 2\n"),  # the agent node's
    ],
    ids=["run-timeout", "agent-node-timeout"],
)
def test_time_a_child_run_asks_a_person_does_not_count_against_its_parents(
    terminal, graphrun, agent, tmp_path, limit
):
    # The gate is asked in the child run, on the parent's terminal; the person
    # answers after the 2 s the parent (or its agent node) may take. Neither is
    # charged for it.
    gate = _agent(agent, APPROVAL)
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "gate").symlink_to(gate)
    boss = agent(DELEGATING.replace(*limit))
    shown = terminal("run", str(boss), "--agents-dir", str(agents))
    status, out, screen = _approved_late(shown)
    assert status == 0, screen
    assert out == "boss: shipped v2.1 (approve)\n"
    evs = events(graphrun.db, graphrun.last_run())
    assert evs[-1]["type"] == "RunCompleted"
    assert not of_type(evs, "TimeoutFired")
