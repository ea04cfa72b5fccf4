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
  back as effect events); :class:`PerformMany` — a super-step's effects;
* :class:`Finished` — the run is over.

Each node kind's own decisions (its request, its completion, its result as a map
item) are in ``runtime/nodes/<kind>.py``, found through the registry; this module
is the control flow around them: entering nodes, visit caps, super-steps and their
merge, reducers, ``map``.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from graphrun.eventstore.events import (
    BranchesMerged,
    Event,
    HumanInputRequested,
    NodeCompleted,
    NodeEntered,
    NodeFailed,
    NodeRetrying,
    RunCompleted,
    RunFailed,
    StepStarted,
    VisitCapExceeded,
)
from graphrun.eventstore.fold import BranchEffects, RunState, effect_output
from graphrun.runtime.engine.failures import apply_policy
from graphrun.runtime.engine.reducers import ABSENT, ReducerError, merge_writes, reduce, writes_of
from graphrun.runtime.errors import TemplateError
from graphrun.runtime.graph.expressions import ExpressionError
from graphrun.runtime.graph.model import Graph, NodeBase
from graphrun.runtime.graph.routing import failure_handled, skip_reason
from graphrun.runtime.graph.templates import _MISSING, lookup, render
from graphrun.runtime.nodes import kind_of
from graphrun.runtime.nodes.end import EndNode
from graphrun.runtime.nodes.guard import input_blocked, output_checked
from graphrun.runtime.nodes.human import human_task, match_choice
from graphrun.runtime.nodes.llm import LlmNode, llm_task, structured_value
from graphrun.runtime.nodes.map import MapNode
from graphrun.runtime.nodes.plan import (
    ERROR_KEY,
    Append,
    Finished,
    Perform,
    PerformMany,
    Step,
    completed,
    fail,
    last,
    state_json,
)
from graphrun.runtime.nodes.retry import pending_retry, retry_step
from graphrun.runtime.nodes.script import ScriptNode

#: A stand-in successor for a map's branch node, whose own routing is ignored.
_MAP_ITEM_NEXT = "\x00map-item"

# The helpers of every node kind (runtime/nodes/plan.py), under the names used here.
_fail = fail
_completed = completed
_last = last


def decide(graph: Graph, state: RunState) -> Step:
    """The next step of a run."""
    step = _decide(graph, state)
    if isinstance(step, Append):
        return Append(apply_policy(graph, step.events, state))
    return step


def _decide(graph: Graph, state: RunState) -> Step:
    if state.terminal:
        return Finished(state.status)
    if state.branches or _join_needs(state.join) is not None:
        # (a step whose join left no branch is still a step: it merges or fails)
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
        return _fail(state.current, state.current_visit, str(exc), "TemplateError")
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
                        k: reduce(
                            graph.reducers[k], s.get(k, ABSENT), v, key=k, writer=event.node_id
                        )
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
    source = graph.nodes.get(state.last_node or "")
    policy = getattr(source, "join", None)
    join = msgspec.to_builtins(policy) if policy is not None else {}
    return Append((StepStarted(step=state.step + 1, frontier=frontier, join=join), *entered))


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
            step = _fail(slot.node_id, slot.visit, str(exc), "TemplateError")
        if isinstance(step, Perform):
            pending.append(msgspec.structs.replace(step, branch=bid))
        elif isinstance(step, PerformMany):
            pending.extend(step.tasks)
        elif isinstance(step, Append):
            if any(isinstance(e, HumanInputRequested | NodeRetrying) for e in step.events):
                return Append(tuple(_tag(e, bid) for e in step.events))
            outcomes[bid] = step.events
    if pending:
        return PerformMany(tuple(pending), join=state.join or None)
    return _merge_step(graph, state, outcomes)


def branch_outcome(graph: Graph, state: RunState, bid: str) -> tuple[str, str, str]:
    """How branch ``bid`` of the running super-step stands, for its join:
    ``("ok", "", "")`` when it completed (through a failure route the graph declares,
    too), ``("failed", error, kind)`` when it failed (or its failure flowed on
    unhandled), ``("pending", "", "")`` while its effect is missing, it waits for a
    person or it is to be tried again. Pure: what the merge would decide."""
    slot = state.branches.get(bid)
    if slot is None:
        return ("pending", "", "")
    done: Event | None = slot.done
    node = graph.nodes.get(slot.node_id)
    if done is None:
        if node is None:
            return ("failed", f"node '{slot.node_id}' is not in the graph", "")
        view = _branch_view(state, bid, slot.node_id, slot.visit)
        try:
            step = _step(graph, node, slot.node_id, view)
        except TemplateError as exc:
            return ("failed", str(exc), "TemplateError")
        if not isinstance(step, Append) or any(
            isinstance(e, HumanInputRequested | NodeRetrying) for e in step.events
        ):
            return ("pending", "", "")
        done = next((e for e in step.events if isinstance(e, NodeCompleted | NodeFailed)), None)
    if isinstance(done, NodeFailed):
        return ("failed", done.error, done.error_kind)
    if (
        isinstance(done, NodeCompleted)
        and done.failed
        and not failure_handled(node, done.routed_to)
    ):
        return ("failed", done.error or "failed", done.error_kind)
    return ("ok", "", "")


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
    needed = _join_needs(state.join)
    if not failures and needed is not None and len(outcomes) < needed:
        # The join settled without holding (its record is in, the failure that follows
        # it is not: a crash between them): the step fails, as it did.
        events.append(
            RunFailed(
                error=f"super-step {step_no}: join cannot hold: {len(outcomes)} branch(es) "
                f"counted, {needed} needed"
            )
        )
        return Append(tuple(events))
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


def _join_needs(join: dict[str, Any]) -> int | None:
    """How many branches an ``any``/``count`` join needs (None: another policy)."""
    if join.get("type") == "any":
        return 1
    count = join.get("count")
    if join.get("type") == "count" and isinstance(count, int):
        return count
    return None


def _step(graph: Graph, node: NodeBase, node_id: str, state: RunState) -> Step:
    """One visit of a node: its kind asks for its effect, or decides once it is in."""
    if node.if_ is not None or node.unless is not None:
        skipped = _skipped(node, node_id, state)
        if skipped is not None:
            return skipped
    if isinstance(node, MapNode):
        return _map_step(graph, node, node_id, state)
    kind = kind_of(node.type)
    if kind.result is None:
        return kind.complete(graph, node, node_id, state, None)
    done = _last(state.effects, kind.result)
    if done is None and (blocked := input_blocked(node, node_id, state)) is not None:
        return blocked  # the input guard does not hold: no effect at all
    if done is None or pending_retry(state.effects) is not None:
        # No effect yet, or a failed one to try again (``retry:``).
        assert kind.request is not None
        return kind.request(graph, node, node_id, state)
    again = retry_step(node, node_id, state, done)
    if again is not None:
        return again
    step = kind.complete(graph, node, node_id, state, done)
    return output_checked(node, node_id, state, step, kind.primary)


def _skipped(node: NodeBase, node_id: str, state: RunState) -> Step | None:
    """A node whose ``if`` is false (or ``unless`` true) over the state it would run
    on: it completes at once, skipped, routed to ``next``, with no effect and no
    writes. None: it runs. The state does not change during a visit, so deciding
    again on the way (after its effect, say) gives the same answer."""
    visit = state.current_visit
    try:
        reason = skip_reason(node, state.state)
    except ExpressionError as exc:
        field = "if" if node.if_ is not None else "unless"
        return _fail(node_id, visit, f"{field}: {exc}", "ExpressionError")
    if reason is None:
        return None
    return Append((_completed(node_id, visit, node.next, skipped=reason),))


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
    if not type(branch).MAP_BRANCH:
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
    # Each finished item's value as it is met (its view and step are not kept: a map
    # of 10,000 items holds its results, not 10,000 states), and the first failure.
    collected: list[Any] = []
    problem: tuple[int, str] | None = None
    # What every item's view of the state shares; each adds its own effects and item.
    base = msgspec.structs.replace(
        state, current=node.branch, current_visit=visit, waiting=None, branches={}
    )
    view_of = msgspec.structs.replace
    # A map that has only begun has no item effects yet: none are looked up. One
    # that has looks up every item's: in one plain dict, made once.
    found = state.branch_effects
    effects_of = None
    if found:
        effects_of = (found.as_dict() if isinstance(found, BranchEffects) else found).get
    as_ = node.as_
    for i, item in enumerate(items):
        iid = f"{prefix}[{i}]"
        effects = effects_of(iid, ()) if effects_of is not None else ()
        view = view_of(base, effects=effects, state={**s, as_: item})
        try:
            step = _step(graph, inner, node.branch, view)
        except TemplateError as exc:
            step = _fail(node.branch, visit, str(exc), "TemplateError")
        if isinstance(step, Perform):
            pending.append(Perform(step.node_id, step.node_type, step.task, iid, node_id, cap))
        elif isinstance(step, Append) and any(isinstance(e, NodeRetrying) for e in step.events):
            return Append(tuple(_tag(e, iid) for e in step.events))
        elif not pending and problem is None:  # (with items pending, nothing is collected)
            value, why = _item_result(graph, node, branch, step, view)
            if why is not None:
                problem = (i, why)
            collected.append(value)
    if pending:
        return PerformMany(tuple(pending))
    if problem is not None:
        i, why = problem
        return _fail(node_id, visit, f"map node '{node_id}': sub-branch [{i}] failed: {why}")
    return Append((_completed(node_id, visit, node.next, updates={node.collect_into: collected}),))


def _item_result(
    graph: Graph, node: MapNode, branch: NodeBase, step: Step, view: RunState
) -> tuple[Any, str | None]:
    """One item's collected value (decision D3), or why the item failed."""
    completed = None
    for event in step.events if isinstance(step, Append) else ():
        if isinstance(event, NodeFailed):
            return None, event.error
        if completed is None and isinstance(event, NodeCompleted):
            completed = event
    if completed is None:
        return None, "produced no result"
    if completed.skipped:
        return None, None  # a skipped item collects null
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
    primary = kind_of(branch.type).primary if not isinstance(branch, MapNode) else None
    if primary is not None:
        return primary(branch, view.effects, completed), None
    return None, f"did not write `output_key` '{key}'"


__all__ = [
    "ERROR_KEY",
    "Append",
    "Finished",
    "Perform",
    "PerformMany",
    "Step",
    "branch_outcome",
    "decide",
    "human_task",
    "llm_task",
    "map_items",
    "match_choice",
    "state_json",
    "structured_value",
]
