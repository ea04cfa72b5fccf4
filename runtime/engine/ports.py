"""What a run hands the effects of its nodes: ports, never the driver itself.

An effect (an llm, rag or agent node's actor, a script runner) gets a
:class:`RunPorts` when the run makes it: the run's identity, its graph and agent
directory, the options it was started with, the store (an agent node starts its
child run there) and the run's child registry. Nothing in it can drive, commit or
decide: those stay with the driver, which is why an effect cannot depend on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphrun.actors.base import CancelToken

if TYPE_CHECKING:
    from graphrun.runtime.engine.driver import RunOptions
    from graphrun.runtime.graph.model import Graph


@dataclass
class ChildRuns:
    """The child runs an agent node of this run is driving, by child run id: their
    cancel tokens and drivers, so that ending or interrupting the parent reaches
    them; and whether the parent was interrupted (a child started after that is
    interrupted at once)."""

    tokens: dict[str, CancelToken] = field(default_factory=dict)
    drivers: dict[str, Any] = field(default_factory=dict)
    interrupted: Callable[[], tuple[str, str] | None] = lambda: None

    def attach(self, child_id: str, token: CancelToken, driver: Any) -> None:
        self.tokens[child_id] = token
        self.drivers[child_id] = driver
        stop = self.interrupted()
        if stop is not None:
            driver.interrupt(*stop)

    def detach(self, child_id: str) -> None:
        self.tokens.pop(child_id, None)
        self.drivers.pop(child_id, None)


@dataclass(frozen=True)
class RunPorts:
    """What the effects of one run may use."""

    run_id: str
    graph: Graph
    agent_dir: Path
    options: RunOptions
    store: Any  # the run's Store (an agent node records its child run there)
    scratch: Callable[[], Path]  # the run's scratch directory, made on first use
    children: ChildRuns


__all__ = ["ChildRuns", "RunPorts"]
