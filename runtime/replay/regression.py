"""Regression against a changed graph, live: ``graphrun replay RUN --graph NEW --live``.

A new run is started on the new graph with the recorded run's initial state and
prompt. For each effect the new run needs, the recorded outcome of the same node
and visit is reused when the request is unchanged: the same kind of task with the
same rendered fields (prompt, system prompt, model, script, the state a script
receives, the question shown) and, for scripts, the same script file. Otherwise
the effect is performed for real and recorded in the new run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from graphrun.eventstore.events import Event, RunStarted
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine import decider
from graphrun.runtime.graph.loader import LoadedGraph
from graphrun.runtime.replay.divergence import RequestKey, check_request, recorded_requests
from graphrun.runtime.replay.sources import Served


@dataclass
class RecordedEffects:
    """Recorded effect outcomes by (node id, visit, branch), served when the request
    matches (a parallel step's branches and a map's items each by their own branch).

    The driver calls :meth:`take` before performing an effect (``RunOptions.effect_source``).
    """

    requests: dict[RequestKey, tuple[Any, list[Event]]]
    reused: list[str] = field(default_factory=list)
    performed: list[str] = field(default_factory=list)

    @classmethod
    def from_events(cls, events: list[Event]) -> RecordedEffects:
        """Index a recorded run's effects by the requests its own graph made."""
        return cls(recorded_requests(events))

    def take(self, step: decider.Perform, visit: int, ctx: Any) -> Served | None:
        """The recorded events answering ``step``, or None to perform it for real."""
        agent_dir = ctx.agent_dir
        branch = getattr(step, "branch", "")
        label = f"{step.node_id}#{visit}" + (f"@{branch}" if branch else "")
        found = self.requests.get((step.node_id, visit, branch))
        if found is None:
            self.performed.append(f"{label} (new)")
            return None
        old_task, outcome = found
        if old_task != step.task:
            self.performed.append(f"{label} (request changed)")
            return None
        if check_request(step, outcome, agent_dir, True) is not None:
            self.performed.append(f"{label} (script changed)")
            return None
        self.reused.append(label)
        return Served([msgspec.structs.replace(e, run_id="", seq=0, ts=0.0) for e in outcome])


@dataclass(frozen=True)
class LiveOutcome:
    """The new run recorded by a live regression, and which effects were re-performed."""

    run_id: str
    status: str
    output: str | None
    error: str | None
    reused: list[str]
    performed: list[str]
    waiting_at: str | None = None  # the node the new run waits at, if it waits


def rerun_live(
    store: SqliteStore,
    run_id: str,
    loaded: LoadedGraph,
    *,
    options: Any = None,
    preflight: bool = True,
) -> LiveOutcome:
    """Run ``loaded`` anew with ``run_id``'s prompt and state, reusing matching effects.

    ``preflight``: check the configuration first (models, keys). Off for
    ``test --update``, where an LLM call is made only if its request changed (a
    missing key then fails that call, with its message)."""
    from graphrun.actors.human.prompt import is_interactive
    from graphrun.runtime.engine.driver import Driver, RunOptions, drive, start_run

    events = store.read(run_id)
    first = events[0]
    assert isinstance(first, RunStarted)
    # Only what the recorded run was seeded with beyond its graph's initial_state
    # (its --set values): the new graph's own initial_state applies as written.
    from graphrun.eventstore.fold import fold
    from graphrun.runtime.engine.driver import graph_of

    seeded = graph_of(fold(events[:1])).graph.initial_state
    overrides = {
        k: v
        for k, v in first.initial_state.items()
        if k != "initial_prompt" and (k not in seeded or seeded[k] != v)
    }
    if options is None:
        from graphrun.runtime.graph.config import agents_dir, config_dir
        from graphrun.runtime.narrate import Narrator, child_narrator

        cfg = config_dir()
        options = RunOptions(
            interactive=is_interactive(),
            listener=Narrator(),
            child_listener=child_narrator,
            config_dir=cfg,
            agents_dir=agents_dir(config=cfg),
        )
    # Bad configuration (unknown model, missing key) fails before anything runs.
    if preflight:
        from graphrun.runtime.graph.preflight import preflight as check

        check(loaded, options)
    recorded = first.config.get("variables")
    if isinstance(recorded, dict):  # the agent variables the recorded run began with
        options.variables = dict(recorded)
    new_id = start_run(
        store,
        loaded,
        prompt=first.initial_prompt,
        overrides=overrides,
        started_by=None,
        config=None if options.variables is None else {"variables": options.variables},
        recorded_from=run_id,
    )
    source = RecordedEffects.from_events(events)
    options.effect_source = source
    outcome = drive(Driver(store, new_id, options))
    return LiveOutcome(
        outcome.run_id,
        outcome.status,
        outcome.output,
        outcome.error,
        source.reused,
        source.performed,
        outcome.waiting.node_id if outcome.waiting is not None else None,
    )


__all__ = ["LiveOutcome", "RecordedEffects", "rerun_live"]
