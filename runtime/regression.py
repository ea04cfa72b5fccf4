"""Regression against a changed graph, live: ``graphrun replay RUN --graph NEW --live``.

A new run is started with the recorded run's initial state and prompt on the new
graph. For each effect the new run needs, the recorded outcome of the same node
and visit is reused when its request is unchanged; otherwise the effect is
performed for real and recorded in the new run.
"""

from __future__ import annotations

import msgspec

from graphrun.eventstore.events import Event, NodeEntered, RunStarted
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime import decider
from graphrun.runtime.loader import LoadedGraph
from graphrun.runtime.replay import EFFECTS, check_request


class RecordedEffects:
    """Recorded effect outcomes by (node id, visit), served when the request matches."""

    def __init__(self, events: list[Event]) -> None:
        self.by_visit: dict[tuple[str, int], list[Event]] = {}
        current: tuple[str, int] | None = None
        for event in events:
            if isinstance(event, NodeEntered):
                current = (event.node_id, event.visit)
            elif isinstance(event, EFFECTS) and current is not None:
                self.by_visit.setdefault(current, []).append(event)
        self.reused = 0
        self.performed = 0

    def take(self, step: decider.Perform, visit: int, agent_dir: object) -> list[Event] | None:
        outcome = self.by_visit.get((step.node_id, visit))
        if not outcome:
            self.performed += 1
            return None
        if check_request(step, outcome, agent_dir, True) is not None:  # type: ignore[arg-type]
            self.performed += 1
            return None
        self.reused += 1
        return [msgspec.structs.replace(e, run_id="", seq=0, ts=0.0) for e in outcome]


def rerun_live(store: SqliteStore, run_id: str, loaded: LoadedGraph) -> object:
    from graphrun.actors.human import is_interactive
    from graphrun.runtime.narrate import Narrator
    from graphrun.runtime.supervisor import Driver, RunOptions, drive, start_run

    events = store.read(run_id)
    first = events[0]
    assert isinstance(first, RunStarted)
    overrides = {k: v for k, v in first.initial_state.items() if k != "initial_prompt"}
    new_id = start_run(
        store, loaded, prompt=first.initial_prompt, overrides=overrides, started_by=None
    )
    options = RunOptions(interactive=is_interactive(), listener=Narrator())
    options.effect_source = RecordedEffects(events)
    return drive(Driver(store, new_id, options))
