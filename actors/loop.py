"""The event loop a run's effects are awaited on.

Every effect is a coroutine (``async def run(task, ctx)``) started on an
:class:`EffectLoop`: an asyncio loop on a daemon thread of its own. An LLM request
is awaited on it (aiohttp), a script's or a tool's process is watched from it (its
pipes and its pidfd), an MCP call is awaited on it (the run's MCP sessions live
there, kept with :meth:`EffectLoop.keep`), and a wait between attempts is an
asyncio wait: none of them holds a thread, nor does an agent node awaiting its
child run (driven by a supervisor of its own). Work that can only block (a store
commit, loading a toolbox, loading a vector index, asking a person, starting a
child run) is handed to the run's bounded executor with :func:`blocking`, never
done on the loop itself.

One loop serves a run and its child runs; a worker keeps one for every run it
drives (and its connection pool with it). Nothing here touches the process's
event-loop policy, its signal handlers or its default executor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How long stopping a loop waits for one kept object to close (a pooled session).
_CLOSE_SECONDS = 10.0

#: A coroutine handed over with :meth:`EffectLoop.submit`, and its future.
_Submitted = tuple[Coroutine[Any, Any, Any], concurrent.futures.Future[Any]]


class EffectLoop:
    """An asyncio event loop on a daemon thread of its own.

    ``shared`` holds what the loop's users keep for its life (a pooled HTTP
    session): :meth:`keep` makes it once; :meth:`stop` closes what has an async
    ``close``."""

    def __init__(self, name: str = "graphrun-effects") -> None:
        self.loop = asyncio.new_event_loop()
        self._shared: dict[Any, Any] = {}
        self._lock = threading.Lock()
        self.stopped = False
        self._winding_down: threading.Event | None = None
        # What other threads handed over and the loop has not started yet (refused,
        # each waiter told, if it never will), and whether the loop's thread is over.
        self._handed: set[_Handed] = set()
        self._submitted: set[_Submitted] = set()
        self._over = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """The loop's thread: the loop until it stops, then whatever is left ended, so
        that nobody waits for a task the loop will never run."""
        try:
            self.loop.run_forever()
        finally:
            with contextlib.suppress(Exception):  # (a task that will not end, say)
                _drain(self.loop)
            with self._lock:
                self._over = True
                handed, self._handed = self._handed, set()
                submitted, self._submitted = self._submitted, set()
            for batch in handed:
                batch.refuse()
            for coro, future in submitted:
                if future.cancel() and _not_started(coro):
                    coro.close()

    def on_loop(self) -> bool:
        """Whether the caller runs on the loop's own thread."""
        return threading.get_ident() == self._thread.ident

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop (from another thread); cancelling the future cancels
        it. Should the loop stop before running it, the future is cancelled.

        Raises:
            RuntimeError: the loop has stopped (``coro`` is closed, never run).
        """
        with self._lock:
            over = self._over
            if not over:
                future = asyncio.run_coroutine_threadsafe(coro, self.loop)
                pair = (coro, future)
                self._submitted.add(pair)
        if over:
            coro.close()
            raise RuntimeError("the run's event loop has stopped")
        # (Outside the lock: a future done already calls back at once, here.)
        future.add_done_callback(lambda _: self._forget(pair))
        return future

    def _forget(self, pair: Any) -> None:
        with self._lock:
            self._submitted.discard(pair)

    def start(self, coro: Coroutine[Any, Any, Any]) -> TaskOutcome:
        """Run ``coro`` as a task on the loop; the outcome completes with it.

        The task completes the outcome itself as it ends, so whoever is told of it
        (a callback starting the next effect) hears of it in the same loop
        iteration, not one later. Started from the loop's own thread (an effect
        finishing starts the next), the task is created at once, not via the loop's
        wake-up pipe."""
        return self.start_many([coro])[0]

    def start_many(self, coros: list[Coroutine[Any, Any, Any]]) -> list[TaskOutcome]:
        """:meth:`start` for each of ``coros``, handed to the loop in one wake-up
        (from another thread) rather than one each."""
        pairs = [(coro, TaskOutcome()) for coro in coros]

        def create() -> None:
            for coro, outcome in pairs:
                self.loop.create_task(_into(coro, outcome))

        if self.on_loop():  # (the loop is running: it cannot stop meanwhile)
            create()
            return [outcome for _, outcome in pairs]
        # From another thread: started by the loop unless it is stopping by then.
        handed = _Handed(coros, [outcome for _, outcome in pairs])

        def start() -> None:
            with self._lock:
                taken = handed in self._handed and self._winding_down is None
                self._handed.discard(handed)
            if taken:
                create()
            else:
                handed.refuse()

        with self._lock:
            over = self._over
            if not over:
                self._handed.add(handed)
                with contextlib.suppress(RuntimeError):  # closed: refused at the end
                    self.loop.call_soon_threadsafe(start)
        if over:
            handed.refuse()
        return handed.outcomes

    def keep(self, key: Any, make: Callable[[], T]) -> T:
        """The object kept under ``key`` for the loop's life (``make()`` on first use;
        called on the loop's thread when the object must be made there)."""
        with self._lock:
            found = self._shared.get(key)
            if found is None:
                found = self._shared[key] = make()
            return found

    def cancel_all(self) -> None:
        """Cancel every task still on the loop (each ends as cancelled at once)."""

        async def cancel_the_rest() -> None:
            _cancel_others()

        with contextlib.suppress(Exception):
            self.submit(cancel_the_rest()).result(timeout=10)

    def begin_stop(self) -> None:
        """Start stopping, without waiting: on the loop itself, cancel what is left,
        close what was kept (each close bounded), then stop the loop. Its thread
        winds down while the caller goes on (a driver writing its last commit);
        :meth:`stop` waits for it. Idempotent."""
        with self._lock:
            if self._winding_down is not None:
                return
            kept, self._shared = list(self._shared.values()), {}
            self._winding_down = threading.Event()
        self.stopped = True
        done = self._winding_down

        async def wind_down() -> None:
            try:
                _cancel_others()
                for thing in kept:
                    close = getattr(thing, "close", None)
                    if close is not None and asyncio.iscoroutinefunction(close):
                        with contextlib.suppress(Exception):
                            await asyncio.wait_for(close(), _CLOSE_SECONDS)
            finally:
                asyncio.get_running_loop().stop()
                done.set()

        try:
            asyncio.run_coroutine_threadsafe(wind_down(), self.loop)
        except RuntimeError:  # the loop is closed already: nothing is left to close
            done.set()

    def stop(self) -> None:
        """Cancel what is left, close what was kept, stop the loop and its thread
        (:meth:`begin_stop`, then wait for it)."""
        self.begin_stop()
        assert self._winding_down is not None
        self._winding_down.wait(_CLOSE_SECONDS * 2)
        self._thread.join(timeout=_CLOSE_SECONDS)
        if not self._thread.is_alive() and not self.loop.is_closed():
            self.loop.close()


def _cancel_others() -> None:
    """Cancel every task on the running loop but the one calling, and but those not
    started yet (a cancel would reach one before it could tell whoever waits on it:
    :func:`_drain` ends them once they have started)."""
    me = asyncio.current_task()
    for task in asyncio.all_tasks():
        if task is not me and not _not_started(task.get_coro()):
            task.cancel()


def _not_started(coro: Any) -> bool:
    """Whether ``coro`` is a coroutine that has not begun running."""
    try:
        return inspect.getcoroutinestate(coro) == inspect.CORO_CREATED
    except AttributeError:  # not a native coroutine: taken as begun
        return False


def _drain(loop: asyncio.AbstractEventLoop) -> None:
    """After ``loop`` stopped: the tasks still on it are started (their first step),
    cancelled and let end, bounded (as ``asyncio.run`` does as it closes a loop)."""
    for _ in range(3):  # (a task ending may start another)
        left = asyncio.all_tasks(loop)
        if not left:
            return
        loop.run_until_complete(_end_all(left))


async def _end_all(tasks: set[asyncio.Task[Any]]) -> None:
    await asyncio.sleep(0)  # those not started yet take their first step
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks, timeout=_CLOSE_SECONDS)


class _Handed:
    """Coroutines another thread handed to a loop, and their outcomes: refused (each
    closed unrun, each outcome ended cancelled) if the loop stops first."""

    __slots__ = ("coros", "outcomes")

    def __init__(self, coros: list[Coroutine[Any, Any, Any]], outcomes: list[TaskOutcome]) -> None:
        self.coros = coros
        self.outcomes = outcomes

    def refuse(self) -> None:
        for coro in self.coros:
            coro.close()
        for outcome in self.outcomes:
            outcome._end(asyncio.CancelledError("the run's event loop has stopped"))


# One lock for every TaskOutcome: it is held only to read or swap an outcome's few
# fields, never while calling out, so the outcomes of a map's calls share it rather
# than each making its own.
_OUTCOMES_LOCK = threading.Lock()


class TaskOutcome:
    """How a task started by :meth:`EffectLoop.start` ended, for whoever is told or
    waits: the part of ``concurrent.futures.Future`` the driver uses
    (``add_done_callback``, ``done``, ``exception``, ``wait``), without the
    condition variable a ``Future`` makes for waiters (a map makes one per call and
    nobody waits on them: the event a waiter sleeps on is made by the first
    :meth:`wait`; the first callback is kept without a list, and the lock is shared).
    A cancelled task ends with its ``CancelledError`` as the exception."""

    __slots__ = ("_callback", "_done", "_event", "_exception", "_more")

    def __init__(self) -> None:
        self._callback: Callable[[TaskOutcome], object] | None = None
        self._more: list[Callable[[TaskOutcome], object]] | None = None
        self._done = False
        self._exception: BaseException | None = None
        self._event: threading.Event | None = None

    def add_done_callback(self, fn: Callable[[TaskOutcome], object]) -> None:
        """Call ``fn(outcome)`` when the task ends (on the loop's thread), or now if it has."""
        with _OUTCOMES_LOCK:
            if not self._done:
                if self._callback is None:
                    self._callback = fn
                elif self._more is None:
                    self._more = [fn]
                else:
                    self._more.append(fn)
                return
        fn(self)

    def done(self) -> bool:
        return self._done

    def exception(self) -> BaseException | None:
        if not self._done:
            raise concurrent.futures.InvalidStateError("the task has not ended")
        return self._exception

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until the task ends or ``timeout`` passes; whether it ended."""
        with _OUTCOMES_LOCK:
            if self._done:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def _end(self, exception: BaseException | None) -> None:
        with _OUTCOMES_LOCK:
            self._exception, self._done = exception, True
            first, more = self._callback, self._more
            self._callback = self._more = None
            event = self._event
        if event is not None:
            event.set()
        if first is not None:
            self._call(first)
        for fn in more or ():
            self._call(fn)

    def _call(self, fn: Callable[[TaskOutcome], object]) -> None:
        try:
            fn(self)
        except Exception:  # as concurrent.futures does: one callback's bug stops no other
            log.exception("a callback of a loop task raised")


async def _into(coro: Coroutine[Any, Any, Any], outcome: TaskOutcome) -> None:
    """Await ``coro`` and hand how it ended to ``outcome`` (its result is recorded by
    the effect itself, so only an exception is kept)."""
    try:
        await coro
    except asyncio.CancelledError as exc:
        outcome._end(exc)
        raise
    except BaseException as exc:
        outcome._end(exc)
    else:
        outcome._end(None)


async def blocking(ctx: Any, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the bounded executor of the run ``ctx`` belongs to (the
    context's ``executor``; without one, the loop's default executor), awaited: the
    loop goes on serving the other effects meanwhile."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(getattr(ctx, "executor", None), fn, *args)


async def perform_blocking(effect: Any, task: Any, ctx: Any) -> Any:
    """An effect that only has a blocking ``perform(task, ctx)``, run as an awaitable."""
    return await blocking(ctx, effect.perform, task, ctx)


def runner(effect: Any) -> Callable[[Any, Any], Coroutine[Any, Any, Any]]:
    """What awaits one of ``effect``'s visits: its ``run`` coroutine function, or
    its blocking ``perform`` on the executor."""
    run = getattr(effect, "run", None)
    if run is not None and asyncio.iscoroutinefunction(run):
        return run
    return lambda task, ctx: perform_blocking(effect, task, ctx)


__all__ = ["EffectLoop", "TaskOutcome", "blocking", "perform_blocking", "runner"]
