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

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from graphrun.eventstore.events import Event


class CancelToken:
    """A one-shot, thread-safe cancellation signal with kill callbacks."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self.reason: str | None = None

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, reason: str = "cancelled") -> None:
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a failing kill must not stop the others
                pass

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` on cancellation (at once if already cancelled).

        Returns a function that unregisters it.
        """
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)

                def remove() -> None:
                    with self._lock:
                        if callback in self._callbacks:
                            self._callbacks.remove(callback)

                return remove
        callback()
        return lambda: None

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)


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


class NodeActor:
    """Base of the per-node-type actors: ``ask(Execute(task, ctx))`` performs one effect.

    Subclasses set :meth:`perform`. The reply is whatever ``perform`` returns; an
    exception travels back through the future to the supervisor, which records it
    as the node's failure (an actor is only ever asked, never told, so no failure
    is silent).
    """

    node_type: str = ""

    def perform(self, task: Any, ctx: EffectContext) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} does not perform effects")


def start_actor(cls: type, *args: Any, **kwargs: Any) -> Any:
    """Start a pykka actor whose ``on_receive`` calls ``cls.perform``."""
    import pykka

    from graphrun.actors.messages import Execute

    class _Actor(pykka.ThreadingActor):  # type: ignore[misc]
        use_daemon_thread = True

        def __init__(self) -> None:
            super().__init__()
            self.impl = cls(*args, **kwargs)

        def on_stop(self) -> None:
            # Actors that hold resources (HTTP pools, MCP sessions) release them here.
            close = getattr(self.impl, "close", None)
            if close is not None:
                close()

        def on_receive(self, message: Any) -> Any:
            if isinstance(message, Execute):
                return self.impl.perform(message.task, message.ctx)
            raise TypeError(f"{cls.__name__} got an unexpected message {message!r}")

    _Actor.__name__ = _Actor.__qualname__ = cls.__name__
    return _Actor.start()
