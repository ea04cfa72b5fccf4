"""CancelToken and TaskOutcome: callbacks in the order they were registered, once,
whatever was unregistered in between; both keep their first callback without a
list and share one lock per class, so these pin what that must not change."""

from __future__ import annotations

import asyncio
import threading

import pytest

from graphrun.actors.base import CancelToken
from graphrun.actors.loop import EffectLoop, TaskOutcome


def test_callbacks_run_once_in_the_order_they_were_registered() -> None:
    token = CancelToken()
    ran: list[str] = []
    for name in ("a", "b", "c"):
        token.on_cancel(lambda name=name: ran.append(name))
    token.cancel("stop")
    token.cancel("again")
    assert ran == ["a", "b", "c"]
    assert token.cancelled and token.reason == "stop"


def test_unhooking_the_first_keeps_the_order_of_the_rest_and_of_later_ones() -> None:
    token = CancelToken()
    ran: list[str] = []
    unhook_a = token.on_cancel(lambda: ran.append("a"))
    token.on_cancel(lambda: ran.append("b"))
    unhook_a()
    token.on_cancel(lambda: ran.append("c"))
    unhook_a()  # a second time: nothing
    token.cancel()
    assert ran == ["b", "c"]


def test_a_token_whose_only_callback_was_unhooked_takes_a_new_first() -> None:
    token = CancelToken()
    ran: list[str] = []
    token.on_cancel(lambda: ran.append("a"))()
    unhook_b = token.on_cancel(lambda: ran.append("b"))
    token.on_cancel(lambda: ran.append("c"))
    unhook_b()
    token.cancel()
    assert ran == ["c"]


def test_the_same_callback_twice_is_unhooked_once_per_unhook() -> None:
    token = CancelToken()
    ran: list[str] = []

    def callback() -> None:
        ran.append("x")

    first = token.on_cancel(callback)
    token.on_cancel(callback)
    first()
    token.cancel()
    assert ran == ["x"]


def test_after_cancel_a_callback_runs_at_once_and_its_unhook_does_nothing() -> None:
    token = CancelToken()
    token.cancel("done")
    ran: list[str] = []
    unhook = token.on_cancel(lambda: ran.append("late"))
    assert ran == ["late"]
    unhook()


def test_a_failing_callback_stops_no_other() -> None:
    token = CancelToken()
    ran: list[str] = []

    def boom() -> None:
        raise RuntimeError("kill failed")

    token.on_cancel(boom)
    token.on_cancel(lambda: ran.append("after"))
    token.cancel()
    assert ran == ["after"]


def test_wait_wakes_when_another_thread_cancels() -> None:
    token = CancelToken()
    assert token.wait(0.01) is False
    threading.Timer(0.05, token.cancel, args=("from a thread",)).start()
    assert token.wait(5) is True
    assert token.reason == "from a thread"


def test_task_outcome_tells_every_callback_in_order_and_late_ones_at_once() -> None:
    loop = EffectLoop("test-outcome")
    try:
        gate = threading.Event()

        async def work() -> None:
            while not gate.is_set():
                await asyncio.sleep(0.005)
            raise ValueError("the effect failed")

        outcome = loop.start(work())
        told: list[tuple[str, BaseException | None]] = []
        for name in ("first", "second", "third"):
            outcome.add_done_callback(lambda o, name=name: told.append((name, o.exception())))
        assert not outcome.done()
        with pytest.raises(Exception, match="has not ended"):
            outcome.exception()
        gate.set()
        assert outcome.wait(5)
        assert [name for name, _ in told] == ["first", "second", "third"]
        assert all(isinstance(exc, ValueError) for _, exc in told)
        outcome.add_done_callback(lambda o: told.append(("late", o.exception())))
        assert told[-1][0] == "late"
    finally:
        loop.stop()


def test_a_cancelled_task_ends_its_outcome_with_the_cancellation() -> None:
    loop = EffectLoop("test-outcome-cancel")
    try:

        async def forever() -> None:
            await asyncio.sleep(60)

        outcome = loop.start(forever())
        assert isinstance(outcome, TaskOutcome)
        loop.cancel_all()
        assert outcome.wait(5)
        assert isinstance(outcome.exception(), asyncio.CancelledError)
    finally:
        loop.stop()


def test_start_many_wakes_the_loop_once_and_starts_each_in_order() -> None:
    """A fill hands its effects to the loop together: one wake-up of the loop from
    another thread, the tasks started in the order given, each outcome its own; from
    the loop's own thread they are started at once."""
    loop = EffectLoop("test-start-many")
    try:
        started: list[int] = []

        async def work(i: int) -> None:
            started.append(i)
            if i == 2:
                raise ValueError("the third failed")

        wakeups = 0
        call_soon_threadsafe = loop.loop.call_soon_threadsafe

        def counted(*args: object) -> object:
            nonlocal wakeups
            wakeups += 1
            return call_soon_threadsafe(*args)  # type: ignore[arg-type]

        loop.loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        outcomes = loop.start_many([work(i) for i in range(5)])
        assert all(o.wait(5) for o in outcomes)
        assert wakeups == 1
        assert started == [0, 1, 2, 3, 4]
        assert [type(o.exception()).__name__ for o in outcomes] == [
            "NoneType",
            "NoneType",
            "ValueError",
            "NoneType",
            "NoneType",
        ]

        async def from_the_loop() -> list[TaskOutcome]:
            return loop.start_many([work(i) for i in (10, 11)])

        inner = loop.submit(from_the_loop()).result(5)
        assert all(o.wait(5) for o in inner) and started[-2:] == [10, 11]
        # Started on the loop's own thread: no wake-up but the submit's own.
        assert wakeups == 2
    finally:
        loop.stop()


def test_begin_stop_returns_at_once_and_stop_waits_for_what_was_kept_to_close() -> None:
    """A driver begins stopping its loop before its last commit: the pooled session
    closes on the loop meanwhile (tasks still running are cancelled first), and
    :meth:`EffectLoop.stop` then waits for all of it and ends the thread."""
    loop = EffectLoop("test-begin-stop")
    closing = threading.Event()
    closed = threading.Event()

    class Pool:
        async def close(self) -> None:
            closing.set()
            await asyncio.sleep(0.3)
            closed.set()

    loop.keep("pool", Pool)

    async def forever() -> None:
        await asyncio.sleep(60)

    outcome = loop.start(forever())
    loop.begin_stop()
    assert loop.stopped
    assert closing.wait(5)
    assert not closed.is_set()  # begin_stop did not wait for the close
    loop.begin_stop()  # a second call changes nothing
    loop.stop()
    assert closed.is_set()
    assert outcome.done() and isinstance(outcome.exception(), asyncio.CancelledError)
    assert not loop._thread.is_alive()
    assert loop.loop.is_closed()
    loop.stop()  # and stopping again is no error


def test_an_effect_handed_to_a_stopped_loop_ends_cancelled_at_once() -> None:
    """Started after the loop stopped (a child run's next step, as its parent ends):
    its outcome ends cancelled at once, the coroutine closed, never run."""
    loop = EffectLoop("test-stopped")
    loop.stop()
    ran: list[str] = []

    async def work() -> None:
        ran.append("ran")

    coro = work()
    outcome = loop.start(coro)
    assert outcome.wait(2)
    assert isinstance(outcome.exception(), asyncio.CancelledError)
    assert coro.cr_frame is None and not ran  # closed: no "never awaited" warning
    with pytest.raises(RuntimeError, match="stopped"):
        loop.submit(work()).result(timeout=2)


def test_effects_handed_over_while_the_loop_stops_all_end() -> None:
    """Handed to the loop from another thread while it stops: each one either runs
    or ends cancelled; none is left waiting for a loop that will not run it."""

    async def work() -> None:
        await asyncio.sleep(0)

    def hand_over(loop: EffectLoop, going: threading.Event, outcomes: list[TaskOutcome]) -> None:
        going.set()
        for _ in range(200):
            outcomes.extend(loop.start_many([work(), work()]))

    for _ in range(20):
        loop = EffectLoop("test-stopping")
        outcomes: list[TaskOutcome] = []
        going = threading.Event()
        feeder = threading.Thread(target=hand_over, args=(loop, going, outcomes))
        feeder.start()
        going.wait()
        loop.stop()
        feeder.join()
        assert all(outcome.wait(2) for outcome in outcomes)
