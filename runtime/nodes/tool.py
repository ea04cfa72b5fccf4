"""``tool`` nodes: call one tool directly with templated ``params``, no LLM.

::

    send:
      type: tool
      tool: send_mail          # tools.py / tools.sh / global tool, or mcp:<server>/<tool>
      params: {to: "{{customer.email}}", body: "{{reply}}"}
      timeout: 60
      next: done

The params are rendered against the state (a value that is exactly one
``{{path}}`` keeps its JSON type). The result lands in the state like a script's:
a JSON object printed by the tool is merged, and ``state_updates`` see it as
``{{output}}``. A failing tool fails the node (``on_error``, ``retry`` apply).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import msgspec

from graphrun.actors.tools.direct import ToolActor, ToolTask
from graphrun.eventstore.events import ToolFinished
from graphrun.eventstore.fold import RunState
from graphrun.runtime.graph.expressions import ExpressionError
from graphrun.runtime.graph.model import (
    CachePolicy,
    ErrorRoute,
    Graph,
    Guard,
    NodeBase,
    RetryPolicy,
    Route,
)
from graphrun.runtime.graph.routing import error_route, pick_route
from graphrun.runtime.graph.templates import render_updates
from graphrun.runtime.nodes.error_kinds import kind_of_result
from graphrun.runtime.nodes.kind import NodeKind
from graphrun.runtime.nodes.plan import Append, Perform, Step, completed, fail, last, tolerated
from graphrun.runtime.nodes.ports import RunPorts


class ToolNode(NodeBase, tag="tool", kw_only=True):
    tool: str
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    timeout: float = 60.0
    routes: list[Route] = msgspec.field(default_factory=list)
    on_error: list[ErrorRoute] = msgspec.field(default_factory=list)
    retry: RetryPolicy | None = None
    cache: CachePolicy | None = None
    guard: Guard | None = None

    DESCRIPTIONS: ClassVar[dict[str | None, str]] = {
        None: "graphrun: calls one tool directly with templated params, no LLM.",
        "tool": "The tool: a function of the agent's tools.py / tools.sh, a global tool, "
        "or `mcp:<server>/<tool>`.",
        "params": "The tool's arguments: a mapping whose values are templates (a value that "
        "is exactly one `{{path}}` keeps its JSON type).",
        "timeout": "Seconds the call may take (60).",
    }
    NEEDS_NEXT: ClassVar[bool] = True
    MERGES_ANY_KEY: ClassVar[bool] = True

    def reads(self) -> set[str]:
        from graphrun.runtime.graph.templates import expressions

        roots = super().reads()
        for value in self.params.values():
            for expr in expressions(value) if isinstance(value, str) else ():
                roots.add(expr.strip().split(".")[0].split("[")[0])
        return roots

    def rules(self, node_id: str, check: Any) -> list[Any]:
        out = super().rules(node_id, check)
        if not check.deep:
            return out
        from graphrun.actors.tools.direct import tool_name
        from graphrun.actors.tools.toolbox import validate_whitelist

        graph = check.graph
        for problem in validate_whitelist(
            check.loaded.agent_dir,
            [tool_name(self.tool)],
            global_tools=list(graph.global_tools),
            mcp_servers=list(graph.mcp_servers),
            config_dir=check.config_dir,
        ):
            out.append(
                check.diag(
                    "error",
                    "tool",
                    f"tool node '{node_id}': {problem}",
                    f"$.nodes.{node_id}.tool",
                    node=node_id,
                )
            )
        return out


def request(graph: Graph, node: ToolNode, node_id: str, state: RunState) -> Step:
    params = render_updates(node.params, state.state)
    arguments = json.dumps(params, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    task = ToolTask(node_id, state.current_visit, node.tool, arguments, node.timeout)
    return Perform(node_id, "tool", task)


def complete(
    graph: Graph, node: ToolNode, node_id: str, state: RunState, done: ToolFinished
) -> Step:
    s = state.state
    visit = state.current_visit
    if done.error is not None:
        message = f"tool '{node.tool}' failed: {done.error}"
        kind = kind_of_result(done)
        target = error_route(node, message, kind)
        if target is not None:
            return tolerated(node_id, visit, node, s, target, message, kind)
        return fail(node_id, visit, message, kind)
    merged = dict(done.output) if isinstance(done.output, dict) else {}
    updates = {
        **merged,
        **render_updates(node.state_updates, {**s, **merged}, {"output": done.output}),
    }
    try:
        routed = pick_route(node, {**s, **updates}, node.next)
    except ExpressionError as exc:
        return fail(node_id, visit, str(exc), "ExpressionError")
    if routed is None:
        return fail(node_id, visit, "tool node has no next to route to")
    return Append((completed(node_id, visit, routed, updates=updates),))


def primary(node: ToolNode, effects: tuple[Any, ...], done: Any) -> Any:
    """A map item's result: the tool's output."""
    finished = last(effects, ToolFinished)
    return finished.output if finished is not None else None


def effect(ports: RunPorts) -> tuple[type, tuple[Any, ...]]:
    graph, options = ports.graph, ports.options
    tools = (list(graph.global_tools), list(graph.mcp_servers))
    return ToolActor, (ports.agent_dir, *tools, options.config_dir, options.variables, ports.loop)


KIND = NodeKind(
    type="tool",
    struct=ToolNode,
    result=ToolFinished,
    request=request,
    complete=complete,
    primary=primary,
    effect=effect,
)
