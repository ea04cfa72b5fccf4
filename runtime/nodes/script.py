"""``script`` nodes: a process run on the state; its JSON output merges into it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from graphrun.actors.messages import ScriptTask
from graphrun.eventstore.events import ScriptFinished
from graphrun.eventstore.fold import RunState
from graphrun.runtime.graph.expressions import ExpressionError
from graphrun.runtime.graph.model import Graph, ScriptNode
from graphrun.runtime.graph.routing import error_route, pick_route
from graphrun.runtime.graph.templates import render_updates
from graphrun.runtime.nodes.error_kinds import kind_of_result
from graphrun.runtime.nodes.kind import NodeKind
from graphrun.runtime.nodes.plan import (
    ERROR_KEY,
    Append,
    Perform,
    Step,
    completed,
    fail,
    state_json,
)

if TYPE_CHECKING:
    from graphrun.runtime.nodes.ports import RunPorts


def request(graph: Graph, node: ScriptNode, node_id: str, state: RunState) -> Step:
    task = ScriptTask(
        node_id, state.current_visit, node.script, node.timeout, state_json(state.state)
    )
    return Perform(node_id, "script", task)


def complete(
    graph: Graph, node: ScriptNode, node_id: str, state: RunState, done: ScriptFinished
) -> Step:
    s = state.state
    visit = state.current_visit
    error = done.error
    output = done.output
    next_override: str | None = None
    if error is None and output is not None and "_next" in output:
        raw = output["_next"]
        if isinstance(raw, str) and raw:
            next_override = raw
        elif raw is not None:
            error = f"_next must be a node id string, got {json.dumps(raw)}"
    if error is None and output is not None:
        merged = {**s, **{k: v for k, v in output.items() if k != "_next"}}
        updates = render_updates(node.state_updates, merged)
        try:
            routed = next_override or pick_route(node, {**merged, **updates}, node.next)
        except ExpressionError as exc:
            return fail(node_id, visit, str(exc), "ExpressionError")
        if routed is None:
            return fail(
                node_id,
                visit,
                "script printed no _next and the node has no next (or fallback) to route to",
            )
        return Append((completed(node_id, visit, routed, updates=updates, merge_effect=True),))
    assert error is not None
    kind = kind_of_result(done)
    routed = error_route(node, error, kind) or node.fallback or node.next
    if routed is None:
        return fail(node_id, visit, error, kind)
    failure = {ERROR_KEY: {"node": node_id, "message": error}}
    updates = {**failure, **render_updates(node.state_updates, {**s, **failure})}
    return Append(
        (
            completed(
                node_id, visit, routed, updates=updates, failed=True, error=error, error_kind=kind
            ),
        )
    )


def effect(ports: RunPorts) -> tuple[type, tuple[Any, ...]]:
    from graphrun.actors.script import ScriptActor

    return ScriptActor, (ports.scratch(),)


KIND = NodeKind(
    type="script",
    struct=ScriptNode,
    result=ScriptFinished,
    request=request,
    complete=complete,
    effect=effect,
)
