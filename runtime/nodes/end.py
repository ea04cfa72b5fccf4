"""``end`` nodes: no effect; the run completes (or fails) with the rendered output."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from graphrun.eventstore.events import Event, NodeCompleted, RunCompleted, RunFailed
from graphrun.eventstore.fold import RunState
from graphrun.runtime.graph.model import Graph, NodeBase
from graphrun.runtime.graph.templates import render, render_updates
from graphrun.runtime.nodes.kind import NodeKind
from graphrun.runtime.nodes.plan import Append, Step


class EndNode(NodeBase, tag="end", kw_only=True):
    output: str = ""
    # Extension: "failed" ends the run as failed, with ``output`` as the error.
    status: Literal["completed", "failed"] = "completed"

    DESCRIPTIONS: ClassVar[dict[str | None, str]] = {
        None: "Ends the run; its output is the run's result.",
        "output": "The final result; templated against the state after state_updates.",
        "status": 'graphrun extension: "failed" ends the run as failed with output as '
        'the error (default "completed").',
        "next": "Ignored: an end node ends the run.",
        "state_updates": "Last state changes (lenient; no scoped variables).",
    }
    ENDS_RUN: ClassVar[bool] = True
    MAP_BRANCH: ClassVar[bool] = False
    MAP_BRANCH_PROBLEM: ClassVar[str | None] = (
        "map branches end through the map's collect mechanism, not end nodes"
    )

    def strict_fields(self) -> list[tuple[str, object]]:
        return [("output", self.output)]


def complete(graph: Graph, node: EndNode, node_id: str, state: RunState, _: Any) -> Step:
    s = state.state
    visit = state.current_visit
    updates = render_updates(node.state_updates, s)
    after = {**s, **updates} if updates else s
    output = render(node.output, after, strict=True, field=f"{node_id}.output")
    final: Event = (
        RunFailed(error=output, node_id=node_id)
        if node.status == "failed"
        else RunCompleted(node_id=node_id, output=output)
    )
    return Append(
        (NodeCompleted(node_id=node_id, visit=visit, routed_to=None, updates=updates), final)
    )


KIND = NodeKind(type="end", struct=EndNode, complete=complete)
