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

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from graphrun.eventstore.events import Event


def _nothing() -> None:
    """What unregistering a callback that already ran does."""


class CancelToken:
    """A one-shot, thread-safe cancellation signal with kill callbacks.

    One is made per node step, so it is kept small: the event a waiter sleeps on is
    only created by the first :meth:`wait`."""

    __slots__ = ("_callbacks", "_cancelled", "_event", "_lock", "reason")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], object]] = []
        self._event: threading.Event | None = None
        self._cancelled = False
        self.reason: str | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self, reason: str = "cancelled") -> None:
        with self._lock:
            if self._cancelled:
                return
            self.reason = reason
            self._cancelled = True
            event = self._event
            callbacks, self._callbacks = self._callbacks, []
        if event is not None:
            event.set()
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a failing kill must not stop the others
                pass

    def on_cancel(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Run ``callback`` on cancellation (at once if already cancelled).

        Returns a function that unregisters it.
        """
        with self._lock:
            if not self._cancelled:
                self._callbacks.append(callback)
                return _Unhook(self, callback)
        callback()
        return _nothing

    def _remove(self, callback: Callable[[], object]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until cancelled or ``timeout`` passes; whether it was cancelled."""
        with self._lock:
            if self._cancelled:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)


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
