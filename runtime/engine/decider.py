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
import re
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from graphrun.actors.messages import AgentTask, HumanTask, RagTask, ScriptTask
from graphrun.eventstore.events import (
    BranchesMerged,
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
    StepStarted,
    VisitCapExceeded,
)
from graphrun.eventstore.fold import RunState, effect_output
from graphrun.runtime.engine.reducers import ABSENT, ReducerError, merge_writes, reduce, writes_of
from graphrun.runtime.errors import GraphrunError, TemplateError
from graphrun.runtime.graph.model import (
    AgentNode,
    ApprovalNode,
    EndNode,
    Graph,
    InputNode,
    LlmNode,
    MapNode,
    NodeBase,
    RagNode,
    ScriptNode,
    next_targets,
)
from graphrun.runtime.graph.templates import _MISSING, lookup, render, render_updates

#: The state key that holds the last tolerated failure (script/llm routed on).
ERROR_KEY = "_error"


@dataclass(frozen=True)
class Append:
    events: tuple[Event, ...]


@dataclass(frozen=True)
class Perform:
    """An effect to perform: the node's rendered task, for one branch (or map item).

    ``group`` names the concurrency limit it counts against (empty: the super-step's
    ``settings.max_concurrency``; a map node's id: that map's own cap, ``cap``)."""

    node_id: str
    node_type: str
    task: Any
    branch: str = ""
    group: str = ""
    cap: int = 0

    @property
    def visit(self) -> int:
        return int(getattr(self.task, "visit", 0))


@dataclass(frozen=True)
class PerformMany:
    """The effects of a super-step (or a map's items) still to perform; they run
    concurrently, each under its branch id."""

    tasks: tuple[Perform, ...]


@dataclass(frozen=True)
class Finished:
    status: str


Step = Append | Perform | PerformMany | Finished

#: A stand-in successor for a map's branch node, whose own routing is ignored.
_MAP_ITEM_NEXT = "\x00map-item"


def _fail(node_id: str, visit: int, error: str) -> Append:
    return Append(
        (
            NodeFailed(node_id=node_id, visit=visit, error=error),
            RunFailed(error=f"node '{node_id}': {error}", node_id=node_id),
        )
    )


def _completed(
    node_id: str, visit: int, target: str | list[str] | None, **fields: Any
) -> NodeCompleted:
    """A completion routed to ``target``: one node, a fan-out list, or none (``[]``)."""
    targets = next_targets(target)
    if len(targets) > 1:
        return NodeCompleted(
            node_id=node_id, visit=visit, routed_to=None, fan_out=list(targets), **fields
        )
    return NodeCompleted(
        node_id=node_id, visit=visit, routed_to=targets[0] if targets else None, **fields
    )


def state_json(state: dict[str, Any]) -> str:
    """The canonical JSON a script receives (sorted keys: same state, same bytes)."""
    return json.dumps(state, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def decide(graph: Graph, state: RunState) -> Step:
    """The next step of a run."""
    if state.terminal:
        return Finished(state.status)
    if state.branches:
        return _parallel(graph, state)
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
        step = _step(graph, node, state.current, state)
    except TemplateError as exc:
        return _fail(state.current, state.current_visit, str(exc))
    if graph.reducers and isinstance(step, Append):
        return _reduce_sequential(graph, state, step)
    return step


def _reduce_sequential(graph: Graph, state: RunState, step: Append) -> Append:
    """Declared reducers apply to a sequential node's writes too (Loki's rule): the
    reduced values go into the completion's ``updates``, which win over its merge."""
    events: list[Event] = []
    for event in step.events:
        if isinstance(event, NodeCompleted) and not event.branch:
            s = state.state
            after = dict(s)
            if event.merge_effect:
                merged = effect_output(state.effects) or {}
                after.update((k, v) for k, v in merged.items() if k != "_next")
            after.update(event.updates)
            writes = {k: v for k, v in writes_of(s, after).items() if k in graph.reducers}
            if writes:
                try:
                    reduced = {
                        k: reduce(graph.reducers[k], s.get(k, ABSENT), v)
                        for k, v in sorted(writes.items())
                    }
                except ReducerError as exc:
                    return _fail(event.node_id, event.visit, str(exc))
                event = msgspec.structs.replace(event, updates={**event.updates, **reduced})
        events.append(event)
    return Append(tuple(events))


def _enter(graph: Graph, state: RunState) -> Step:
    if state.last_node is not None and len(state.targets) > 1:
        return _enter_step(graph, state)
    target: str | None
    if state.last_node is None:
        target = graph.start
        if target not in graph.nodes:
            return Append((RunFailed(error=f"start node '{target}' does not exist"),))
    else:
        target = state.targets[0] if state.targets else state.routed_to
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


def _enter_step(graph: Graph, state: RunState) -> Step:
    """Open a parallel super-step: every target of the frontier, once, in id order."""
    frontier = sorted(set(state.targets))
    for target in frontier:
        if target not in graph.nodes:
            return Append(
                (
                    RunFailed(
                        error=f"{state.last_node} routed to unknown node '{target}'",
                        node_id=state.last_node,
                    ),
                )
            )
    cap = graph.settings.max_loop_iterations
    entered: list[Event] = []
    for target in frontier:
        visits = state.visits.get(target, 0) + 1
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
        entered.append(
            NodeEntered(
                node_id=target, node_type=graph.nodes[target].type, visit=visits, branch=target
            )
        )
    return Append((StepStarted(step=state.step + 1, frontier=frontier), *entered))


def _tag(event: Event, branch: str) -> Event:
    return msgspec.structs.replace(event, branch=branch)


def _branch_view(state: RunState, branch: str, node_id: str, visit: int) -> RunState:
    """The state a branch's node sees: the step's snapshot and its own effects."""
    waiting = (
        state.waiting if state.waiting is not None and state.waiting.branch == branch else None
    )
    return msgspec.structs.replace(
        state,
        current=node_id,
        current_visit=visit,
        effects=state.branch_effects.get(branch, ()),
        waiting=waiting,
        branches={},
    )


def _parallel(graph: Graph, state: RunState) -> Step:
    """A running super-step: the effects still missing, else every branch's completion
    and the merge of their writes (node-id order, through reducers)."""
    pending: list[Perform] = []
    outcomes: dict[str, tuple[Event, ...]] = {}
    for bid in sorted(state.branches):
        slot = state.branches[bid]
        if slot.done is not None:
            outcomes[bid] = (slot.done,)
            continue
        node = graph.nodes.get(slot.node_id)
        if node is None:
            return Append(
                (
                    RunFailed(
                        error=f"the log is in node '{slot.node_id}', which the graph does not have",
                        node_id=slot.node_id,
                    ),
                )
            )
        view = _branch_view(state, bid, slot.node_id, slot.visit)
        try:
            step = _step(graph, node, slot.node_id, view)
        except TemplateError as exc:
            step = _fail(slot.node_id, slot.visit, str(exc))
        if isinstance(step, Perform):
            pending.append(replace(step, branch=bid))
        elif isinstance(step, PerformMany):
            pending.extend(step.tasks)
        elif isinstance(step, Append):
            if any(isinstance(e, HumanInputRequested) for e in step.events):
                return Append(tuple(_tag(e, bid) for e in step.events))
            outcomes[bid] = step.events
    if pending:
        return PerformMany(tuple(pending))
    return _merge_step(graph, state, outcomes)


def _merge_step(graph: Graph, state: RunState, outcomes: dict[str, tuple[Event, ...]]) -> Append:
    snapshot = state.state
    events: list[Event] = []
    failures: list[tuple[str, NodeFailed]] = []
    ends: list[tuple[str, NodeCompleted, RunCompleted | RunFailed]] = []
    writes: dict[str, dict[str, Any]] = {}
    targets: set[str] = set()
    for bid in sorted(outcomes):
        slot = state.branches[bid]
        done = next((e for e in outcomes[bid] if isinstance(e, NodeCompleted | NodeFailed)), None)
        if done is None:  # pragma: no cover - every completion has one
            continue
        if slot.done is None:
            events.append(_tag(done, bid))
        if isinstance(done, NodeFailed):
            failures.append((bid, done))
            continue
        final = next((e for e in outcomes[bid] if isinstance(e, RunCompleted | RunFailed)), None)
        after = dict(snapshot)
        if done.merge_effect:
            produced = effect_output(state.branch_effects.get(bid, ())) or {}
            after.update((k, v) for k, v in produced.items() if k != "_next")
        after.update(done.updates)
        if isinstance(graph.nodes.get(slot.node_id), EndNode) and final is not None:
            ends.append((bid, done, final))
            writes[f"\x00end:{bid}"] = writes_of(snapshot, after)
            continue
        writes[bid] = writes_of(snapshot, after)
        targets.update(done.fan_out or ([done.routed_to] if done.routed_to else []))
    step_no = state.step
    if failures:
        # Deterministic (D8): the first failing node in node-id order names the error.
        bid, failed = failures[0]
        events.append(
            RunFailed(error=f"node '{failed.node_id}': {failed.error}", node_id=failed.node_id)
        )
        return Append(tuple(events))
    if len(ends) > 1:
        names = ", ".join(sorted(done.node_id for _, done, _ in ends))
        events.append(
            RunFailed(
                error=f"super-step {step_no} reached multiple End targets ({names}): the "
                "branches must converge at a join node before one end node"
            )
        )
        return Append(tuple(events))
    branch_writes = {k: v for k, v in writes.items() if not k.startswith("\x00end:")}
    try:
        merged = merge_writes(snapshot, branch_writes, graph.reducers)
        if ends:
            bid = ends[0][0]
            live = {**snapshot, **merged}
            merged.update(merge_writes(live, {bid: writes[f"\x00end:{bid}"]}, graph.reducers))
            branch_writes[bid] = writes[f"\x00end:{bid}"]
    except ReducerError as exc:
        events.append(RunFailed(error=str(exc)))
        return Append(tuple(events))
    used: dict[str, str] = {k: graph.reducers[k] for k in merged if k in graph.reducers}
    events.append(
        BranchesMerged(
            step=step_no,
            writes=branch_writes,
            merged=merged,
            reducers=used,
            targets=[] if ends else sorted(targets),
        )
    )
    if ends:
        events.append(ends[0][2])
    return Append(tuple(events))


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
        case MapNode():
            return _map_step(graph, node, node_id, state)
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
        return Append((_completed(node_id, visit, routed, updates=updates, merge_effect=True),))
    assert error is not None
    routed = node.fallback or node.next
    if routed is None:
        return _fail(node_id, visit, error)
    failure = {ERROR_KEY: {"node": node_id, "message": error}}
    updates = {**failure, **render_updates(node.state_updates, {**s, **failure})}
    return Append((_completed(node_id, visit, routed, updates=updates, failed=True, error=error),))


def llm_task(graph: Graph, node: LlmNode, node_id: str, visit: int, s: dict[str, Any]) -> Any:
    """The rendered request of an llm node (schema hint placed as the spec says)."""
    from graphrun.actors.llm.call import LlmTask
    from graphrun.actors.llm.structured import schema_hint

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
        # Graph-level values are defaults for llm nodes (decision D5).
        reasoning_effort=(
            node.reasoning_effort if node.reasoning_effort is not None else graph.reasoning_effort
        ),
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
    from graphrun.actors.llm.structured import parse_json_output

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
        return Append((_completed(node_id, visit, node.next, updates=updates),))
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
        (_completed(node_id, visit, routed, updates=updates, failed=True, error=message),)
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
    from graphrun.actors.human.prompt import parse_validation

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
    if not node.targets:
        return _fail(node_id, visit, "input node has no next to route to")
    updates = render_updates(node.state_updates, s, {"input": text})
    # An input node routes to the first entry of a `next` list only (Loki).
    return Append(
        (NodeCompleted(node_id=node_id, visit=visit, routed_to=node.targets[0], updates=updates),)
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
    return Append((_completed(node_id, visit, node.next, updates=updates),))


def _complete_rag(
    node: RagNode, node_id: str, visit: int, s: dict[str, Any], done: RetrievalDone
) -> Step:
    if done.error is not None:
        return _fail(node_id, visit, done.error)
    if node.next is None:
        return _fail(node_id, visit, "rag node has no next to route to")
    updates = render_updates(node.state_updates, s, {"output": done.result or {}})
    return Append((_completed(node_id, visit, node.next, updates=updates),))


# --- map ---------------------------------------------------------------------------

_ONE_REF = re.compile(r"^\{\{\s*([A-Za-z0-9_.\[\]-]+)\s*\}\}$")


def map_items(node: MapNode, node_id: str, s: dict[str, Any]) -> list[Any]:
    """The list ``over`` resolves to (one ``{{path}}``: the typed value; else text)."""
    template = node.over.strip()
    m = _ONE_REF.match(template)
    if m is not None:
        value = lookup(s, m.group(1))
        if value is _MISSING:
            raise TemplateError(
                f"map node '{node_id}': evaluating `over` template: '{m.group(1)}' is not in state"
            )
    else:
        value = render(template, s, strict=True, field=f"{node_id}.over")
    if not isinstance(value, list):
        kind = "string" if isinstance(value, str) else type(value).__name__
        if isinstance(value, dict):
            kind = "object"
        elif value is None:
            kind = "null"
        elif isinstance(value, bool):
            kind = "bool"
        elif isinstance(value, int | float):
            kind = "number"
        raise TemplateError(
            f"map node '{node_id}': `over` template '{node.over}' must resolve to an array, "
            f"got {kind}"
        )
    return value


def _item_node(node: NodeBase) -> NodeBase:
    """A map's branch node as one item runs it: its own routing is ignored."""
    changes: dict[str, Any] = {"next": _MAP_ITEM_NEXT}
    if isinstance(node, ScriptNode):
        changes["fallback"] = None  # a script item's failure fails the map
    return msgspec.structs.replace(node, **changes)


def _map_step(graph: Graph, node: MapNode, node_id: str, state: RunState) -> Step:
    visit = state.current_visit
    s = state.state
    if not node.targets and node.next is None:
        return _fail(node_id, visit, f"map node '{node_id}' has no `next` and is not an end node")
    items = map_items(node, node_id, s)
    branch = graph.nodes.get(node.branch)
    if branch is None:
        return _fail(node_id, visit, f"map node '{node_id}': branch '{node.branch}' not found")
    if isinstance(branch, ApprovalNode | InputNode | EndNode | MapNode):
        return _fail(
            node_id,
            visit,
            f"map node '{node_id}': a {branch.type} node cannot run inside a parallel map branch",
        )
    cap = max(1, node.max_concurrency or graph.settings.max_concurrency)
    inner = _item_node(branch)
    # Items are named after the map's own branch slot, so a map inside a parallel step
    # and a sequential map never share an id.
    prefix = node_id
    pending: list[Perform] = []
    done: list[tuple[Step, RunState]] = []
    for i, item in enumerate(items):
        iid = f"{prefix}[{i}]"
        view = msgspec.structs.replace(
            state,
            current=node.branch,
            current_visit=visit,
            effects=state.branch_effects.get(iid, ()),
            state={**s, node.as_: item},
            waiting=None,
            branches={},
        )
        try:
            step = _step(graph, inner, node.branch, view)
        except TemplateError as exc:
            step = _fail(node.branch, visit, str(exc))
        if isinstance(step, Perform):
            pending.append(replace(step, branch=iid, group=node_id, cap=cap))
        else:
            done.append((step, view))
    if pending:
        return PerformMany(tuple(pending))
    collected: list[Any] = []
    for i, (step, view) in enumerate(done):
        value, problem = _item_result(graph, node, branch, step, view)
        if problem is not None:
            return _fail(
                node_id, visit, f"map node '{node_id}': sub-branch [{i}] failed: {problem}"
            )
        collected.append(value)
    return Append((_completed(node_id, visit, node.next, updates={node.collect_into: collected}),))


def _item_result(
    graph: Graph, node: MapNode, branch: NodeBase, step: Step, view: RunState
) -> tuple[Any, str | None]:
    """One item's collected value (decision D3), or why the item failed."""
    events = step.events if isinstance(step, Append) else ()
    failed = next((e for e in events if isinstance(e, NodeFailed)), None)
    if failed is not None:
        return None, failed.error
    completed = next((e for e in events if isinstance(e, NodeCompleted)), None)
    if completed is None:
        return None, "produced no result"
    if completed.failed and not (isinstance(branch, LlmNode) and branch.fallback):
        return None, completed.error or "failed"
    key = node.output_key
    produced: dict[str, Any] = {}
    if completed.merge_effect:
        produced = {k: v for k, v in (effect_output(view.effects) or {}).items() if k != "_next"}
    if key in completed.updates:
        return completed.updates[key], None
    if key in produced:
        return produced[key], None
    # The branch did not write output_key itself: its primary result lands there (D3).
    effects = view.effects
    if isinstance(branch, LlmNode):
        if completed.failed:
            return completed.error, None
        result = _last(effects, LlmResult)
        if branch.output_schema is not None and result is not None:
            value, _ = structured_value(
                branch.output_schema, result.text, result.extracted, result.extract_error
            )
            return value, None
        return (result.text if result is not None else None) or "", None
    if isinstance(branch, AgentNode):
        finished = _last(effects, ChildRunFinished)
        return (finished.output if finished is not None else None) or "", None
    if isinstance(branch, RagNode):
        retrieved = _last(effects, RetrievalDone)
        return (retrieved.result if retrieved is not None else None) or {}, None
    return None, f"did not write `output_key` '{key}'"
