"""A super-step's slots when the run's loop refuses the effects a fill starts: each
effect fails with the loop's error and the step goes on (it is told of each), as
when making one effect fails; nothing is left counted as running."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from graphrun.actors.base import CancelToken
from graphrun.runtime.engine.driver import _Context, _Slots
from graphrun.runtime.nodes.plan import Perform


class _GoneLoop:
    def start_many(self, coros: list[Any]) -> list[Any]:
        raise RuntimeError("Event loop is closed")


class _Driver:
    """What _Slots asks of its driver."""

    def __init__(self) -> None:
        self.effect_loop = _GoneLoop()
        self._tokens: set[CancelToken] = set()
        self.interrupted = None
        self.cancel = CancelToken()
        self.made: list[Any] = []
        self.run_id, self.agent_dir, self.options = "r", None, SimpleNamespace()

    def _effect_of(self, task: Perform, token: CancelToken) -> tuple[Any, _Context]:
        async def effect() -> None:
            await asyncio.sleep(0)

        coro = effect()
        self.made.append(coro)
        return coro, _Context(self, task.node_id, 1, branch=task.branch, cancel=token)  # type: ignore[arg-type]


def test_a_loop_that_refuses_the_starts_fails_each_effect_and_the_step_goes_on() -> None:
    driver = _Driver()
    tasks = [Perform("item", "llm", None, f"m[{i}]", "m", 2) for i in range(3)]
    slots = _Slots(driver, {"": 4, "m": 2}, tasks)  # type: ignore[arg-type]
    slots.fill()
    done = slots.finished(1.0)
    # The two the cap allowed failed as they started; their freed slots started the
    # third, which failed the same way, in the same fill.
    assert [t.branch for t, *_ in done] == ["m[0]", "m[1]", "m[2]"]
    assert all(isinstance(f.exception(), RuntimeError) for *_, f in done)
    assert all(c.cr_frame is None for c in driver.made)  # closed, never left un-awaited
    assert not slots.outstanding() and slots.in_group == {"": 0, "m": 0}
