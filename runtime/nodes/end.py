"""``end`` nodes: no effect; the run completes (or fails) with the rendered output."""

from __future__ import annotations

from typing import Any

from graphrun.eventstore.events import Event, NodeCompleted, RunCompleted, RunFailed
from graphrun.eventstore.fold import RunState
from graphrun.runtime.graph.model import EndNode, Graph
from graphrun.runtime.graph.templates import render, render_updates
from graphrun.runtime.nodes.kind import NodeKind
from graphrun.runtime.nodes.plan import Append, Step


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
