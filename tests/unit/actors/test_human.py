"""Human I/O: prompts driven through a real pseudo-terminal, identity, validation grammar."""

from __future__ import annotations

import getpass
import io
import json
import os
import re
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pexpect
import pytest

from graphrun.actors.human.prompt import (
    OTHER_LABEL,
    Answer,
    HumanInputAborted,
    HumanInputCancelled,
    HumanInputError,
    Identity,
    Validation,
    ask_choice,
    ask_text,
    identity,
    is_interactive,
    parse_validation,
)
from graphrun.eventstore.errors import GraphrunError

SCRIPT = Path(__file__).resolve().parents[2] / "support" / "pty_prompt.py"
DOWN, UP, ENTER, CTRL_C, CTRL_D = "\x1b[B", "\x1b[A", "\r", "\x03", "\x04"
CPR_REQUEST = "\x1b[6n"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][0-9A-Za-z]")
ABORT_MESSAGE = (
    "error: no answer: the prompt was interrupted (Ctrl-C) or its input closed (Ctrl-D)"
    " (run the command again to answer, or pass --answer NODE=VALUE)"
)

pty_timeout = pytest.mark.timeout(15)


@dataclass
class Prompt:
    """A pty_prompt.py child on a pseudo-terminal whose stdout goes to a file."""

    child: pexpect.spawn
    out: Path
    screen: io.StringIO

    def expect(self, pattern: str | type[pexpect.EOF]) -> None:
        """Wait for ``pattern``, answering cursor-position requests as a terminal does."""
        while True:
            index = self.child.expect([pattern, re.escape(CPR_REQUEST)])
            if index == 0:
                return
            self.child.send("\x1b[5;1R")

    def finish(self) -> tuple[int, str, str]:
        """Wait for exit; (exit status, stdout file, terminal text without escapes)."""
        self.expect(pexpect.EOF)
        self.child.close()
        return self.child.exitstatus, self.out.read_text(), ANSI.sub("", self.screen.getvalue())


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[object]:
    children: list[pexpect.spawn] = []

    def start(*args: str, term: str = "xterm") -> Prompt:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPT_TOOLKIT")}
        env.update(TERM=term, OUT=str(tmp_path / "stdout.txt"))
        env.pop("GRAPHRUN_NO_TTY", None)
        # stdout goes to a file: the prompt must reach the terminal through stderr.
        child = pexpect.spawn(
            "/bin/sh",
            ["-c", 'exec "$@" >"$OUT"', "sh", sys.executable, str(SCRIPT), *args],
            env=env,
            encoding="utf-8",
            timeout=5,
            dimensions=(30, 120),
        )
        screen = io.StringIO()
        child.logfile_read = screen
        children.append(child)
        return Prompt(child, tmp_path / "stdout.txt", screen)

    yield start
    for child in children:
        if child.isalive():
            child.terminate(force=True)


def answered(prompt: Prompt) -> str:
    status, out, _ = prompt.finish()
    assert status == 0, out
    result = json.loads(out)
    assert result["channel"] == "tty"
    return result["text"]


# --- choices on a real terminal ------------------------------------------------------


@pty_timeout
def test_choice_shows_question_options_and_other_on_the_terminal_not_stdout(spawn):
    prompt = spawn("choice", "Final report: ok\nApprove?", "yes", "no")
    prompt.expect("own text")
    prompt.child.send("1" + ENTER)
    status, out, screen = prompt.finish()
    assert status == 0
    assert out == '{"text": "yes", "channel": "tty"}\n'
    assert "Final report: ok" in screen
    assert "Approve?" in screen
    assert "1. yes" in screen
    assert "2. no" in screen
    assert f"3. {OTHER_LABEL}" in screen


@pty_timeout
def test_choice_by_arrow_keys(spawn):
    prompt = spawn("choice", "Approve?", "yes", "no", "later")
    prompt.expect("own text")
    prompt.child.send(DOWN + DOWN + UP + ENTER)
    assert answered(prompt) == "no"


@pty_timeout
def test_arrow_up_from_the_first_entry_wraps_to_other_then_back(spawn):
    prompt = spawn("choice", "Approve?", "yes", "no")
    prompt.expect("own text")
    prompt.child.send(UP + DOWN + DOWN + ENTER)
    assert answered(prompt) == "no"


@pty_timeout
def test_enter_alone_picks_the_first_option(spawn):
    prompt = spawn("choice", "Approve?", "yes", "no")
    prompt.expect("own text")
    prompt.child.send(ENTER)
    assert answered(prompt) == "yes"


@pty_timeout
def test_choice_by_number(spawn):
    prompt = spawn("choice", "Approve?", "yes", "no")
    prompt.expect("own text")
    prompt.child.send("2" + ENTER)
    assert answered(prompt) == "no"


@pty_timeout
def test_choice_by_typing_an_option(spawn):
    prompt = spawn("choice", "Approve?", "yes", "no")
    prompt.expect("own text")
    prompt.child.send("NO" + ENTER)
    assert answered(prompt) == "no"


@pty_timeout
def test_other_text_is_a_free_form_answer(spawn):
    prompt = spawn("choice", "Approve?", "yes", "no")
    prompt.expect("own text")
    prompt.child.send("only after legal review" + ENTER)
    assert answered(prompt) == "only after legal review"


@pty_timeout
def test_other_by_arrows_waits_for_text(spawn):
    prompt = spawn("choice", "Approve?", "yes", "no")
    prompt.expect("own text")
    prompt.child.send(DOWN + DOWN)
    prompt.expect("Your answer:")
    prompt.child.send(ENTER)  # nothing typed yet: still waiting
    prompt.child.send("2" + ENTER)  # with Other chosen, text is taken as typed
    assert answered(prompt) == "2"


@pty_timeout
def test_other_by_its_number_then_text(spawn):
    prompt = spawn("choice", "Approve?", "yes", "no")
    prompt.expect("own text")
    prompt.child.send("3" + ENTER)
    prompt.expect("Your answer:")
    prompt.child.send("ask me tomorrow" + ENTER)
    assert answered(prompt) == "ask me tomorrow"


@pty_timeout
@pytest.mark.parametrize(("key", "name"), [(CTRL_D, "ctrl-d"), (CTRL_C, "ctrl-c")])
def test_choice_aborted(spawn, key, name):
    prompt = spawn("choice", "Approve?", "yes", "no")
    prompt.expect("own text")
    prompt.child.send(key)
    status, out, screen = prompt.finish()
    assert status == 130, name
    assert out == ""
    assert ABORT_MESSAGE in screen


# --- text on a real terminal ------------------------------------------------------------


@pty_timeout
def test_text_empty_answer_returns_the_default_shown_in_the_prompt(spawn):
    prompt = spawn("text", "Enter a search term:", "A-17")
    prompt.expect(re.escape("[A-17]"))
    prompt.child.send(ENTER)
    assert answered(prompt) == "A-17"
    assert "Enter a search term:" in prompt.screen.getvalue()


@pty_timeout
def test_text_typed_answer_wins_over_the_default(spawn):
    prompt = spawn("text", "Enter a search term:", "A-17")
    prompt.expect("Answer")
    prompt.child.send("B-9" + ENTER)
    assert answered(prompt) == "B-9"


@pty_timeout
def test_text_without_default_returns_empty(spawn):
    prompt = spawn("text", "Describe a task.")
    prompt.expect("Answer:")
    prompt.child.send(ENTER)
    assert answered(prompt) == ""


@pty_timeout
@pytest.mark.parametrize("key", [CTRL_D, CTRL_C])
def test_text_aborted(spawn, key):
    prompt = spawn("text", "Enter a search term:", "A-17")
    prompt.expect("Answer")
    prompt.child.send(key)
    status, out, screen = prompt.finish()
    assert status == 130
    assert out == ""
    assert ABORT_MESSAGE in screen


# --- the plain prompt on a dumb terminal -------------------------------------------------


@pty_timeout
def test_dumb_terminal_gets_a_plain_numbered_prompt(spawn):
    prompt = spawn("choice", "Approve?", "yes", "no", term="dumb")
    prompt.expect(re.escape("Answer [1-3 or your own text]: "))
    prompt.child.send("3" + ENTER)
    prompt.expect("Your answer:")
    prompt.child.send("needs work" + ENTER)
    status, out, screen = prompt.finish()
    assert status == 0
    assert json.loads(out)["text"] == "needs work"
    assert "\x1b" not in prompt.screen.getvalue()
    assert f"  1. yes\r\n  2. no\r\n  3. {OTHER_LABEL}\r\n" in screen


@pty_timeout
def test_dumb_terminal_ctrl_d_aborts(spawn):
    prompt = spawn("text", "Enter a search term:", "A-17", term="dumb")
    prompt.expect(re.escape("Answer [A-17]: "))
    prompt.child.sendeof()
    status, out, screen = prompt.finish()
    assert status == 130
    assert out == ""
    assert ABORT_MESSAGE in screen


# --- the plain prompt on streams that are not terminals ------------------------------------


def ask_plain(lines: str, options: list[str]) -> tuple[Answer, str]:
    shown = io.StringIO()
    answer = ask_choice("Approve?", options, stream_in=io.StringIO(lines), stream_out=shown)
    return answer, shown.getvalue()


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ("1\n", "yes"),
        ("2\n", "no"),
        (" no \n", "no"),
        ("Yes\n", "yes"),
        ("\n\n2\n", "no"),  # empty lines ask again
        ("maybe\n", "maybe"),
        ("4\n", "4"),  # a number past the list is the person's own text
        ("3\n\nlater\n", "later"),
    ],
)
def test_plain_choice(lines, expected):
    answer, shown = ask_plain(lines, ["yes", "no"])
    assert answer == Answer(expected, "tty")
    assert shown.startswith(f"Approve?\n  1. yes\n  2. no\n  3. {OTHER_LABEL}\n")


def test_plain_choice_prefers_an_exact_option_over_case_folding():
    answer, _ = ask_plain("No\n", ["no", "No"])
    assert answer.text == "No"
    answer, _ = ask_plain("NO\n", ["no", "No"])
    assert answer.text == "NO"  # ambiguous: the person's own text


def test_plain_choice_end_of_input_aborts():
    with pytest.raises(HumanInputAborted) as info:
        ask_plain("", ["yes", "no"])
    assert isinstance(info.value, GraphrunError)
    assert info.value.exit_code == 130
    assert f"error: {info.value}" == ABORT_MESSAGE


@pytest.mark.parametrize(
    ("lines", "default", "expected"),
    [("\n", "A-17", "A-17"), ("  \n", "A-17", "A-17"), ("B\n", "A-17", "B"), ("\n", None, "")],
)
def test_plain_text(lines, default, expected):
    shown = io.StringIO()
    answer = ask_text("Term?", default=default, stream_in=io.StringIO(lines), stream_out=shown)
    assert answer == Answer(expected, "tty")
    assert shown.getvalue() == ("Term?\nAnswer [A-17]: " if default else "Term?\nAnswer: ")


# --- a question withdrawn while it is asked (the run's token) -----------------------------


def test_a_withdrawn_question_closes_a_plain_prompt_waiting_on_its_descriptor():
    import threading

    from graphrun.actors.base import CancelToken

    read_end, write_end = os.pipe()  # a descriptor nobody writes to: the person is away
    token = CancelToken()
    shown = io.StringIO()
    threading.Timer(0.2, token.cancel, args=("run timeout (2s)",)).start()
    try:
        with (
            open(read_end, encoding="utf-8", closefd=False) as stream_in,
            pytest.raises(HumanInputCancelled) as info,
        ):
            ask_choice(
                "Approve?", ["yes", "no"], stream_in=stream_in, stream_out=shown, cancel=token
            )
    finally:
        os.close(read_end)
        os.close(write_end)
    assert str(info.value) == "the question was withdrawn: run timeout (2s)"
    assert shown.getvalue().endswith("own text]: \n")  # the prompt's line is ended


def test_an_answer_typed_before_the_token_fires_is_taken():
    from graphrun.actors.base import CancelToken

    read_end, write_end = os.pipe()
    os.write(write_end, b"2\n")
    token = CancelToken()
    try:
        with open(read_end, encoding="utf-8", closefd=False) as stream_in:
            answer = ask_choice(
                "Approve?",
                ["yes", "no"],
                stream_in=stream_in,
                stream_out=io.StringIO(),
                cancel=token,
            )
    finally:
        os.close(read_end)
        os.close(write_end)
    assert answer.text == "no"


def test_a_question_withdrawn_before_it_is_asked_is_not_shown():
    from graphrun.actors.base import CancelToken

    token = CancelToken()
    token.cancel("cancelled by ops")
    shown = io.StringIO()
    with pytest.raises(HumanInputCancelled):
        ask_text(
            "Term?", default=None, stream_in=io.StringIO("B\n"), stream_out=shown, cancel=token
        )
    assert shown.getvalue() == ""


# --- interactivity and identity -----------------------------------------------------------


@pty_timeout
@pytest.mark.parametrize(("no_tty", "expected"), [(None, "True"), ("1", "False")])
def test_is_interactive_on_a_terminal(no_tty, expected):
    env = dict(os.environ)
    env.pop("GRAPHRUN_NO_TTY", None)
    if no_tty is not None:
        env["GRAPHRUN_NO_TTY"] = no_tty
    code = "from graphrun.actors.human.prompt import is_interactive; print(is_interactive())"
    output, status = pexpect.run(
        f"{sys.executable} -c '{code}'", env=env, withexitstatus=True, timeout=10, encoding="utf-8"
    )
    assert status == 0, output
    assert output.strip() == expected


def test_is_interactive_without_a_terminal():
    # pytest captures stdin, so this process has no terminal to ask on.
    assert is_interactive() is False


def test_identity_defaults_to_the_os_user():
    me = getpass.getuser()
    assert identity(None) == Identity(by=me, os_user=me, host=socket.gethostname())


def test_identity_records_the_claim_and_the_os_user():
    who = identity("alice")
    assert who.by == "alice"
    assert who.os_user == getpass.getuser()
    assert who.host == socket.gethostname()


@pytest.mark.parametrize("claim", [" alice ", "alice ", "\talice", "ali\nce"])
def test_identity_refuses_a_padded_claim_instead_of_trimming_it(claim):
    with pytest.raises(HumanInputError, match="surrounding or control whitespace"):
        identity(claim)


def test_identity_rejects_a_blank_claim():
    with pytest.raises(HumanInputError) as info:
        identity("  ")
    assert str(info.value) == (
        "--as was given an empty name (pass --as NAME, or leave --as out to record the OS user)"
    )


# --- validation grammar ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "parsed"),
    [
        ("len(input) > 0", Validation(">", 0)),
        ("len(input)>=3", Validation(">=", 3)),
        ("  len ( input )  <  10  ", Validation("<", 10)),
        ("len(input) <= 280", Validation("<=", 280)),
        ("len(input) == 4", Validation("==", 4)),
        ("len(input) > -1", Validation(">", -1)),
        ("len(input)\t==\t007", Validation("==", 7)),
    ],
)
def test_valid_expressions_parse(expr, parsed):
    assert parse_validation(expr) == parsed


@pytest.mark.parametrize(
    "expr",
    [
        "",
        "len(input)",
        "len(input) > ",
        "len(input) != 3",
        "len(input) => 3",
        "len(input) = 3",
        "len(input) > 3.5",
        "len(input) > three",
        "len(text) > 0",
        "input > 0",
        "len(input) > 0 and len(input) < 5",
        "0 < len(input)",
        "re.match('a', input)",
        "len(input) > ３",  # full-width digit
    ],
)
def test_invalid_expressions_are_rejected_with_the_grammar(expr):
    with pytest.raises(ValueError) as info:
        parse_validation(expr)
    assert str(info.value) == (
        f"invalid validation {expr!r}: expected `len(input) <op> <integer>` with <op> one of"
        " >, >=, <, <=, == (e.g. `len(input) > 0`)"
    )


def test_non_string_expression_is_rejected():
    with pytest.raises(ValueError, match="expected `len"):
        parse_validation(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("expr", "text", "ok"),
    [
        ("len(input) > 0", "", False),
        ("len(input) > 0", "a", True),
        ("len(input) >= 2", "ab", True),
        ("len(input) >= 2", "a", False),
        ("len(input) < 3", "abc", False),
        ("len(input) < 3", "ab", True),
        ("len(input) <= 3", "abc", True),
        ("len(input) == 2", "é✓", True),  # characters, not bytes
        ("len(input) == 2", "abc", False),
    ],
)
def test_check(expr, text, ok):
    assert parse_validation(expr).check(text) is ok


def test_validation_renders_canonically():
    assert str(parse_validation(" len( input )>=2 ")) == "len(input) >= 2"


def test_a_plain_prompt_shows_control_characters_and_returns_the_option_itself():
    """A question or an option from a model or a script may hold what a terminal
    obeys (an erase, a hide, a reordering): it is shown written out, and the answer
    picked is still the option exactly as listed."""
    hostile = "ship\x1b[2K\r\u202eoff"
    shown = io.StringIO()
    answer = ask_choice(
        f"Approve {hostile}?", [hostile, "no"], stream_in=io.StringIO("1\n"), stream_out=shown
    )
    assert answer == Answer(hostile, "tty")
    text = shown.getvalue()
    assert "\x1b" not in text and "\r" not in text and "\u202e" not in text
    assert "Approve ship\\x1b[2K\\x0d\\u202eoff?\n  1. ship\\x1b[2K\\x0d\\u202eoff\n" in text
