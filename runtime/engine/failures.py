"""Unhandled failures: what a run that failed on its way to the end ends as.

Loki's rule stays: a script or llm node that fails without a ``fallback`` routes on
to ``next``. Such a failure is *unhandled*; what it makes of the run is the graph's
``settings.on_unhandled_failure``:

* ``completed_with_errors`` (default): the run routes on as Loki does, and its
  ``RunCompleted`` names every unhandled failure (status ``completed_with_errors``);
* ``continue``: a plain ``completed`` (Loki's own behaviour);
* ``fail``: the first unhandled failure fails the run there.

Pure, like the decider it belongs to: everything it judges is in the graph and the
folded state.
"""

from __future__ import annotations

from typing import Any

import msgspec

from graphrun.eventstore.events import Event, NodeCompleted, NodeFailed, RunCompleted, RunFailed
from graphrun.eventstore.fold import RunState
from graphrun.eventstore.projections import unhandled_summary
from graphrun.runtime.graph.model import Graph
from graphrun.runtime.graph.routing import failure_handled

#: The one predicate of what "handled" means (``runtime/graph/routing.py``).
handled = failure_handled


def _unhandled(graph: Graph, failure: tuple[str, int, str, str | None]) -> bool:
    node_id, _, _, routed_to = failure
    return not handled(graph.nodes.get(node_id), routed_to)


def apply_policy(graph: Graph, events: tuple[Event, ...], state: RunState) -> tuple[Event, ...]:
    """``events`` (one decision) as ``settings.on_unhandled_failure`` wants them.

    ``fail``: a tolerated completion no route handled becomes the node's failure and
    the run's. ``completed_with_errors``: a ``RunCompleted`` lists the unhandled
    failures of the run (those folded in ``state`` and those of these events)."""
    policy = graph.settings.on_unhandled_failure
    if policy == "continue":
        return events
    out: list[Event] = []
    pending: list[tuple[str, int, str, str | None]] = []
    for event in events:
        if isinstance(event, NodeCompleted) and event.failed:
            failure = (event.node_id, event.visit, event.error or "", event.routed_to)
            if _unhandled(graph, failure):
                if policy == "fail":
                    error = (
                        f"{event.error or 'failed'} "
                        "(no fallback; settings.on_unhandled_failure: fail)"
                    )
                    out.append(
                        NodeFailed(
                            node_id=event.node_id,
                            visit=event.visit,
                            error=error,
                            branch=event.branch,
                        )
                    )
                    if not event.branch:
                        message = f"node '{event.node_id}': {error}"
                        out.append(RunFailed(error=message, node_id=event.node_id))
                    return tuple(out)
                pending.append(failure)
        if isinstance(event, RunCompleted) and policy == "completed_with_errors":
            found = [f for f in state.failures if _unhandled(graph, f)] + pending
            if found:
                event = msgspec.structs.replace(event, unhandled_failures=_describe(found))
        out.append(event)
    return tuple(out)


def _describe(failures: list[tuple[str, int, str, str | None]]) -> list[dict[str, Any]]:
    return [{"node": n, "visit": v, "error": e} for n, v, e, _ in failures]


def summary(unhandled: Any) -> str:
    """One line naming the unhandled failures of a run (``runs``, ``show``, stderr)."""
    return unhandled_summary(unhandled or ())


__all__ = ["apply_policy", "handled", "summary"]
