"""The state of a run is a fold over its events.

:func:`apply` is a pure ``match`` over one event; :func:`fold` runs it over many.
Folding is incremental: ``fold(events[n:], fold(events[:n]))`` equals
``fold(events)``, and each event costs O(1) apart from the state keys it changes.
No I/O, no clock.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import msgspec

from graphrun.eventstore.events import (
    BranchesJoined,
    BranchesMerged,
    ChildCancelled,
    ChildRunFinished,
    ChildRunStarted,
    Event,
    GraphUpgraded,
    HumanInputReceived,
    HumanInputRequested,
    LlmCalled,
    LlmContinued,
    LlmResult,
    NodeCompleted,
    NodeEntered,
    NodeFailed,
    NodeRetrying,
    RetrievalDone,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunInterrupted,
    RunResumed,
    RunStarted,
    ScriptFinished,
    StepStarted,
    ToolCalled,
    ToolFinished,
)

_replace = msgspec.structs.replace

#: Buckets of each of the two levels of a :class:`BranchEffects` map.
_BUCKETS = 32
_EMPTY: dict[str, tuple[Any, ...]] = {}  # shared by every empty leaf (never changed)
_EMPTY_ROW = (_EMPTY,) * _BUCKETS


class BranchEffects(Mapping[str, tuple[Any, ...]]):
    """An immutable map of branch id -> effect events whose :meth:`set` shares all but
    one leaf (and the two rows of leaves above it) with the map it came from.

    A 10,000-item map records two events per item, and keeps every item until it is
    collected: copying a plain dict of every item on each would make the fold
    quadratic in the number of items, and so would one level of 64 buckets (~n/64
    items copied an event: 156 at 10,000). Here an event copies two tuples of 32 and
    one leaf of ~n/1,024 items. Leaves are chosen by CRC-32 of the branch id, so
    iteration order is the same in every process (``hash`` of a string is not).
    Leaves are never changed once made: an empty one is shared."""

    __slots__ = ("_buckets", "_len")

    def __init__(self, items: Mapping[str, tuple[Any, ...]] | None = None) -> None:
        rows: dict[int, dict[int, dict[str, tuple[Any, ...]]]] = {}
        for key, value in (items or {}).items():
            i, j = _slot(key)
            rows.setdefault(i, {}).setdefault(j, {})[key] = value
        self._buckets = tuple(
            _EMPTY_ROW if i not in rows else tuple(rows[i].get(j, _EMPTY) for j in range(_BUCKETS))
            for i in range(_BUCKETS)
        )
        self._len = len(items) if items else 0

    def set(self, key: str, value: tuple[Any, ...]) -> BranchEffects:
        """A new map with ``key`` set to ``value`` (this one is unchanged)."""
        i, j = _slot(key)
        top = self._buckets
        row = top[i]
        old = row[j]
        leaf = dict(old)
        leaf[key] = value
        # (A list copied and made a tuple again: the quickest copy of 32 items.)
        leaves = list(row)
        leaves[j] = leaf
        rows = list(top)
        rows[i] = tuple(leaves)
        new = BranchEffects.__new__(BranchEffects)
        new._buckets = tuple(rows)
        new._len = self._len + (key not in old)
        return new

    def __getitem__(self, key: str) -> tuple[Any, ...]:
        i, j = _slot(key)
        return self._buckets[i][j][key]

    def get(self, key: str, default: Any = None) -> Any:
        i, j = _slot(key)
        return self._buckets[i][j].get(key, default)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        i, j = _slot(key)
        return key in self._buckets[i][j]

    def __iter__(self) -> Iterator[str]:
        for row in self._buckets:
            if row is _EMPTY_ROW:
                continue
            for leaf in row:
                yield from leaf

    def __len__(self) -> int:
        return self._len

    def as_dict(self) -> dict[str, tuple[Any, ...]]:
        """Every entry in a plain dict, made by merging the leaves (no key is hashed
        again): for whoever looks up most of the entries at once (a map collected)."""
        out: dict[str, tuple[Any, ...]] = {}
        for row in self._buckets:
            if row is _EMPTY_ROW:
                continue
            for leaf in row:
                if leaf:
                    out.update(leaf)
        return out

    def __repr__(self) -> str:
        return f"BranchEffects({dict(self)!r})"


def _slot(key: str) -> tuple[int, int]:
    """The row and the leaf of ``key``."""
    return divmod(
        zlib.crc32(key.encode("utf-8", "surrogatepass")) % (_BUCKETS * _BUCKETS), _BUCKETS
    )


_NO_BRANCH_EFFECTS = BranchEffects()


class Branch(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One slot of a running parallel super-step: a frontier node and its outcome."""

    node_id: str
    visit: int
    entered_ts: float = 0.0
    done: NodeCompleted | NodeFailed | None = None


class RunState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Everything the decider needs to know about a run, and nothing it doesn't."""

    run_id: str = ""
    # new, running, waiting, interrupted, completed, completed_with_errors, failed, cancelled
    status: str = "new"
    last_seq: int = 0
    started_ts: float = 0.0
    last_ts: float = 0.0
    graph_name: str = ""
    graph_source: str = ""
    graph_hash: str = ""
    graph_path: str = ""
    agent_dir: str = ""
    parent_run_id: str | None = None
    initial_prompt: str = ""
    state: dict[str, Any] = {}
    visits: dict[str, int] = {}
    # The node entered and not yet completed, with the effect events of this visit.
    current: str | None = None
    current_visit: int = 0
    current_entered_ts: float = 0.0
    effects: tuple[Event, ...] = ()
    waiting: HumanInputRequested | None = None
    # Where the last completed node routed (to be entered next).
    routed_to: str | None = None
    last_node: str | None = None
    steps: int = 0
    children: dict[str, str] = {}  # child run id -> running/completed/failed/cancelled
    output: str | None = None
    error: str | None = None
    # The next frontier: where the last completed node (or super-step) routed.
    targets: tuple[str, ...] = ()
    # Parallel super-steps: how many began, the running one's slots (branch id ->
    # Branch) and the effect events of every branch and map item (branch id -> events).
    step: int = 0
    branches: dict[str, Branch] = {}
    branch_effects: Mapping[str, tuple[Event, ...]] = _NO_BRANCH_EFFECTS
    # The running super-step's join policy (``{type, count, timeout}``; empty: all).
    join: dict[str, Any] = {}
    interrupted: bool = False
    # Tolerated failures so far (a node failed and routed on): (node, visit, error,
    # routed to), in log order; the decider judges which of them were handled.
    failures: tuple[tuple[str, int, str, str | None], ...] = ()
    # The unhandled failures the run completed with (``completed_with_errors``).
    unhandled: tuple[dict[str, Any], ...] = ()
    # The branches an ``any``/``count`` join went on without because they failed:
    # ``{step, branch, node, error}``, in log order (named with the outcome).
    left_out: tuple[dict[str, Any], ...] = ()

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


#: Statuses after which a run never changes again.
TERMINAL = ("completed", "completed_with_errors", "failed", "cancelled")


def _failure(state: RunState, event: NodeCompleted) -> tuple[tuple[str, int, str, str | None], ...]:
    """``state.failures`` with ``event``'s tolerated failure added (if it is one)."""
    if not event.failed:
        return state.failures
    return (*state.failures, (event.node_id, event.visit, event.error or "", event.routed_to))


def effect_output(effects: Iterable[Any]) -> dict[str, Any] | None:
    """The JSON object a node's effect produced (a script's stdout), if any."""
    output = None
    for event in effects:
        if isinstance(event, ScriptFinished):
            output = event.output
    return output


def apply(state: RunState, event: Event) -> RunState:
    """The state after one event."""
    # ``last_seq``/``last_ts`` are passed in each arm, not from one shared dict: a dict
    # fewer per event makes a fold of 10,000 events about a quarter faster.
    if event.branch:
        return _apply_branch(state, event)
    match event:
        case RunStarted():
            return _replace(
                state,
                run_id=event.run_id,
                status="running",
                started_ts=event.ts,
                graph_name=event.graph_name,
                graph_source=event.graph_source,
                graph_hash=event.graph_hash,
                graph_path=event.graph_path,
                agent_dir=event.agent_dir,
                parent_run_id=event.parent_run_id,
                initial_prompt=event.initial_prompt,
                state=dict(event.initial_state),
                last_seq=event.seq,
                last_ts=event.ts,
            )
        case NodeEntered(node_id=node_id, visit=visit):
            visits = dict(state.visits)
            visits[node_id] = visit
            return _replace(
                state,
                current=node_id,
                current_visit=visit,
                current_entered_ts=event.ts,
                effects=(),
                visits=visits,
                routed_to=None,
                waiting=None,
                steps=state.steps + 1,
                last_seq=event.seq,
                last_ts=event.ts,
            )
        case (
            ScriptFinished()
            | LlmCalled()
            | ToolCalled()
            | LlmContinued()
            | LlmResult()
            | RetrievalDone()
            | NodeRetrying()
            | ToolFinished()
        ):
            return _replace(
                state, effects=(*state.effects, event), last_seq=event.seq, last_ts=event.ts
            )
        case HumanInputRequested():
            return _replace(
                state, status="waiting", waiting=event, last_seq=event.seq, last_ts=event.ts
            )
        case HumanInputReceived():
            return _replace(
                state,
                status="running" if not state.terminal else state.status,
                waiting=None,
                effects=(*state.effects, event),
                last_seq=event.seq,
                last_ts=event.ts,
            )
        case NodeCompleted(updates=updates, merge_effect=merge):
            new_state = state.state
            if merge or updates:
                new_state = dict(new_state)
                if merge:
                    merged = effect_output(state.effects) or {}
                    new_state.update((k, v) for k, v in merged.items() if k != "_next")
                new_state.update(updates)
            return _replace(
                state,
                state=new_state,
                current=None,
                routed_to=event.routed_to,
                targets=_targets(event),
                last_node=event.node_id,
                branch_effects=_NO_BRANCH_EFFECTS,
                failures=_failure(state, event),
                last_seq=event.seq,
                last_ts=event.ts,
            )
        case NodeFailed():
            return _replace(
                state, current=None, last_node=event.node_id, last_seq=event.seq, last_ts=event.ts
            )
        case ChildRunStarted(child_run_id=child):
            children = {**state.children, child: "running"}
            return _replace(
                state,
                children=children,
                effects=(*state.effects, event),
                last_seq=event.seq,
                last_ts=event.ts,
            )
        case ChildRunFinished(child_run_id=child, status=status):
            children = {**state.children, child: status}
            return _replace(
                state,
                children=children,
                effects=(*state.effects, event),
                last_seq=event.seq,
                last_ts=event.ts,
            )
        case ChildCancelled(child_run_id=child):
            return _replace(
                state,
                children={**state.children, child: "cancelled"},
                last_seq=event.seq,
                last_ts=event.ts,
            )
        case StepStarted(step=step):
            return _replace(
                state,
                step=step,
                join=event.join,
                branches={},
                branch_effects=_NO_BRANCH_EFFECTS,
                routed_to=None,
                targets=(),
                waiting=None,
                last_seq=event.seq,
                last_ts=event.ts,
            )
        case BranchesJoined():
            # The cancelled and failed branches leave the step: only the counted ones
            # merge.
            cancelled = {*event.cancelled, *event.failed}
            branches = {b: s for b, s in state.branches.items() if b not in cancelled}
            effects = BranchEffects(
                {b: e for b, e in state.branch_effects.items() if b not in cancelled}
            )
            left_out = state.left_out
            if event.failed:
                left_out += tuple(
                    {
                        "step": event.step,
                        "branch": b,
                        "node": slot.node_id if (slot := state.branches.get(b)) else b,
                        "error": event.errors.get(b, ""),
                    }
                    for b in event.failed
                )
            return _replace(
                state,
                branches=branches,
                branch_effects=effects,
                left_out=left_out,
                last_seq=event.seq,
                last_ts=event.ts,
            )
        case BranchesMerged(merged=merged, targets=targets):
            new_state = {**state.state, **merged} if merged else state.state
            return _replace(
                state,
                join={},
                state=new_state,
                branches={},
                branch_effects=_NO_BRANCH_EFFECTS,
                current=None,
                routed_to=targets[0] if len(targets) == 1 else None,
                targets=tuple(targets),
                last_node=f"super-step {event.step}",
                last_seq=event.seq,
                last_ts=event.ts,
            )
        case GraphUpgraded():
            changes: dict[str, Any] = {
                "graph_source": event.graph_source,
                "graph_hash": event.new_hash,
                "graph_path": event.graph_path or state.graph_path,
                "agent_dir": event.agent_dir or state.agent_dir,
            }
            if state.status == "failed":
                # Back to life: the node that failed is entered again, as the same
                # visit (the failed one is superseded, see GraphUpgraded).
                changes.update(status="running", error=None, current=None, interrupted=False)
                retry = event.retry_node
                if retry:
                    visits = dict(state.visits)
                    visits[retry] = max(0, visits.get(retry, 1) - 1)
                    changes.update(routed_to=retry, targets=(retry,), visits=visits)
            return _replace(state, **changes, last_seq=event.seq, last_ts=event.ts)
        case RunResumed():
            status = state.status if state.terminal or state.waiting else "running"
            return _replace(
                state, status=status, interrupted=False, last_seq=event.seq, last_ts=event.ts
            )
        case RunInterrupted():
            status = state.status if state.terminal or state.waiting else "interrupted"
            return _replace(
                state, status=status, interrupted=True, last_seq=event.seq, last_ts=event.ts
            )
        case RunCompleted(output=output, unhandled_failures=unhandled):
            status = "completed_with_errors" if unhandled else "completed"
            return _replace(
                state,
                status=status,
                output=output,
                current=None,
                unhandled=tuple(unhandled),
                last_seq=event.seq,
                last_ts=event.ts,
            )
        case RunFailed(error=error):
            return _replace(
                state, status="failed", error=error, last_seq=event.seq, last_ts=event.ts
            )
        case RunCancelled(reason=reason):
            return _replace(
                state, status="cancelled", error=reason, last_seq=event.seq, last_ts=event.ts
            )
        case _:
            return _replace(state, last_seq=event.seq, last_ts=event.ts)


def _targets(event: NodeCompleted) -> tuple[str, ...]:
    if event.fan_out:
        return tuple(event.fan_out)
    return (event.routed_to,) if event.routed_to else ()


def _apply_branch(state: RunState, event: Event) -> RunState:
    """An event of one branch of a parallel step, or of one map item."""
    bid = event.branch
    match event:
        case NodeEntered(node_id=node_id, visit=visit):
            visits = {**state.visits, node_id: visit}
            branches = {
                **state.branches,
                bid: Branch(node_id=node_id, visit=visit, entered_ts=event.ts),
            }
            return _replace(
                state,
                branches=branches,
                visits=visits,
                steps=state.steps + 1,
                last_seq=event.seq,
                last_ts=event.ts,
            )
        case NodeCompleted() | NodeFailed():
            slot = state.branches.get(bid)
            if slot is None:
                return _replace(state, last_seq=event.seq, last_ts=event.ts)
            branches = {**state.branches, bid: _replace(slot, done=event)}
            if isinstance(event, NodeCompleted) and event.failed:
                return _replace(
                    state,
                    branches=branches,
                    failures=_failure(state, event),
                    last_seq=event.seq,
                    last_ts=event.ts,
                )
            return _replace(state, branches=branches, last_seq=event.seq, last_ts=event.ts)
        case HumanInputRequested():
            return _replace(
                state, status="waiting", waiting=event, last_seq=event.seq, last_ts=event.ts
            )
        case HumanInputReceived():
            effects = _add_effect(state.branch_effects, bid, event)
            return _replace(
                state,
                status="running" if not state.terminal else state.status,
                waiting=None,
                branch_effects=effects,
                last_seq=event.seq,
                last_ts=event.ts,
            )
        case ChildRunStarted(child_run_id=child) | ChildRunFinished(child_run_id=child):
            status = "running" if isinstance(event, ChildRunStarted) else event.status
            effects = _add_effect(state.branch_effects, bid, event)
            children = {**state.children, child: status}
            return _replace(
                state,
                children=children,
                branch_effects=effects,
                last_seq=event.seq,
                last_ts=event.ts,
            )
        case (
            ScriptFinished()
            | LlmCalled()
            | ToolCalled()
            | LlmContinued()
            | LlmResult()
            | RetrievalDone()
            | NodeRetrying()
            | ToolFinished()
        ):
            if isinstance(event, LlmResult):
                effects = _settle_llm(state.branch_effects, bid, event)
            else:
                effects = _add_effect(state.branch_effects, bid, event)
            return _replace(state, branch_effects=effects, last_seq=event.seq, last_ts=event.ts)
        case _:
            # Run-level facts never carry a branch; be lenient with one that does.
            return apply(state, _replace(event, branch=""))


def _settle_llm(
    effects: Mapping[str, tuple[Any, ...]], bid: str, event: LlmResult
) -> BranchEffects:
    """A branch's effects once its llm effect replied: the calls and tool calls that
    led to the reply are left out. What the decider reads of a finished effect is
    its result (a retry starts after it, from nothing); the requests and responses
    stay in the log, where usage, reports and replays read them. So a map's items
    keep one small event each, not every exchange, until the map is collected."""
    if not isinstance(effects, BranchEffects):
        effects = BranchEffects(effects)
    kept = tuple(e for e in effects.get(bid, ()) if not isinstance(e, LlmCalled | ToolCalled))
    return effects.set(bid, (*kept, event))


def _add_effect(effects: Mapping[str, tuple[Any, ...]], bid: str, event: Event) -> BranchEffects:
    if not isinstance(effects, BranchEffects):
        effects = BranchEffects(effects)
    return effects.set(bid, (*effects.get(bid, ()), event))


def fold(events: Iterable[Event], state: RunState | None = None) -> RunState:
    """Fold events onto ``state`` (or a new run)."""
    current = state if state is not None else RunState()
    for event in events:
        current = apply(current, event)
    return current
