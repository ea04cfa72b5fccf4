"""Asking a person on a terminal, and who that person is.

``input`` and ``approval`` nodes ask here when the run has a terminal. The prompt
goes to the terminal (stderr), never stdout, which carries the run's result. A
choice lists the node's options plus a final "Other (type your own answer)" entry
that is always present: the spec allows a free-form answer to every question. The
person picks with the arrow keys and Enter, types an option's number, types an
option itself, or types anything else as a free-form answer. The interactive
widget is prompt_toolkit's; on a dumb terminal (``TERM=dumb``) or one it cannot
drive, a plain numbered prompt reads one line instead.

The module also holds the two pure pieces the graph needs from human input: the
answerer's :func:`identity` and the ``len(input) <op> <integer>`` grammar of an
``input`` node's ``validation`` (:func:`parse_validation`).
"""

from __future__ import annotations

import getpass
import operator
import os
import re
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TextIO

from graphrun.actors.base import CancelToken
from graphrun.actors.terminal import terminal_safe
from graphrun.eventstore.errors import GraphrunError
from graphrun.eventstore.events import HumanInputReceived

if TYPE_CHECKING:
    from prompt_toolkit.formatted_text import StyleAndTextTuples
    from prompt_toolkit.key_binding import KeyPressEvent

__all__ = [
    "OTHER_LABEL",
    "Answer",
    "FreeForm",
    "HumanInputAborted",
    "HumanInputCancelled",
    "HumanInputError",
    "Identity",
    "InvalidAnswer",
    "Validation",
    "ask_choice",
    "ask_text",
    "check_free_form",
    "check_input",
    "identity",
    "is_interactive",
    "parse_validation",
    "pick_option",
]

OTHER_LABEL = "Other (type your own answer)"
"""The last entry of every choice: the free-form answer the spec always allows."""

_CHANNEL = "tty"


class HumanInputError(GraphrunError):
    """A person's answer could not be obtained or attributed."""


class InvalidAnswer(HumanInputError):
    """An answer that the node cannot take: not one of an approval's options, or an
    input that fails the node's ``validation``. Nothing is recorded."""


class FreeForm(str):
    """A free-form answer to an approval node (``--other``): taken as given, never
    matched against the options."""

    __slots__ = ()


class HumanInputAborted(HumanInputError):
    """The person pressed Ctrl-C or closed the input (Ctrl-D) instead of answering."""

    exit_code: ClassVar[int] = 130


class HumanInputCancelled(HumanInputError):
    """The question was withdrawn while asked: the run's timeout, a cancel or an
    interrupt fired its token. The prompt is closed and nothing was answered."""


@dataclass(frozen=True)
class Answer:
    """What a person answered and through which channel (``"tty"`` here).

    ``defaulted`` is true when the person submitted an empty answer and ``text``
    is the default shown in the prompt: the graph must know, because a
    substituted default is not validated.
    """

    text: str
    channel: str = _CHANNEL
    # Not part of equality: the same text through the same channel is the same answer.
    defaulted: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Identity:
    """Who answered: the claimed name, the OS account and the machine."""

    by: str
    os_user: str
    host: str

    def answered(self, request: Any, answer: str, channel: str) -> HumanInputReceived:
        """The record of this answerer's ``answer`` to ``request`` (a node's human task,
        or the ``HumanInputRequested`` it recorded) through ``channel``."""
        return HumanInputReceived(
            node_id=request.node_id,
            visit=request.visit,
            answer=answer,
            by=self.by,
            os_user=self.os_user,
            host=self.host,
            channel=channel,
            question=request.question,
            options=list(request.options),
        )


# --- who answers -----------------------------------------------------------------


def identity(as_user: str | None) -> Identity:
    """The answerer: the name claimed with ``--as``, else the OS user, plus the host.

    The OS user and host are always recorded, so an audit can tell a claimed name
    from the account that typed it.

    Args:
        as_user: The name given with ``--as``, or None to use the OS user.

    Raises:
        HumanInputError: ``as_user`` is given but blank, or with whitespace around it.
    """
    os_user = _os_user()
    if as_user is None:
        return Identity(by=os_user, os_user=os_user, host=_host())
    if not as_user.strip():
        raise HumanInputError(
            "--as was given an empty name",
            hint="pass --as NAME, or leave --as out to record the OS user",
        )
    if as_user != as_user.strip() or any(ch.isspace() and ch != " " for ch in as_user):
        # Identities are compared exactly: " alice " is not alice, and is not
        # quietly made into her either.
        raise HumanInputError(
            f"--as {as_user!r} has surrounding or control whitespace",
            hint="pass the name exactly, without spaces around it",
        )
    return Identity(by=as_user, os_user=os_user, host=_host())


def _os_user() -> str:
    # getpass.getuser() raises when neither the environment nor the password
    # database names the account (containers running as an unlisted uid).
    try:
        user = getpass.getuser()
    except Exception:
        user = ""
    if user:
        return user
    getuid = getattr(os, "getuid", None)
    return f"uid:{getuid()}" if getuid is not None else "unknown"


def _host() -> str:
    try:
        return socket.gethostname() or "unknown"
    except OSError:
        return "unknown"


def is_interactive() -> bool:
    """Whether a person can be asked here: stdin and stderr are terminals.

    ``GRAPHRUN_NO_TTY=1`` forces non-interactive, e.g. to test the path that
    records ``HumanInputRequested`` from a real terminal.
    """
    if os.environ.get("GRAPHRUN_NO_TTY", "") == "1":
        return False
    return _isatty(sys.stdin) and _isatty(sys.stderr)


def _isatty(stream: TextIO | None) -> bool:
    if stream is None:
        return False
    try:
        return stream.isatty()
    except (ValueError, OSError):  # closed or detached stream
        return False


# --- asking ----------------------------------------------------------------------


def ask_choice(
    question: str,
    options: list[str],
    *,
    stream_in: TextIO | None = None,
    stream_out: TextIO | None = None,
    cancel: CancelToken | None = None,
) -> Answer:
    """Ask ``question`` with numbered ``options`` plus a free-form "Other" entry.

    Typed text that is an option's number or equals an option (exactly, else
    case-insensitively when only one option matches) selects that option; the
    number of the "Other" entry asks for free text; anything else is returned
    as the free-form answer. An empty line picks the highlighted option. Once
    "Other" is chosen (by the arrows or its number), the next text is taken as
    typed, even if it looks like a number.

    Args:
        question: The rendered question.
        options: The rendered options, in order.
        stream_in: Where to read from; defaults to stdin.
        stream_out: Where the prompt is drawn; defaults to stderr.
        cancel: Withdraws the question when it fires (from any thread): the
            prompt closes at once.

    Returns:
        The chosen option, exactly as listed, or the person's own text.

    Raises:
        HumanInputAborted: On Ctrl-C or end of input.
        HumanInputCancelled: ``cancel`` fired before an answer was given.
    """
    stream_in = sys.stdin if stream_in is None else stream_in
    stream_out = sys.stderr if stream_out is None else stream_out
    _check(cancel)
    if _can_drive(stream_in, stream_out):
        try:
            return Answer(_choice_widget(question, options, stream_in, stream_out, cancel))
        except (KeyboardInterrupt, EOFError):
            raise _aborted() from None
        except (OSError, ValueError, RuntimeError):
            pass  # the library could not drive this terminal: ask plainly
    return Answer(_choice_plain(question, options, stream_in, stream_out, cancel))


def ask_text(
    question: str,
    *,
    default: str | None,
    stream_in: TextIO | None = None,
    stream_out: TextIO | None = None,
    cancel: CancelToken | None = None,
) -> Answer:
    """Ask ``question`` for a line of free text.

    Args:
        question: The rendered question.
        default: The rendered default, shown in the prompt and returned when the
            answer is empty (or only whitespace); None when the node has none.
        stream_in: Where to read from; defaults to stdin.
        stream_out: Where the prompt is drawn; defaults to stderr.
        cancel: Withdraws the question when it fires (from any thread): the
            prompt closes at once.

    Returns:
        The person's text, or ``default`` for an empty answer ("" without one);
        ``defaulted`` says which.

    Raises:
        HumanInputAborted: On Ctrl-C or end of input.
        HumanInputCancelled: ``cancel`` fired before an answer was given.
    """
    stream_in = sys.stdin if stream_in is None else stream_in
    stream_out = sys.stderr if stream_out is None else stream_out
    _check(cancel)
    text: str | None = None
    if _can_drive(stream_in, stream_out):
        try:
            text = _text_widget(question, default, stream_in, stream_out, cancel)
        except (KeyboardInterrupt, EOFError):
            raise _aborted() from None
        except (OSError, ValueError, RuntimeError):
            text = None  # the library could not drive this terminal: ask plainly
    if text is None:
        text = _text_plain(question, default, stream_in, stream_out, cancel)
    if not text.strip():
        if default is None:
            return Answer("")
        return Answer(default, defaulted=True)
    return Answer(text)


def _aborted() -> HumanInputAborted:
    return HumanInputAborted(
        "no answer: the prompt was interrupted (Ctrl-C) or its input closed (Ctrl-D)",
        hint="run the command again to answer, or pass --answer NODE=VALUE",
    )


def _withdrawn(cancel: CancelToken) -> HumanInputCancelled:
    return HumanInputCancelled(f"the question was withdrawn: {cancel.reason or 'cancelled'}")


def _check(cancel: CancelToken | None) -> None:
    if cancel is not None and cancel.cancelled:
        raise _withdrawn(cancel)


def _can_drive(stream_in: TextIO, stream_out: TextIO) -> bool:
    if os.environ.get("TERM", "") == "dumb":
        return False
    return _isatty(stream_in) and _isatty(stream_out)


def _resolve(text: str, options: list[str]) -> int | None:
    """The index ``text`` selects: an option, ``len(options)`` for Other, or None."""
    text = text.strip()
    if text.isdigit() and text.isascii():
        number = int(text)
        if 1 <= number <= len(options) + 1:
            return number - 1
    if text in options:
        return options.index(text)
    folded = [i for i, option in enumerate(options) if option.casefold() == text.casefold()]
    return folded[0] if len(folded) == 1 else None


def pick_option(text: str, options: list[str] | tuple[str, ...], node_id: str) -> str:
    """The option ``text`` names: the option itself (exactly, else case-insensitively
    when only one matches) or its 1-based number, as the terminal menu numbers them.

    Args:
        text: The answer as given.
        options: The approval node's rendered options.
        node_id: The node, for the message.

    Returns:
        The option, exactly as listed.

    Raises:
        InvalidAnswer: ``text`` names no option; the message lists them.
    """
    opts = list(options)
    index = _resolve(text, opts)
    if index is not None and index < len(opts):
        return opts[index]
    listed = ", ".join(f"{i}. {option}" for i, option in enumerate(opts, 1))
    raise InvalidAnswer(
        f"{text!r} is not an option of approval node '{node_id}' (options: {listed})",
        hint="give an option or its number; free-form text goes with --other TEXT",
    )


def check_free_form(text: str, options: list[str] | tuple[str, ...], node_id: str) -> str:
    """Refuse free-form text (``--other``) that is blank or is one of the options
    (it would be taken as that option, not routed to ``on_other``)."""
    if not text.strip():
        raise InvalidAnswer(
            f"--other for approval node '{node_id}' is empty",
            hint="give the free-form answer's text",
        )
    if text.strip() in options or text.strip().casefold() in {o.casefold() for o in options}:
        raise InvalidAnswer(
            f"--other {text!r} is an option of approval node '{node_id}', not a free-form answer",
            hint="give it as the choice instead",
        )
    return text


def check_input(text: str, validation: str | None, *, has_default: bool, node_id: str) -> None:
    """Refuse an ``input`` answer that fails the node's ``validation``.

    An empty answer to a node with a ``default`` takes the default, which the spec
    does not validate.

    Raises:
        InvalidAnswer: The answer fails the rule; the message gives the rule.
    """
    if not validation or (has_default and not text.strip()):
        return
    try:
        rule = parse_validation(validation)
    except ValueError:
        return  # an invalid rule is the graph's error, reported by validate
    if not rule.check(text):
        raise InvalidAnswer(
            f"answer to input node '{node_id}' fails its validation '{rule}' "
            f"(got {len(text)} characters)",
            hint="give an answer that satisfies it; the run keeps waiting",
        )


def _display_default(default: str) -> str:
    # Keep the prompt to one line however long or multi-line the default is.
    flat = " ".join(default.split())
    return flat if len(flat) <= 60 else flat[:59] + "…"


# --- the plain prompt (dumb terminals) ----------------------------------------------


def _read_line(
    stream_in: TextIO, stream_out: TextIO, prompt: str, cancel: CancelToken | None
) -> str:
    stream_out.write(prompt)
    stream_out.flush()
    try:
        _until_readable(stream_in, stream_out, cancel)
        line = stream_in.readline()
    except KeyboardInterrupt:
        stream_out.write("\n")
        raise _aborted() from None
    if not line:
        stream_out.write("\n")
        raise _aborted()
    return line.rstrip("\r\n")


def _until_readable(stream_in: TextIO, stream_out: TextIO, cancel: CancelToken | None) -> None:
    """Wait until a line can be read from ``stream_in``, or raise when ``cancel``
    fires first. A stream without a descriptor (text given in memory) is read at
    once. A terminal in its line mode is readable once a whole line is typed."""
    if cancel is None:
        return
    try:
        fd = stream_in.fileno()
    except (AttributeError, OSError, ValueError):
        return
    import selectors
    import threading

    wake_r, wake_w = os.pipe()
    guard = threading.Lock()
    open_ = [True]

    def wake() -> None:  # any thread; never after the pipe is closed (its number reused)
        with guard:
            if open_[0]:
                os.write(wake_w, b"!")

    unhook = cancel.on_cancel(wake)
    try:
        with selectors.DefaultSelector() as selector:
            try:
                selector.register(fd, selectors.EVENT_READ)
            except (OSError, ValueError):  # a regular file: always readable
                return
            selector.register(wake_r, selectors.EVENT_READ)
            ready = [key.fd for key, _ in selector.select()]
    finally:
        unhook()
        with guard:
            open_[0] = False
            os.close(wake_r)
            os.close(wake_w)
    if fd not in ready:
        stream_out.write("\n")
        raise _withdrawn(cancel)


def _choice_plain(
    question: str,
    options: list[str],
    stream_in: TextIO,
    stream_out: TextIO,
    cancel: CancelToken | None = None,
) -> str:
    lines = [terminal_safe(question.rstrip("\n"))]
    lines += [
        f"  {i}. {terminal_safe(option)}" for i, option in enumerate([*options, OTHER_LABEL], 1)
    ]
    stream_out.write("\n".join(lines) + "\n")
    other = len(options)
    while True:
        text = _read_line(
            stream_in, stream_out, f"Answer [1-{other + 1} or your own text]: ", cancel
        )
        if not text.strip():
            continue
        index = _resolve(text, options)
        if index is None:
            return text
        if index < other:
            return options[index]
        while True:
            own = _read_line(stream_in, stream_out, "Your answer: ", cancel)
            if own.strip():
                return own


def _text_plain(
    question: str,
    default: str | None,
    stream_in: TextIO,
    stream_out: TextIO,
    cancel: CancelToken | None = None,
) -> str:
    stream_out.write(terminal_safe(question.rstrip("\n")) + "\n")
    suffix = f" [{terminal_safe(_display_default(default))}]" if default else ""
    return _read_line(stream_in, stream_out, f"Answer{suffix}: ", cancel)


# --- the interactive widget ------------------------------------------------------


@dataclass
class _Cursor:
    """The highlighted entry of a choice, moved by the arrow keys."""

    index: int = 0
    last: int = 0

    def move(self, step: int) -> None:
        self.index = (self.index + step) % (self.last + 1)


class _Withdrawn(Exception):
    """Ends a prompt_toolkit prompt whose question was withdrawn."""


def _prompt(session: Any, message: Any, cancel: CancelToken | None, **kwargs: Any) -> str:
    """``session.prompt(message, **kwargs)``, closed when ``cancel`` fires.

    The token may fire on any thread, before the prompt's own event loop runs or
    while it does: the exit is scheduled on that loop when it runs, and checked
    by the prompt's ``pre_run`` hook when it had not started yet."""
    if cancel is None:
        return str(session.prompt(message, **kwargs))
    app = session.app

    def end() -> None:  # on the prompt's loop
        # Not yet running (no future): its pre_run hook sees the token instead.
        if app.future is not None and not app.future.done():
            app.exit(exception=_Withdrawn)

    def fired() -> None:  # any thread
        loop = app.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(end)

    def pre_run() -> None:
        if cancel.cancelled:
            end()

    unhook = cancel.on_cancel(fired)
    try:
        return str(session.prompt(message, pre_run=pre_run, **kwargs))
    except _Withdrawn:
        raise _withdrawn(cancel) from None
    finally:
        unhook()


def _choice_widget(
    question: str,
    options: list[str],
    stream_in: TextIO,
    stream_out: TextIO,
    cancel: CancelToken | None = None,
) -> str:
    # Imported here: prompt_toolkit is only needed when a person is asked.
    from prompt_toolkit import PromptSession
    from prompt_toolkit.input import create_input
    from prompt_toolkit.key_binding import KeyBindings
    from prompt_toolkit.output import create_output

    entries = [*options, OTHER_LABEL]
    other = len(options)
    cursor = _Cursor(last=other)
    session: PromptSession[str] = PromptSession(
        input=create_input(stream_in), output=create_output(stream_out)
    )

    def shown() -> int:
        # What Enter would pick: the typed text's target, else the highlight.
        typed = session.default_buffer.text
        if not typed.strip() or cursor.index == other:
            return cursor.index
        index = _resolve(typed, options)
        return other if index is None else index

    def message() -> StyleAndTextTuples:
        parts: StyleAndTextTuples = [("bold", terminal_safe(question.rstrip("\n")) + "\n")]
        current = shown()
        for i, entry in enumerate(entries):
            if i == current:
                parts.append(("reverse", f"> {i + 1}. {terminal_safe(entry)}"))
            else:
                parts.append(("", f"  {i + 1}. {terminal_safe(entry)}"))
            parts.append(("", "\n"))
        if cursor.index == other:
            parts.append(("", "Your answer: "))
        else:
            parts.append(("", f"Answer [↑/↓ Enter, 1-{other + 1}, or your own text]: "))
        return parts

    bindings = KeyBindings()

    @bindings.add("up")
    def _up(event: KeyPressEvent) -> None:
        cursor.move(-1)
        event.current_buffer.reset()

    @bindings.add("down")
    def _down(event: KeyPressEvent) -> None:
        cursor.move(1)
        event.current_buffer.reset()

    @bindings.add("enter")
    def _enter(event: KeyPressEvent) -> None:
        buffer = event.current_buffer
        typed = buffer.text
        if cursor.index == other:
            # "Other" was chosen: the text is the person's own, taken as typed.
            if typed.strip():
                event.app.exit(result=typed)
            return
        if not typed.strip():
            event.app.exit(result=options[cursor.index])
            return
        index = _resolve(typed, options)
        if index is None:
            event.app.exit(result=typed)
        elif index < other:
            event.app.exit(result=options[index])
        else:  # the number of "Other": highlight it and take text next
            cursor.index = other
            buffer.reset()

    return _prompt(session, message, cancel, key_bindings=bindings)


def _text_widget(
    question: str,
    default: str | None,
    stream_in: TextIO,
    stream_out: TextIO,
    cancel: CancelToken | None = None,
) -> str:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.input import create_input
    from prompt_toolkit.output import create_output

    session: PromptSession[str] = PromptSession(
        input=create_input(stream_in), output=create_output(stream_out)
    )
    message: StyleAndTextTuples = [("bold", terminal_safe(question.rstrip("\n")) + "\n")]
    if default:
        shown_default = terminal_safe(_display_default(default))
        message += [("", "Answer "), ("italic", f"[{shown_default}]"), ("", ": ")]
    else:
        message.append(("", "Answer: "))
    return _prompt(session, message, cancel)


# --- validation ------------------------------------------------------------------

_OPERATORS: dict[str, Callable[[int, int], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
}

_VALIDATION = re.compile(r"\s*len\s*\(\s*input\s*\)\s*(>=|<=|==|>|<)\s*(-?[0-9]+)\s*", re.ASCII)

_GRAMMAR = (
    "expected `len(input) <op> <integer>` with <op> one of >, >=, <, <=, == (e.g. `len(input) > 0`)"
)


@dataclass(frozen=True)
class Validation:
    """A parsed ``len(input) <op> <integer>`` predicate of an ``input`` node."""

    op: str
    value: int

    def check(self, text: str) -> bool:
        """Whether ``text``'s length (in characters) satisfies the predicate."""
        return _OPERATORS[self.op](len(text), self.value)

    def __str__(self) -> str:
        return f"len(input) {self.op} {self.value}"


def parse_validation(expr: str) -> Validation:
    """Parse an ``input`` node's ``validation`` string.

    Args:
        expr: Such as ``"len(input) > 0"``; whitespace between tokens is free.

    Raises:
        ValueError: ``expr`` is not of the accepted form; the message gives it.
    """
    if not isinstance(expr, str):
        raise ValueError(f"invalid validation {expr!r}: {_GRAMMAR}")
    match = _VALIDATION.fullmatch(expr)
    if match is None:
        raise ValueError(f"invalid validation {expr!r}: {_GRAMMAR}")
    return Validation(op=match.group(1), value=int(match.group(2)))
