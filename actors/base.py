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


class CancelToken:
    """A one-shot, thread-safe cancellation signal with kill callbacks.

    One is made per node step, so it is kept small: the event a waiter sleeps on is
    only created by the first :meth:`wait`."""

    __slots__ = ("_callbacks", "_cancelled", "_event", "_lock", "reason")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
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

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` on cancellation (at once if already cancelled).

        Returns a function that unregisters it.
        """
        with self._lock:
            if not self._cancelled:
                self._callbacks.append(callback)

                def remove() -> None:
                    with self._lock:
                        if callback in self._callbacks:
                            self._callbacks.remove(callback)

                return remove
        callback()
        return lambda: None

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until cancelled or ``timeout`` passes; whether it was cancelled."""
        with self._lock:
            if self._cancelled:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)


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
    """A ``pykka.ThreadingActor`` with a C ``SimpleQueue`` inbox and one-lock futures.

    Both go through pykka's own seams (``_create_actor_inbox`` returns anything with
    pykka's ``ActorInbox`` protocol: put, get, empty; ``_create_future`` any
    ``pykka.Future``). The stock inbox is a ``queue.Queue`` (three conditions) and
    the stock future a condition per ask; a supervisor asks once per node step, and
    on one CPU those were half the cost of the hand-off.
    """
    import queue
    import sys

    import pykka

    class LatchFuture(pykka.Future):  # type: ignore[misc,type-arg]
        """A future set once: a lock held until the result is in."""

        def __init__(self) -> None:
            super().__init__()
            self._latch = threading.Lock()
            self._latch.acquire()
            self._result: tuple[Any, Any] | None = None

        def get(self, *, timeout: float | None = None) -> Any:
            if self._get_hook is not None:  # set by pykka's future combinators
                return super().get(timeout=timeout)
            if self._result is None:
                wait = -1 if timeout is None else max(0.0, timeout)
                if not self._latch.acquire(timeout=wait):
                    raise pykka.Timeout(f"{timeout} seconds")
                self._latch.release()  # let any other getter through
            assert self._result is not None
            value, exc_info = self._result
            if exc_info is not None:
                exc_type, exc_value, exc_traceback = exc_info
                if exc_value is None:
                    exc_value = exc_type()
                raise exc_value.with_traceback(exc_traceback)
            return value

        def _settle(self, result: tuple[Any, Any]) -> None:
            if self._result is not None or self._get_hook is not None:
                raise queue.Full
            self._result = result
            self._latch.release()

        def set(self, value: Any = None) -> None:
            self._settle((value, None))

        def set_exception(self, exc_info: Any = None) -> None:
            self._settle((None, exc_info or sys.exc_info()))

        def set_get_hook(self, func: Any) -> None:
            if self._result is not None:
                raise queue.Full
            super().set_get_hook(func)

    class LightActor(pykka.ThreadingActor):  # type: ignore[misc]
        use_daemon_thread = True

        @staticmethod
        def _create_actor_inbox() -> Any:
            return queue.SimpleQueue()

        @staticmethod
        def _create_future() -> Any:
            return LatchFuture()

    return LightActor


@functools.cache
def light_actor() -> type:
    """The actor base class of the runtime (built on first use: pykka loads lazily)."""
    return _light_actor_base()


def start_actor_around(impl: Any) -> Any:
    """Start a pykka actor around ``impl``, a node type's effect object.

    The actor answers ``ask(Execute(task, ctx))`` by calling ``impl.perform(task, ctx)``.
    An exception travels back through the future to the supervisor, which records it
    as the node's failure (actors are only ever asked, never told, so no failure is
    silent). ``impl.close()``, if it has one, runs when the actor stops.
    """
    return _actor_class(type(impl)).start(impl)


@functools.cache
def _actor_class(cls: type) -> type:
    """The pykka actor class around effect class ``cls`` (one per class, made once)."""
    from graphrun.actors.messages import Execute

    class _Actor(light_actor()):  # type: ignore[misc]
        def __init__(self, impl: Any) -> None:
            super().__init__()
            self.impl = impl

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
    return _Actor


# --- CPU affinity and scheduling ----------------------------------------------------
#
# The runtime's work is sequential: the supervisor asks one actor at a time. A pykka
# ask between threads on different CPUs costs ~90 µs here, ~13 µs on one CPU, so the
# CLI confines the runtime to one CPU (confine_to_one_cpu). On one CPU, a thread woken
# by an ask (or by its answer) would preempt the thread that woke it, only to find the
# GIL still held and sleep again; under SCHED_BATCH a woken thread waits for the
# waker to block, which halves the cost of an ask (17 -> 10 µs here). What graphrun
# starts (scripts, tools, MCP servers) gets every CPU and the normal policy back:
# they are spawned inside all_cpus(), and Linux children inherit the spawning
# thread's mask and policy.

_process_cpus: set[int] | None = None


def confine_to_one_cpu() -> bool:
    """Pin the calling thread (and the threads it starts later) to one CPU.

    Off with ``GRAPHRUN_NO_PIN=1``. The CPU is chosen by pid, so several graphrun
    processes spread out. Returns whether it pinned.
    """
    import os

    global _process_cpus
    getter = getattr(os, "sched_getaffinity", None)
    setter = getattr(os, "sched_setaffinity", None)
    if getter is None or setter is None or os.environ.get("GRAPHRUN_NO_PIN"):
        return False
    cpus = sorted(getter(0))
    if _process_cpus is None:
        _process_cpus = set(cpus)
    if len(cpus) < 2:
        return False
    try:
        setter(0, {cpus[os.getpid() % len(cpus)]})
    except OSError:
        return False
    batch_scheduling()
    return True


def batch_scheduling() -> None:
    """Run the calling thread (and threads it starts later) under SCHED_BATCH."""
    import os

    batch = getattr(os, "SCHED_BATCH", None)
    if batch is None or not hasattr(os, "sched_setscheduler"):
        return
    try:
        os.sched_setscheduler(0, batch, os.sched_param(0))
    except OSError:
        pass


def settle_heap() -> None:
    """Take every object alive now out of the cyclic garbage collector's rounds.

    Called by the CLI once a run's modules are imported and its graph is loaded,
    just before driving it (like the CPU pinning, a policy of the process, not of
    the library). A run allocates steadily, so full collections come round often,
    and each would walk the few hundred thousand objects of the imported modules
    again: about a fifth of a replayed llm step here. Objects freed by reference
    counting are freed as before, and cycles made later are collected as before;
    only objects alive now that later end up in a garbage cycle stay until the
    process exits, which for one CLI command is what happens anyway.
    """
    import gc

    gc.freeze()
    # And collect the young generation every 5,000 allocations rather than 700: a
    # step allocates a few hundred containers, nearly all freed by reference
    # counting, so the default runs a collection every other step for nothing.
    gc.set_threshold(5000, 10, 10)


class all_cpus:
    """Within this block the calling thread may run on every CPU the process had,
    so a process spawned here is not confined."""

    def __enter__(self) -> None:
        import os

        self._before = None
        self._policy: int | None = None
        if _process_cpus is None or not hasattr(os, "sched_setaffinity"):
            return
        if os.sched_getscheduler(0) == getattr(os, "SCHED_BATCH", None):
            try:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
                self._policy = os.SCHED_BATCH
            except OSError:
                pass
        before = os.sched_getaffinity(0)
        if before != _process_cpus:
            try:
                os.sched_setaffinity(0, _process_cpus)
            except OSError:
                return
            self._before = before

    def __exit__(self, *exc: object) -> None:
        import os

        if self._before is not None:
            os.sched_setaffinity(0, self._before)
        if self._policy is not None:
            os.sched_setscheduler(0, self._policy, os.sched_param(0))
