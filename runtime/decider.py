"""The pure decider: ``(graph, state) -> next step``.

It renders templates, routes (``_next`` > internal routes > ``next``, and
``fallback`` on failure), evaluates ``state_updates``, merges structured output,
and applies the visit cap. It never performs an effect, reads the clock or makes
an id: what it needs from the world is in the folded state's effect events. So the
same graph and the same events always give the same decisions, which is what
replay checks.

:func:`decide` returns one of:

* :class:`Append` — decision events to record (then call again);
* :class:`Perform` — an effect to run for the current node (its outcome comes
  back as effect events);
* :class:`Finished` — the run is over.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from graphrun.actors.messages import AgentTask, HumanTask, RagTask, ScriptTask
from graphrun.eventstore.events import (
    ChildRunFinished,
    Event,
    HumanInputReceived,
    HumanInputRequested,
    LlmResult,
    NodeCompleted,
    NodeEntered,
    NodeFailed,
    RetrievalDone,
    RunCompleted,
    RunFailed,
    ScriptFinished,
    VisitCapExceeded,
)
from graphrun.eventstore.fold import RunState
from graphrun.runtime.errors import GraphrunError, TemplateError
from graphrun.runtime.graph import (
    AgentNode,
    ApprovalNode,
    EndNode,
    Graph,
    InputNode,
    LlmNode,
    NodeBase,
    RagNode,
    ScriptNode,
)
from graphrun.runtime.templates import render, render_updates

#: The state key that holds the last tolerated failure (script/llm routed on).
ERROR_KEY = "_error"


@dataclass(frozen=True)
class Append:
    events: tuple[Event, ...]


@dataclass(frozen=True)
class Perform:
    node_id: str
    node_type: str
    task: Any


@dataclass(frozen=True)
class Finished:
    status: str


Step = Append | Perform | Finished


def _fail(node_id: str, visit: int, error: str) -> Append:
    return Append(
        (
            NodeFailed(node_id=node_id, visit=visit, error=error),
            RunFailed(error=f"node '{node_id}': {error}", node_id=node_id),
        )
    )


def state_json(state: dict[str, Any]) -> str:
    """The canonical JSON a script receives (sorted keys: same state, same bytes)."""
    return json.dumps(state, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def decide(graph: Graph, state: RunState) -> Step:
    """The next step of a run."""
    if state.terminal:
        return Finished(state.status)
    if state.current is None:
        return _enter(graph, state)
    node = graph.nodes.get(state.current)
    if node is None:
        return Append(
            (
                RunFailed(
                    error=f"the log is in node '{state.current}', which the graph does not have",
                    node_id=state.current,
                ),
            )
        )
    try:
        return _step(graph, node, state.current, state)
    except TemplateError as exc:
        return _fail(state.current, state.current_visit, str(exc))


def _enter(graph: Graph, state: RunState) -> Step:
    if state.last_node is None:
        target = graph.start
        if target not in graph.nodes:
            return Append((RunFailed(error=f"start node '{target}' does not exist"),))
    else:
        target = state.routed_to
        if target is None:
            return Append(
                (
                    RunFailed(
                        error=f"node '{state.last_node}' routed nowhere", node_id=state.last_node
                    ),
                )
            )
        if target not in graph.nodes:
            return Append(
                (
                    RunFailed(
                        error=f"node '{state.last_node}' routed to unknown node '{target}'",
                        node_id=state.last_node,
                    ),
                )
            )
    visits = state.visits.get(target, 0) + 1
    cap = graph.settings.max_loop_iterations
    if visits > cap:
        return Append(
            (
                VisitCapExceeded(node_id=target, visits=visits, cap=cap),
                RunFailed(
                    error=f"Node '{target}' visited {visits} times (max_loop_iterations={cap})",
                    node_id=target,
                ),
            )
        )
    node = graph.nodes[target]
    return Append((NodeEntered(node_id=target, node_type=node.type, visit=visits),))


def _last(effects: tuple[Any, ...], kind: type) -> Any:
    for event in reversed(effects):
        if isinstance(event, kind):
            return event
    return None


def _step(graph: Graph, node: NodeBase, node_id: str, state: RunState) -> Step:
    visit = state.current_visit
    s = state.state
    match node:
        case EndNode():
            return _complete_end(node, node_id, visit, s)
        case ScriptNode():
            done = _last(state.effects, ScriptFinished)
            if done is None:
                return Perform(
                    node_id,
                    "script",
                    ScriptTask(node_id, visit, node.script, node.timeout, state_json(s)),
                )
            return _complete_script(node, node_id, visit, s, done)
        case LlmNode():
            done = _last(state.effects, LlmResult)
            if done is None:
                return Perform(node_id, "llm", llm_task(graph, node, node_id, visit, s))
            return _complete_llm(node, node_id, visit, s, done)
        case ApprovalNode() | InputNode():
            answer = _last(state.effects, HumanInputReceived)
            if answer is not None:
                if isinstance(node, ApprovalNode):
                    return _complete_approval(node, node_id, visit, s, answer)
                return _complete_input(node, node_id, visit, s, answer)
            task = human_task(node, node_id, visit, s)
            if state.waiting is None:
                return Append(
                    (
                        HumanInputRequested(
                            node_id=node_id,
                            visit=visit,
                            kind=task.kind,
                            question=task.question,
                            options=list(task.options),
                            default=task.default,
                            approvers=list(task.approvers),
                        ),
                    )
                )
            return Perform(node_id, task.kind, task)
        case AgentNode():
            done = _last(state.effects, ChildRunFinished)
            if done is None:
                prompt = render(node.prompt, s, strict=True, field=f"{node_id}.prompt")
                return Perform(
                    node_id,
                    "agent",
                    AgentTask(node_id, visit, node.agent, prompt, node.timeout, node.output_schema),
                )
            return _complete_agent(node, node_id, visit, s, done, state.effects)
        case RagNode():
            done = _last(state.effects, RetrievalDone)
            if done is None:
                query = render(node.query, s, strict=True, field=f"{node_id}.query")
                config = {
                    "documents": list(node.documents),
                    "embedding_model": node.embedding_model,
                    "chunk_size": node.chunk_size,
                    "chunk_overlap": node.chunk_overlap,
                    "reranker_model": node.reranker_model,
                    "batch_size": node.batch_size,
                }
                return Perform(
                    node_id, "rag", RagTask(node_id, visit, query, node.top_k, node.timeout, config)
                )
            return _complete_rag(node, node_id, visit, s, done)
    raise GraphrunError(f"node '{node_id}' has an unsupported type '{node.type}'")


# --- per node type ---------------------------------------------------------------------


def _complete_end(node: EndNode, node_id: str, visit: int, s: dict[str, Any]) -> Step:
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


def _complete_script(
    node: ScriptNode, node_id: str, visit: int, s: dict[str, Any], done: ScriptFinished
) -> Step:
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
        routed = next_override or node.next
        if routed is None:
            return _fail(
                node_id,
                visit,
                "script printed no _next and the node has no next (or fallback) to route to",
            )
        return Append(
            (
                NodeCompleted(
                    node_id=node_id,
                    visit=visit,
                    routed_to=routed,
                    updates=updates,
                    merge_effect=True,
                ),
            )
        )
    assert error is not None
    routed = node.fallback or node.next
    if routed is None:
        return _fail(node_id, visit, error)
    failure = {ERROR_KEY: {"node": node_id, "message": error}}
    updates = {**failure, **render_updates(node.state_updates, {**s, **failure})}
    return Append(
        (
            NodeCompleted(
                node_id=node_id,
                visit=visit,
                routed_to=routed,
                updates=updates,
                failed=True,
                error=error,
            ),
        )
    )


def llm_task(graph: Graph, node: LlmNode, node_id: str, visit: int, s: dict[str, Any]) -> Any:
    """The rendered request of an llm node (schema hint placed as the spec says)."""
    from graphrun.actors.llm import LlmTask
    from graphrun.actors.structured import schema_hint

    system = (
        render(node.instructions, s, strict=True, field=f"{node_id}.instructions")
        if node.instructions is not None
        else None
    )
    prompt = render(node.prompt, s, strict=True, field=f"{node_id}.prompt")
    if node.output_schema is not None:
        hint = schema_hint(node.output_schema)
        if system is not None:
            system = f"{system.rstrip()}\n\n{hint}"
        else:
            prompt = f"{prompt.rstrip()}\n\n{hint}"
    return LlmTask(
        node_id=node_id,
        visit=visit,
        model=node.model or graph.model or "",
        system=system,
        prompt=prompt,
        temperature=node.temperature if node.temperature is not None else graph.temperature,
        top_p=node.top_p if node.top_p is not None else graph.top_p,
        tools=tuple(node.tools or ()),
        max_attempts=node.max_attempts,
        max_iterations=node.max_iterations,
        timeout=node.timeout,
        output_schema=node.output_schema,
    )


def structured_value(
    schema: dict[str, Any], text: str | None, extracted: str | None, extract_error: str | None
) -> tuple[Any, str | None]:
    """The structured output of a node: the fast path, else the extractor's text."""
    from graphrun.actors.structured import parse_json_output

    value, error = parse_json_output(text or "", schema)
    if error is None:
        return value, None
    if extracted is not None:
        value, error2 = parse_json_output(extracted, schema)
        if error2 is None:
            return value, None
        return None, f"structured output extraction failed: {error2}"
    return None, extract_error or f"structured output extraction failed: {error}"


def _complete_llm(
    node: LlmNode, node_id: str, visit: int, s: dict[str, Any], done: LlmResult
) -> Step:
    error = done.error
    output: Any = done.text or ""
    merged: dict[str, Any] = {}
    if error is None and node.output_schema is not None:
        output, error = structured_value(
            node.output_schema, done.text, done.extracted, done.extract_error
        )
        if error is None and isinstance(output, dict):
            merged = dict(output)
    if error is None:
        if node.next is None:
            return _fail(node_id, visit, "llm node has no next to route to")
        updates = {
            **merged,
            **render_updates(node.state_updates, {**s, **merged}, {"output": output}),
        }
        return Append(
            (NodeCompleted(node_id=node_id, visit=visit, routed_to=node.next, updates=updates),)
        )
    message = f"LLM node failed: {error}"
    routed = node.fallback or node.next
    if routed is None:
        return _fail(node_id, visit, message)
    failure = {ERROR_KEY: {"node": node_id, "message": message}}
    updates = {
        **failure,
        **render_updates(node.state_updates, {**s, **failure}, {"output": message}),
    }
    return Append(
        (
            NodeCompleted(
                node_id=node_id,
                visit=visit,
                routed_to=routed,
                updates=updates,
                failed=True,
                error=message,
            ),
        )
    )


def human_task(
    node: ApprovalNode | InputNode, node_id: str, visit: int, s: dict[str, Any]
) -> HumanTask:
    question = render(node.question, s, strict=True, field=f"{node_id}.question")
    if isinstance(node, ApprovalNode):
        return HumanTask(
            node_id,
            visit,
            "approval",
            question,
            tuple(node.options),
            approvers=tuple(node.approvers or ()),
        )
    default = (
        render(node.default, s, strict=True, field=f"{node_id}.default")
        if node.default is not None
        else None
    )
    return HumanTask(node_id, visit, "input", question, default=default)


def match_choice(node: ApprovalNode, answer: str) -> str | None:
    """The routes key an answer selects, or None for a free-form answer."""
    text = answer.strip()
    if text in node.routes:
        return text
    folded = [key for key in node.routes if key.casefold() == text.casefold()]
    return folded[0] if len(folded) == 1 else None


def _complete_approval(
    node: ApprovalNode, node_id: str, visit: int, s: dict[str, Any], answer: HumanInputReceived
) -> Step:
    key = match_choice(node, answer.answer)
    choice = key if key is not None else answer.answer
    routed = node.routes[key] if key is not None else node.on_other
    updates = render_updates(node.state_updates, s, {"choice": choice})
    return Append((NodeCompleted(node_id=node_id, visit=visit, routed_to=routed, updates=updates),))


def _complete_input(
    node: InputNode, node_id: str, visit: int, s: dict[str, Any], answer: HumanInputReceived
) -> Step:
    from graphrun.actors.human import parse_validation

    text = answer.answer
    substituted = False
    if text.strip() == "" and node.default is not None:
        text = render(node.default, s, strict=True, field=f"{node_id}.default")
        substituted = True
    # The spec: a substituted default is not re-validated.
    if node.validation and not substituted:
        rule = parse_validation(node.validation)
        if not rule.check(text):
            return _fail(
                node_id,
                visit,
                f"input failed validation '{node.validation}' (got {len(text)} characters)",
            )
    if node.next is None:
        return _fail(node_id, visit, "input node has no next to route to")
    updates = render_updates(node.state_updates, s, {"input": text})
    return Append(
        (NodeCompleted(node_id=node_id, visit=visit, routed_to=node.next, updates=updates),)
    )


def _complete_agent(
    node: AgentNode,
    node_id: str,
    visit: int,
    s: dict[str, Any],
    done: ChildRunFinished,
    effects: tuple[Any, ...],
) -> Step:
    if done.status != "completed":
        why = done.error or done.status
        return _fail(node_id, visit, f"child agent '{node.agent}' run {done.child_run_id} {why}")
    output: Any = done.output or ""
    merged: dict[str, Any] = {}
    if node.output_schema is not None:
        extraction = _last(effects, LlmResult)
        output, error = structured_value(
            node.output_schema,
            done.output,
            extraction.extracted if extraction else None,
            extraction.extract_error if extraction else None,
        )
        if error is not None:
            # Agent nodes have no fallback: extraction failure is a graph error.
            return _fail(node_id, visit, error)
        if isinstance(output, dict):
            merged = dict(output)
    if node.next is None:
        return _fail(node_id, visit, "agent node has no next to route to")
    updates = {**merged, **render_updates(node.state_updates, {**s, **merged}, {"output": output})}
    return Append(
        (NodeCompleted(node_id=node_id, visit=visit, routed_to=node.next, updates=updates),)
    )


def _complete_rag(
    node: RagNode, node_id: str, visit: int, s: dict[str, Any], done: RetrievalDone
) -> Step:
    if done.error is not None:
        return _fail(node_id, visit, done.error)
    if node.next is None:
        return _fail(node_id, visit, "rag node has no next to route to")
    updates = render_updates(node.state_updates, s, {"output": done.result or {}})
    return Append(
        (NodeCompleted(node_id=node_id, visit=visit, routed_to=node.next, updates=updates),)
    )
