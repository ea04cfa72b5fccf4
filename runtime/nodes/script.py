"""``script`` nodes: a process run on the state; its JSON output merges into it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

from graphrun.actors.messages import ScriptTask
from graphrun.actors.paths import outside_hint, outside_problem
from graphrun.eventstore.events import ScriptFinished
from graphrun.eventstore.fold import RunState
from graphrun.runtime.graph.check import node_path
from graphrun.runtime.graph.expressions import ExpressionError
from graphrun.runtime.graph.model import (
    CachePolicy,
    ErrorRoute,
    Graph,
    NodeBase,
    RetryPolicy,
    Route,
)
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

SCRIPT_RUNTIMES = {".sh": ["bash"], ".py": ["python3"], ".ts": ["npx", "tsx"]}


class ScriptNode(NodeBase, tag="script", kw_only=True):
    routes: list[Route] = msgspec.field(default_factory=list)
    on_error: list[ErrorRoute] = msgspec.field(default_factory=list)
    retry: RetryPolicy | None = None
    cache: CachePolicy | None = None
    script: str
    timeout: float = 30.0
    fallback: str | None = None

    DESCRIPTIONS: ClassVar[dict[str | None, str]] = {
        None: "Runs scripts/<file> (.sh with bash, .py with python3, .ts with npx tsx); "
        "its stdout JSON object merges into state.",
        "script": "The script's path, relative to the agent directory (required).",
        "timeout": "Wall-clock cap in seconds (default 30); the process group is killed.",
        "next": "The default route; a `_next` key in the script's output overrides it.",
        "fallback": "Where to route when the script exits non-zero, times out or prints "
        "no JSON object.",
    }
    FAILURE_FLOWS_ON: ClassVar[bool] = True
    MERGES_ANY_KEY: ClassVar[bool] = True
    UPDATES_DECLARE_WRITES: ClassVar[bool] = True

    def rules(self, node_id: str, check: Any) -> list[Any]:
        return super().rules(node_id, check) + self._file_rules(node_id, check)

    def _file_rules(self, nid: str, c: Any) -> list[Any]:
        """The script is a file of the agent directory, with a runtime for its extension."""
        agent_dir = c.loaded.agent_dir.resolve()
        where = node_path(nid, "script")
        ext = Path(self.script).suffix
        outside = outside_problem(agent_dir, self.script, what=f"script '{self.script}'")
        if outside is not None:
            return [
                c.diag("error", "script-outside", outside, where, node=nid, hint=outside_hint())
            ]
        if ext not in SCRIPT_RUNTIMES:
            return [
                c.diag(
                    "error",
                    "script-extension",
                    f"script '{self.script}' has unsupported extension '{ext or '(none)'}'",
                    where,
                    node=nid,
                    hint="script extensions are exactly .sh, .py and .ts",
                )
            ]
        if not (agent_dir / self.script).resolve().is_file():
            return [
                c.diag(
                    "error",
                    "script-missing",
                    f"script file '{self.script}' does not exist in {agent_dir}",
                    where,
                    node=nid,
                )
            ]
        return []


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
