"""What every effect needs: a cancel token and a context to record events through.

An effect (run a script, call an LLM, ask a person, retrieve, start a child run)
is given an :class:`EffectContext`. It records each outcome with
``ctx.record(event)`` *as soon as it has it*: in a live run that appends the event
durably to the run's log before anything uses it; the supervisor stamps the
envelope (``run_id``, ``seq``, ``ts``), so effects build events with the payload
fields only. ``ctx.cancel`` fires when the run's timeout or a cancellation stops
the node: long effects register a callback to kill what they started.
"""

from __future__ import annotations

import ast
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from graphrun.eventstore.events import Event

# ``ast.parse`` in several threads at once can fail in CPython 3.11 with "SystemError:
# AST constructor recursion depth mismatch": the depth it checks is the interpreter's,
# not the thread's (python/cpython#106905). A step's parallel tool nodes load their
# tool files on the run's executor threads at the same moment, so every parse here
# takes its turn.
_PARSE_LOCK = threading.Lock()


def parse_python(source: str, filename: str = "<unknown>", mode: str = "exec") -> Any:
    """``ast.parse(source, filename, mode)``, one thread at a time."""
    with _PARSE_LOCK:
        return ast.parse(source, filename=filename, mode=mode)


def _nothing() -> None:
    """What unregistering a callback that already ran does."""


# One lock for every CancelToken: it is held only to read or swap a token's few
# fields, never while calling out, so the tokens of a map's calls share it rather
# than each making its own.
_TOKENS_LOCK = threading.Lock()


class CancelToken:
    """A one-shot, thread-safe cancellation signal with kill callbacks.

    One is made per node step, so it is kept small: the event a waiter sleeps on is
    only created by the first :meth:`wait`, the first callback is kept without a
    list, and the lock is shared."""

    __slots__ = ("_callback", "_cancelled", "_event", "_more", "reason")

    def __init__(self) -> None:
        # The callbacks in the order they were registered: ``_callback`` (if any),
        # then ``_more``.
        self._callback: Callable[[], object] | None = None
        self._more: list[Callable[[], object]] | None = None
        self._event: threading.Event | None = None
        self._cancelled = False
        self.reason: str | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self, reason: str = "cancelled") -> None:
        with _TOKENS_LOCK:
            if self._cancelled:
                return
            self.reason = reason
            self._cancelled = True
            event = self._event
            first, more = self._callback, self._more
            self._callback = self._more = None
        if event is not None:
            event.set()
        if first is not None:
            _call(first)
        for callback in more or ():
            _call(callback)

    def on_cancel(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Run ``callback`` on cancellation (at once if already cancelled).

        Returns a function that unregisters it.
        """
        with _TOKENS_LOCK:
            if not self._cancelled:
                if self._callback is None and not self._more:
                    self._callback = callback
                elif self._more is None:
                    self._more = [callback]
                else:
                    self._more.append(callback)
                return _Unhook(self, callback)
        callback()
        return _nothing

    def _remove(self, callback: Callable[[], object]) -> None:
        with _TOKENS_LOCK:
            if self._callback is not None and self._callback == callback:
                self._callback = None
            elif self._more and callback in self._more:
                self._more.remove(callback)

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until cancelled or ``timeout`` passes; whether it was cancelled."""
        with _TOKENS_LOCK:
            if self._cancelled:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)


def _call(callback: Callable[[], object]) -> None:
    try:
        callback()
    except Exception:  # a failing kill must not stop the others
        pass


class _Unhook:
    """What :meth:`CancelToken.on_cancel` returns: calling it unregisters the
    callback (one small object; a ``functools.partial`` of a bound method is three,
    and an llm request that outlives a collection keeps them all)."""

    __slots__ = ("_callback", "_token")

    def __init__(self, token: CancelToken, callback: Callable[[], object]) -> None:
        self._token = token
        self._callback = callback

    def __call__(self) -> None:
        self._token._remove(self._callback)


class EffectContext(Protocol):
    """The supervisor's side of an effect: where it runs and how it records."""

    run_id: str
    node_id: str
    visit: int
    agent_dir: Path
    cancel: CancelToken

    def record(self, *events: Event) -> None:
        """Append these effect events to the run's log now (durably, in one transaction)."""
        ...


@dataclass
class ListContext:
    """An :class:`EffectContext` that keeps events in a list (for tests and dry runs)."""

    run_id: str = "test-run"
    node_id: str = "node"
    visit: int = 1
    agent_dir: Path = field(default_factory=Path.cwd)
    cancel: CancelToken = field(default_factory=CancelToken)
    events: list[Any] = field(default_factory=list)

    def record(self, *events: Event) -> None:
        self.events.extend(events)


def _light_actor_base() -> type:
    """A stock ``pykka.ThreadingActor`` on a daemon thread (an actor left running
    never keeps the process alive)."""
    import pykka

    class LightActor(pykka.ThreadingActor):
        use_daemon_thread = True

    return LightActor


@functools.cache
def light_actor() -> type:
    """The actor base class of the runtime (built on first use: pykka loads lazily)."""
    return _light_actor_base()
