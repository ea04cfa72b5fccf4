"""Replay: re-drive a recorded run through today's decider, effects served from the log.

No effect is performed, nothing is written, no actor is asked: the recorded log is
walked once. Every decision the decider makes now is compared with the recorded
one; every effect the decider asks for is checked against the recorded request
(the rendered prompt, the script's input, the question shown) and its recorded
outcome is applied. The first difference is a :class:`Divergence`.

With another graph (``--graph``) the same walk is a regression test: recorded
effects are matched by node and visit and by their request; a request that
changed is reported with the node, the field and a diff.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from graphrun.actors.messages import AgentTask, HumanTask, RagTask, ScriptTask
from graphrun.eventstore import codec
from graphrun.eventstore.events import (
    ChildCancelled,
    ChildRunFinished,
    ChildRunStarted,
    Event,
    HumanInputReceived,
    LlmCalled,
    LlmResult,
    NodeFailed,
    RetrievalDone,
    RunCancelled,
    RunFailed,
    RunInterrupted,
    RunResumed,
    RunStarted,
    ScriptFinished,
    TimeoutFired,
    ToolCalled,
)
from graphrun.eventstore.fold import RunState, apply
from graphrun.runtime import decider
from graphrun.runtime.errors import GraphrunError
from graphrun.runtime.graph import Graph
from graphrun.runtime.loader import LoadedGraph

EFFECTS = (
    ScriptFinished,
    LlmCalled,
    ToolCalled,
    LlmResult,
    RetrievalDone,
    ChildRunStarted,
    ChildRunFinished,
    HumanInputReceived,
)
SUPERVISOR_FACTS = (RunResumed, ChildCancelled, RunCancelled, RunInterrupted)


class ReplayError(GraphrunError):
    """A log that cannot be replayed at all (not a divergence)."""


@dataclass(frozen=True)
class Divergence:
    """Where a replay first decided differently from the log."""

    seq: int | None
    node_id: str | None
    kind: str  # "decision", "request", "extra", "missing"
    message: str
    recorded: Any = None
    now: Any = None
    field: str | None = None
    event_type: str | None = None  # the recorded event at ``seq``

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``--json`` output), with the diff."""
        return {
            "seq": self.seq,
            "event_type": self.event_type,
            "node_id": self.node_id,
            "kind": self.kind,
            "field": self.field,
            "message": self.message,
            "recorded": self.recorded,
            "now": self.now,
            "diff": self.diff(),
        }

    def diff(self) -> str:
        """A short unified diff of recorded vs now."""
        if self.recorded is None and self.now is None:
            return ""
        a = _pretty(self.recorded).splitlines()
        b = _pretty(self.now).splitlines()
        lines = list(difflib.unified_diff(a, b, "recorded", "now", lineterm="", n=2))
        return "\n".join(lines[:60])

    def format(self) -> str:
        """The report: where (seq, event type, node, field), what, and the diff."""
        where = []
        if self.seq is not None:
            where.append(
                f"seq {self.seq} ({self.event_type})" if self.event_type else f"seq {self.seq}"
            )
        if self.node_id:
            where.append(f"node '{self.node_id}'")
        if self.field:
            where.append(f"field '{self.field}'")
        head = f"diverged at {', '.join(where)}: {self.message}" if where else self.message
        d = self.diff()
        return f"{head}\n{d}" if d else head


def _pretty(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@dataclass
class ReplayResult:
    """What a replay found: counts, the first divergence (if any), the final state."""

    run_id: str
    events: int
    decisions: int = 0
    effects: int = 0
    divergence: Divergence | None = None
    final: RunState | None = None
    notes: list[str] = field(default_factory=list)
    # The log stops between decisions that are recorded together (one node step).
    ends_mid_step: bool = False

    @property
    def ok(self) -> bool:
        return self.divergence is None


def _payload(event: Event) -> dict[str, Any]:
    data = msgspec.to_builtins(event)
    for key in ("run_id", "seq", "ts"):
        data.pop(key, None)
    return data


def _same(a: Event, b: Event) -> bool:
    if type(a) is not type(b):
        return False
    return codec.encode(msgspec.structs.replace(a, run_id="", seq=0, ts=0.0)) == codec.encode(
        msgspec.structs.replace(b, run_id="", seq=0, ts=0.0)
    )


def _changed_fields(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    keys = sorted(set(recorded) | set(now))
    return [k for k in keys if recorded.get(k) != now.get(k)]


class Replayer:
    """Walks one recorded log against a graph."""

    def __init__(
        self,
        events: list[Event],
        graph: Graph,
        *,
        agent_dir: Path | None = None,
        check_files: bool = False,
        recorded_graph: Graph | None = None,
        on_effect: Callable[[decider.Perform, list[Event]], None] | None = None,
        sources: dict[str, str] | None = None,
    ) -> None:
        self.events = events
        self.graph = graph
        self.recorded_graph = recorded_graph
        self.agent_dir = agent_dir
        self.check_files = check_files
        # Called with each request and the recorded events that answered it.
        self.on_effect = on_effect
        # Script texts as recorded (from an export file), to diff a changed script.
        self.sources = sources

    def run(self) -> ReplayResult:
        """Walk the log; the first difference stops the walk."""
        result = self._walk()
        if result.divergence is not None and result.divergence.event_type is None:
            seq = result.divergence.seq
            if seq is not None and 1 <= seq <= len(self.events):
                result.divergence = replace(
                    result.divergence, event_type=type(self.events[seq - 1]).__name__
                )
        final = result.final
        if result.ok and final is not None and not final.terminal:
            if final.waiting is not None:
                result.notes.append(
                    f"the log ends waiting for a person at node '{final.waiting.node_id}'"
                )
            else:
                result.notes.append(
                    "the run had not ended (interrupted or still running; "
                    "`graphrun resume` continues it)"
                )
        return result

    def _walk(self) -> ReplayResult:
        events = self.events
        if not events or not isinstance(events[0], RunStarted):
            raise ReplayError("a recorded run starts with RunStarted; this log does not")
        result = ReplayResult(events[0].run_id, len(events))
        state = apply(RunState(), events[0])
        pos = 1
        n = len(events)
        decide = decider.decide
        graph = self.graph
        while pos < n:
            rec = events[pos]
            if isinstance(rec, SUPERVISOR_FACTS):
                state = apply(state, rec)
                pos += 1
                continue
            if isinstance(rec, TimeoutFired):
                # A supervisor policy fired; the run's failure follows it.
                state = apply(state, rec)
                pos += 1
                if pos < n and isinstance(events[pos], RunFailed):
                    state = apply(state, events[pos])
                    pos += 1
                continue
            step = decide(graph, state)
            if isinstance(step, decider.Append):
                for i, now in enumerate(step.events):
                    if pos >= n:
                        # The log ends here: an interrupted run the decider would continue.
                        result.notes.append(f"the log ends before {type(now).__name__}")
                        result.ends_mid_step = i > 0
                        result.final = state
                        return result
                    rec = events[pos]
                    if not _same(now, rec):
                        result.divergence = self._decision_divergence(rec, now)
                        result.final = state
                        return result
                    state = apply(state, rec)
                    result.decisions += 1
                    pos += 1
                continue
            if isinstance(step, decider.PerformMany):
                outcome_or_problem = self._step_effects(step, pos, state)
                if isinstance(outcome_or_problem, Divergence):
                    result.divergence = outcome_or_problem
                    result.final = state
                    return result
                consumed = outcome_or_problem
                for event in consumed:
                    state = apply(state, event)
                pos += len(consumed)
                result.effects += sum(1 for e in consumed if isinstance(e, EFFECTS))
                if (
                    pos < n
                    and isinstance(events[pos], RunFailed)
                    and consumed
                    and isinstance(consumed[-1], NodeFailed)
                ):
                    state = apply(state, events[pos])
                    pos += 1
                continue
            if isinstance(step, decider.Finished):
                result.divergence = Divergence(
                    rec.seq,
                    getattr(rec, "node_id", None),
                    "extra",
                    f"the decider finished the run ({step.status}) but the log continues "
                    f"with {type(rec).__name__}",
                    recorded=_payload(rec),
                )
                result.final = state
                return result
            # Perform: the recorded outcome of this node's effect must follow.
            if isinstance(rec, NodeFailed) and rec.node_id == step.node_id:
                # The effect raised; the supervisor recorded the failure.
                state = apply(state, rec)
                pos += 1
                if pos < n and isinstance(events[pos], RunFailed):
                    state = apply(state, events[pos])
                    pos += 1
                continue
            if not isinstance(rec, EFFECTS) or getattr(rec, "node_id", None) != step.node_id:
                result.divergence = Divergence(
                    rec.seq,
                    step.node_id,
                    "decision",
                    f"the decider now runs node '{step.node_id}' ({step.node_type}) but the "
                    f"log has {type(rec).__name__}"
                    + (f" of node '{rec.node_id}'" if hasattr(rec, "node_id") else ""),
                    recorded=_payload(rec),
                )
                result.final = state
                return result
            first = pos
            while (
                pos < n
                and isinstance(events[pos], EFFECTS)
                and getattr(events[pos], "node_id", None) == step.node_id
            ):
                pos += 1
            outcome = events[first:pos]
            problem = check_request(step, outcome, self.agent_dir, self.check_files, self.sources)
            if problem is None and self.recorded_graph is not None:
                problem = self._against_recorded(state, step, outcome[0].seq)
            if problem is not None:
                result.divergence = problem
                result.final = state
                return result
            if self.on_effect is not None:
                self.on_effect(step, outcome)
            for event in outcome:
                state = apply(state, event)
            result.effects += len(outcome)
        result.final = state
        return result

    def _step_effects(
        self, step: decider.PerformMany, pos: int, state: RunState
    ) -> list[Event] | Divergence:
        """The recorded effects of a super-step's tasks, from ``pos`` on (in log order,
        whatever order the branches completed in), each checked against its request."""
        events = self.events
        by_branch = {task.branch: task for task in step.tasks}
        consumed: list[Event] = []
        i = pos
        while i < len(events):
            rec = events[i]
            if isinstance(rec, EFFECTS) and rec.branch in by_branch:
                consumed.append(rec)
                i += 1
                continue
            if isinstance(rec, NodeFailed) and rec.branch in by_branch:
                # An effect raised; the supervisor recorded the branch's failure.
                consumed.append(rec)
                i += 1
                break
            break
        if not consumed:
            if i >= len(events):
                return []
            rec = events[i]
            names = ", ".join(sorted(by_branch))
            return Divergence(
                rec.seq,
                getattr(rec, "node_id", None),
                "decision",
                f"the decider now runs branches {names} but the log has {type(rec).__name__}"
                + (f" of node '{rec.node_id}'" if getattr(rec, "node_id", None) else ""),
                recorded=_payload(rec),
            )
        recorded: dict[str, decider.Perform] = {}
        if self.recorded_graph is not None:
            try:
                old = decider.decide(self.recorded_graph, state)
            except GraphrunError:
                old = None
            if isinstance(old, decider.PerformMany):
                recorded = {t.branch: t for t in old.tasks}
        outcomes: dict[str, list[Event]] = {}
        for e in consumed:
            if isinstance(e, EFFECTS):
                outcomes.setdefault(e.branch, []).append(e)
        for branch, task in sorted(by_branch.items()):
            outcome = outcomes.get(branch, [])
            if not outcome:
                continue
            problem = check_request(task, outcome, self.agent_dir, self.check_files, self.sources)
            was = recorded.get(branch)
            if problem is None and was is not None and was.node_id == task.node_id:
                problem = task_divergence(was.task, task.task, outcome[0].seq)
            if problem is not None:
                return problem
            if self.on_effect is not None:
                self.on_effect(task, outcome)
        return consumed

    def _against_recorded(
        self, state: RunState, step: decider.Perform, seq: int
    ) -> Divergence | None:
        try:
            old = decider.decide(self.recorded_graph, state)  # type: ignore[arg-type]
        except GraphrunError:
            return None
        if not isinstance(old, decider.Perform) or old.node_id != step.node_id:
            return None
        return task_divergence(old.task, step.task, seq)

    def _decision_divergence(self, rec: Event, now: Event) -> Divergence:
        node = getattr(rec, "node_id", None) or getattr(now, "node_id", None)
        if type(rec) is not type(now):
            return Divergence(
                rec.seq,
                node,
                "decision",
                f"recorded {type(rec).__name__}, now {type(now).__name__}",
                recorded=_payload(rec),
                now=_payload(now),
            )
        a, b = _payload(rec), _payload(now)
        changed = _changed_fields(a, b)
        detail = ", ".join(changed)
        what = type(rec).__name__
        if what == "NodeCompleted" and "routed_to" in changed:
            message = f"routed to '{b.get('routed_to')}', recorded '{a.get('routed_to')}'"
        else:
            message = f"{what} differs in {detail}"
        if len(changed) == 1:
            # One field: diff its values themselves (a prompt diffs line by line).
            return Divergence(
                rec.seq,
                node,
                "decision",
                message,
                recorded=a.get(changed[0]),
                now=b.get(changed[0]),
                field=changed[0],
            )
        return Divergence(
            rec.seq,
            node,
            "decision",
            message,
            recorded={k: a.get(k) for k in changed},
            now={k: b.get(k) for k in changed},
        )


def check_request(
    step: decider.Perform,
    outcome: list[Event],
    agent_dir: Path | None,
    check_files: bool,
    sources: dict[str, str] | None = None,
) -> Divergence | None:
    """Does the recorded effect answer the request the decider makes now?

    With ``check_files`` the script file in ``agent_dir`` must be the one that ran
    (same hash); ``sources`` (script texts as recorded) turn a changed script
    into a text diff instead of two hashes.
    """
    task = step.task
    first = outcome[0]
    seq = first.seq
    if isinstance(task, ScriptTask):
        done = next((e for e in outcome if isinstance(e, ScriptFinished)), None)
        if done is None:
            return None
        if done.script != task.script:
            return Divergence(
                seq,
                task.node_id,
                "request",
                "a different script runs now",
                recorded=done.script,
                now=task.script,
                field="script",
            )
        if done.input_hash and done.input_hash != codec.content_hash(task.state_json):
            return Divergence(
                seq,
                task.node_id,
                "request",
                "the script now receives a different state",
                field="GRAPH_STATE",
                now=json.loads(task.state_json),
            )
        if check_files and agent_dir is not None and done.script_hash:
            path = agent_dir / task.script
            text: str | None = None
            try:
                data = path.read_bytes()
                current = codec.content_hash(data)
                text = data.decode("utf-8", "replace")
            except OSError:
                current = "(missing)"
            if current != done.script_hash:
                old_text = (sources or {}).get(task.script)
                if old_text is not None and codec.content_hash(old_text) == done.script_hash:
                    recorded_value, now_value = old_text, text if text is not None else current
                else:
                    recorded_value, now_value = done.script_hash, current
                return Divergence(
                    seq,
                    task.node_id,
                    "request",
                    f"script file {task.script} changed since the run was recorded",
                    field="script",
                    recorded=recorded_value,
                    now=now_value,
                )
        return None
    checks = _RECORDED_REQUEST.get(type(task))
    if checks is None:
        return None
    kind, fields = checks
    recorded = next((e for e in outcome if isinstance(e, kind)), None)
    if recorded is None:
        return None
    for event_field, task_field, message in fields:
        was = getattr(recorded, event_field)
        now = getattr(task, task_field)
        if isinstance(was, list | tuple):
            was, now = list(was), list(now)
        # Human answers recorded without what was shown carry empty defaults.
        if kind is HumanInputReceived and was in ("", []):
            continue
        if was != now:
            return Divergence(
                seq, task.node_id, "request", message, field=task_field, recorded=was, now=now
            )
    return None


#: Per task type: the effect event that records its request, and the
#: (event field, task field, message) pairs that must still agree.
_RECORDED_REQUEST: dict[type, tuple[type, tuple[tuple[str, str, str], ...]]] = {
    HumanTask: (
        HumanInputReceived,
        (
            ("question", "question", "the question shown now differs"),
            ("options", "options", "the options shown now differ"),
        ),
    ),
    RagTask: (RetrievalDone, (("query", "query", "the retrieval query differs"),)),
    AgentTask: (
        ChildRunStarted,
        (
            ("prompt", "prompt", "the child agent's prompt differs"),
            ("agent", "agent", "a different child agent runs now"),
        ),
    ),
}


def task_divergence(old: Any, new: Any, seq: int | None) -> Divergence | None:
    """Compare the request the recorded graph made with the one the new graph makes."""
    import dataclasses

    if type(old) is not type(new):
        return Divergence(
            seq,
            getattr(new, "node_id", None),
            "request",
            "the node's kind of effect changed",
            recorded=type(old).__name__,
            now=type(new).__name__,
        )
    for f in dataclasses.fields(new):
        if f.name in ("state_json", "visit", "node_id"):
            continue
        a, b = getattr(old, f.name), getattr(new, f.name)
        if a != b:
            return Divergence(
                seq,
                new.node_id,
                "request",
                f"the node's {f.name} changed",
                field=f.name,
                recorded=a,
                now=b,
            )
    return None


RequestKey = tuple[str, int, str]  # (node id, visit, branch)


def recorded_requests(events: list[Event]) -> dict[RequestKey, tuple[Any, list[Event]]]:
    """Each effect request the recorded graph made, by (node id, visit, branch), with
    the recorded events that answered it (walked through the run's own graph)."""
    from graphrun.eventstore.fold import fold
    from graphrun.runtime.supervisor import graph_of

    found: dict[RequestKey, tuple[Any, list[Event]]] = {}

    def keep(step: decider.Perform, outcome: list[Event]) -> None:
        found[(step.node_id, step.task.visit, step.branch)] = (step.task, list(outcome))

    graph = graph_of(fold(events[:1])).graph
    Replayer(events, graph, on_effect=keep).run()
    return found


def replay_events(
    events: list[Event],
    loaded: LoadedGraph | None = None,
    *,
    check_files: bool = False,
    sources: dict[str, str] | None = None,
) -> ReplayResult:
    """Replay recorded events against ``loaded`` (default: the run's own graph).

    ``check_files``: also require the agent's script files to be the ones that ran.
    ``sources``: the recorded script texts (an export header's), for readable diffs.
    """
    from graphrun.eventstore.fold import fold
    from graphrun.runtime.supervisor import graph_of

    first = events[0] if events else None
    if not isinstance(first, RunStarted):
        raise ReplayError("a recorded run starts with RunStarted; this log does not")
    if loaded is not None and loaded.source == first.graph_source:
        # The graph is unchanged: no need to parse the recorded copy.
        return Replayer(
            events,
            loaded.graph,
            agent_dir=loaded.agent_dir,
            check_files=check_files,
            sources=sources,
        ).run()
    recorded = graph_of(fold(events[:1]))
    if loaded is None:
        return Replayer(
            events,
            recorded.graph,
            agent_dir=recorded.agent_dir,
            check_files=check_files,
            sources=sources,
        ).run()
    return Replayer(
        events,
        loaded.graph,
        agent_dir=loaded.agent_dir,
        check_files=check_files,
        recorded_graph=recorded.graph,
        sources=sources,
    ).run()
