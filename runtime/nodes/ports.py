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
from typing import TYPE_CHECKING, Any, Protocol

from graphrun.actors.base import CancelToken

if TYPE_CHECKING:
    from graphrun.eventstore.events import Event
    from graphrun.eventstore.fold import RunState
    from graphrun.runtime.graph.loader import LoadedGraph
    from graphrun.runtime.graph.model import Graph


@dataclass
class RunOptions:
    """How a run is driven (none of this changes what the decider decides)."""

    answers: dict[str, list[str]] = field(default_factory=dict)  # node id -> answers, in order
    as_user: str | None = None
    interactive: bool = False
    agents_dir: Path | None = None
    config_dir: Path | None = None
    llm_replay: list[Any] | None = None  # recorded LlmCalled events to serve (--llm-replay)
    listener: Callable[[list[Event], RunState], None] | None = None
    # Makes the listener of a child run (an agent node's), when the run has a listener.
    child_listener: Callable[[], Callable[[list[Event], RunState], None]] | None = None
    # Recorded effect outcomes to reuse instead of performing (replay --live, fork).
    effect_source: Any = None
    # The agent variables the run was started with (None: not resolved here).
    variables: dict[str, str] | None = None
    # Node types -> actor factories, filled in by graphrun.runtime.engine.effects.
    extra: dict[str, Any] = field(default_factory=dict)
    # The allowed_signers file recorded answers are checked against (--signers; else
    # found next to the graph, then in the config directory).
    signers: Path | None = None
    # The event loop (an ``actors.loop.EffectLoop``) to await the run's effects on:
    # a worker's, kept for every run it drives, or a parent run's for its children.
    # None: the run makes its own and stops it when it stops.
    effect_loop: Any = None


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


class ChildLauncher(Protocol):
    """How an agent node starts and drives its child runs: the engine implements it,
    so a node never builds a driver."""

    def check(self, loaded: LoadedGraph) -> None:
        """Validate a child's graph before it runs (raises on errors)."""

    def start(
        self, loaded: LoadedGraph, *, prompt: str, node_id: str, run_id: str, variables: Any
    ) -> None:
        """Record the child run's ``RunStarted`` (it is not driven yet)."""

    def drive(self, child_id: str, knowledge: dict[str, Any] | None, token: CancelToken) -> Any:
        """Drive the child run to its end or its wait; returns its outcome."""

    def driver(self, child_id: str, knowledge: dict[str, Any] | None, token: CancelToken) -> Any:
        """The child run's driver, for :meth:`drive_async` (reads the store: blocks)."""

    async def drive_async(self, child: Any, token: CancelToken) -> Any:
        """Drive ``child`` in a supervisor of its own; awaits its outcome, no thread held."""


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
    launcher: ChildLauncher  # starts and drives child runs (agent nodes)
    loop: Any = None  # the run's EffectLoop (its effects are awaited on it)


__all__ = ["ChildLauncher", "ChildRuns", "RunOptions", "RunPorts"]
