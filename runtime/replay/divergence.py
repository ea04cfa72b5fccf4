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
from msgspec.structs import astuple

from graphrun.actors.messages import AgentTask, HumanTask, RagTask, ScriptTask
from graphrun.eventstore import codec
from graphrun.eventstore.events import (
    EFFECT_TYPES,
    BranchesJoined,
    BranchesMerged,
    ChildRunStarted,
    Event,
    HumanInputReceived,
    NodeCompleted,
    NodeFailed,
    RetrievalDone,
    RunFailed,
    RunStarted,
    ScriptFinished,
    StepStarted,
    TimeoutFired,
)
from graphrun.eventstore.fold import RunState
from graphrun.runtime.engine import decider
from graphrun.runtime.errors import GraphrunError
from graphrun.runtime.graph.loader import LoadedGraph
from graphrun.runtime.graph.model import Graph
from graphrun.runtime.replay.sources import (
    IGNORED,
    LogEnds,
    RecordedSource,
    ScratchLog,
    rag_rerun,
    script_changed,
    slot_of,
)
from graphrun.runtime.replay.view import upgraded_view


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
    divergence: Divergence | None = None  # the first of :attr:`divergences`
    divergences: list[Divergence] = field(default_factory=list)
    final: RunState | None = None
    notes: list[str] = field(default_factory=list)
    # The log stops between decisions that are recorded together (one node step).
    ends_mid_step: bool = False

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def describe(self) -> str:
        """Every divergence: a summary of the nodes that changed, then each report."""
        found = self.divergences or ([self.divergence] if self.divergence else [])
        if len(found) <= 1:
            return found[0].format() if found else ""
        nodes = list(dict.fromkeys(d.node_id or "(run)" for d in found))
        head = f"{len(found)} divergences, in {', '.join(nodes)}"
        return "\n".join([head, *(f"[{i}] {d.format()}" for i, d in enumerate(found, 1))])


def _payload(event: Event) -> dict[str, Any]:
    # (An LLM call read light keeps its wire bodies as JSON text: decoded here.)
    data = msgspec.to_builtins(event, enc_hook=codec.raw_as_json)
    for key in ("run_id", "seq", "ts"):
        data.pop(key, None)
    return data


def _same(a: Event, b: Event) -> bool:
    """Equal events but for their envelope (run id, seq, time): every other field.

    ``astuple`` lists the envelope's three fields first (``EventBase``)."""
    if type(a) is not type(b):
        return False
    return astuple(a)[3:] == astuple(b)[3:]


def _changed_fields(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    keys = sorted(set(recorded) | set(now))
    return [k for k in keys if recorded.get(k) != now.get(k)]


def _decision_divergence(rec: Event, now: Event) -> Divergence:
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
    own = getattr(task, "check_recorded", None)
    if own is not None:
        # A kind's task that says itself how its request compares with the recording.
        differs = own(outcome)
        if differs is None:
            return None
        field, was, now, message = differs
        return Divergence(seq, task.node_id, "request", message, field=field, recorded=was, now=now)
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


def skill_divergence(outcome: list[Event]) -> Divergence | None:
    """A skill the recorded visit loaded (``skill__load``: its body, which went into
    the system prompt, is recorded with the call; older logs have it in the result)
    whose document reads differently today. A skill that cannot be found here (no
    configuration directory) is not a change."""
    from graphrun.eventstore.events import ToolCalled
    from graphrun.runtime.graph.config import config_dir
    from graphrun.runtime.nodes.builtins.skills import find_skill, read_skill

    for event in outcome:
        if not isinstance(event, ToolCalled) or event.name != "skill__load" or event.is_error:
            continue
        try:
            name = str(json.loads(event.arguments or "{}").get("name") or "")
            was = event.instructions
            if was is None:
                loaded = json.loads(event.result)
                was = loaded.get("instructions") if isinstance(loaded, dict) else None
        except (ValueError, AttributeError):
            continue
        path = find_skill(name, config_dir(None)) if name else None
        if not isinstance(was, str) or path is None:
            continue
        now = read_skill(path)[1]
        if now != was:
            return Divergence(
                event.seq,
                event.node_id,
                "request",
                f"skill '{name}' ({path}) changed since the run was recorded",
                field="skill",
                recorded=was,
                now=now,
            )
    return None


def task_divergence(old: Any, new: Any, seq: int | None) -> Divergence | None:
    """Compare the request the recorded graph made with the one the new graph makes."""
    from graphrun.runtime.nodes.plan import task_fields

    if type(old) is not type(new):
        return Divergence(
            seq,
            getattr(new, "node_id", None),
            "request",
            "the node's kind of effect changed",
            recorded=type(old).__name__,
            now=type(new).__name__,
        )
    for name in task_fields(new):
        if name in ("state_json", "visit", "node_id"):
            continue
        a, b = getattr(old, name), getattr(new, name)
        if a != b:
            return Divergence(
                seq,
                new.node_id,
                "request",
                f"the node's {name} changed",
                field=name,
                recorded=a,
                now=b,
            )
    return None


RequestKey = tuple[str, int, str]  # (node id, visit, branch)


def recorded_requests(events: list[Event]) -> dict[RequestKey, tuple[Any, list[Event]]]:
    """Each effect request the recorded graph made, by (node id, visit, branch), with
    the recorded events that answered it (the run replayed through its own graph)."""
    found: dict[RequestKey, tuple[Any, list[Event]]] = {}

    def keep(step: decider.Perform, outcome: list[Event]) -> None:
        found[(step.node_id, step.task.visit, step.branch)] = (step.task, list(outcome))

    replay_events(events, on_effect=keep)
    return found


def _behaviour(event: Event) -> Event:
    """An effect's outcome without what says how it ran (a script file's hash, how
    long it took, a script's diagnostics on stderr): what a re-run is judged by."""
    if isinstance(event, ScriptFinished):
        return msgspec.structs.replace(event, script_hash="", duration_ms=0.0, stderr="")
    if isinstance(event, RetrievalDone):
        return msgspec.structs.replace(event, duration_ms=0.0)
    return event


def _key(event: Event) -> tuple[str, str, int, str]:
    return (
        type(event).__name__,
        getattr(event, "node_id", None) or "",
        getattr(event, "visit", getattr(event, "step", 0)) or 0,
        event.branch,
    )


def _comparable(events: list[Event]) -> list[Event]:
    """The events a replay reproduces, concurrent branches in branch order: a
    super-step's (between ``StepStarted`` and its merge) and a map's items (a run of
    effects with branches). They are recorded in the order they finished, which a
    replay need not repeat; within a branch the order is kept."""
    out: list[Event] = []
    group: list[Event] = []
    in_step = False
    after_timeout = False

    def close() -> None:
        # What the branches a join cancelled had begun (a child run's start, say)
        # depends on when they were stopped: a replay does not perform them.
        cancelled = {b for e in group if isinstance(e, BranchesJoined) for b in e.cancelled}
        kept = [e for e in group if not (isinstance(e, EFFECT_TYPES) and e.branch in cancelled)]
        out.extend(sorted(kept, key=lambda e: e.branch))
        group.clear()

    for event in events[1:]:
        if isinstance(event, IGNORED):
            after_timeout = isinstance(event, TimeoutFired)
            continue
        if after_timeout and isinstance(event, RunFailed):
            after_timeout = False
            continue  # the policy's failure: the replay stopped before it
        after_timeout = False
        if isinstance(event, StepStarted):
            close()
            out.append(event)
            in_step = True
            continue
        if in_step:
            if isinstance(event, BranchesMerged | RunFailed):
                close()
                in_step = False
                out.append(event)
            else:
                group.append(event)
            continue
        if isinstance(event, EFFECT_TYPES) and event.branch:
            group.append(event)
            continue
        close()
        out.append(event)
    close()
    return out


def _compare(
    recorded: list[Event], produced: list[Event], reran: set[RequestKey]
) -> tuple[list[Divergence], int, bool]:
    """Every difference between the recorded and the reproduced events, in log order;
    how many events were compared; whether the two part ways (a different event, not
    a different value: comparing further is meaningless then)."""
    found: list[Divergence] = []
    i = 0
    for i, (rec, now) in enumerate(zip(recorded, produced, strict=False)):
        if _key(rec) != _key(now):
            found.append(_decision_divergence(rec, now))
            return found, i, True
        if _same(rec, now):
            continue
        if (
            isinstance(rec, NodeCompleted | NodeFailed)
            and isinstance(now, NodeCompleted | NodeFailed)
            and not rec.error_kind
            and now.error_kind
        ):
            # A log recorded before failures had kinds: the kind is not a decision it
            # could have made differently.
            now = msgspec.structs.replace(now, error_kind="")
            if _same(rec, now):
                continue
        if isinstance(rec, ScriptFinished | RetrievalDone) and slot_of(rec) in reran:
            # Re-run: judged by what it did, not by how long it took or its hash.
            rec, now = (_behaviour(e) for e in (rec, now))
            if _same(rec, now):
                continue
        found.append(_decision_divergence(rec, now))
    return found, min(len(recorded), len(produced)), False


def replay_events(
    events: list[Event],
    loaded: LoadedGraph | None = None,
    *,
    check_files: bool = False,
    sources: dict[str, str] | None = None,
    rerun_retrieval: bool = False,
    on_effect: Callable[[decider.Perform, list[Event]], None] | None = None,
) -> ReplayResult:
    """Replay recorded events against ``loaded`` (default: the run's own graph).

    The run loop (the same :class:`Driver` as a live run) drives a scratch log from
    the recorded ``RunStarted``; every effect is served from the recording; then
    what it produced is compared with what was recorded. Every divergence is kept.

    ``check_files``: the agent's script files must be the ones that ran; a changed
    script is re-run offline on its recorded input and judged by its output.
    ``sources``: the recorded script texts (an export header's), for readable diffs.
    ``rerun_retrieval``: retrieval runs again against today's knowledge base.
    ``on_effect``: called with each request and the recorded events serving it.
    """
    from graphrun.eventstore.fold import fold
    from graphrun.runtime.engine.driver import Driver, RunOptions, graph_of

    # A run moved onto new graphs replays against the one it ends on.
    events = upgraded_view(events)
    first = events[0] if events else None
    if not isinstance(first, RunStarted):
        raise ReplayError("a recorded run starts with RunStarted; this log does not")
    recorded_graph: Graph | None = None
    if loaded is None:
        start = first
        agent_dir = Path(first.agent_dir) if first.agent_dir else None
    else:
        if loaded.source != first.graph_source:
            recorded_graph = graph_of(fold(events[:1])).graph
        agent_dir = loaded.agent_dir
        start = msgspec.structs.replace(
            first,
            graph_source=loaded.source,
            graph_path=str(loaded.path),
            agent_dir=str(agent_dir) if agent_dir is not None else first.agent_dir,
        )

    def check(step: decider.Perform, outcome: list[Event], state: RunState) -> Any:
        problem = check_request(step, outcome, agent_dir, False, sources)
        if problem is None and check_files:
            problem = skill_divergence(outcome)
        if problem is None and recorded_graph is not None:
            try:
                old = decider.decide(recorded_graph, state)
            except GraphrunError:
                old = None
            was = None
            if isinstance(old, decider.Perform):
                was = old
            elif isinstance(old, decider.PerformMany):
                was = next((t for t in old.tasks if t.branch == step.branch), None)
            if was is not None and was.node_id == step.node_id:
                problem = task_divergence(was.task, step.task, outcome[0].seq)
        return problem

    def rerun(step: decider.Perform, outcome: list[Event]) -> str | None:
        if check_files:
            why = script_changed(step, outcome, agent_dir)
            if why is not None:
                return why
        if rerun_retrieval:
            return rag_rerun(step, outcome)
        return None

    source = RecordedSource(events, check=check, rerun=rerun, on_effect=on_effect)
    log = ScratchLog(start)
    recorded_config = first.config if isinstance(first.config, dict) else {}
    variables = recorded_config.get("variables")
    config = None
    if rerun_retrieval:  # the knowledge bases' settings (rag_* in config.yaml)
        from graphrun.runtime.graph.config import config_dir

        config = config_dir(None)
    options = RunOptions(
        effect_source=source,
        agents_dir=None,
        config_dir=config,
        variables=dict(variables) if isinstance(variables, dict) else None,
    )
    driver = Driver(log, first.run_id, options)  # type: ignore[arg-type]
    stopped: str | None = None
    try:
        driver.drive()
    except LogEnds as end:
        stopped = end.why
    produced = log.events
    result = ReplayResult(first.run_id, len(events))
    recorded = _comparable(events)
    made = _comparable(produced)
    reran = {slot_of_step(step) for step, _ in source.reran}
    found, matched, structural = _compare(recorded, made, reran)
    if check_files:
        found = [*_script_problems(source, agent_dir, sources, found), *found]
    found = [*source.problems, *found]
    result.decisions = sum(1 for e in made[:matched] if not isinstance(e, EFFECT_TYPES))
    result.effects = source.served
    final = fold(events)
    result.final = final
    if not structural and len(recorded) > len(made):
        rest = recorded[len(made)]
        why = f" ({stopped})" if stopped and stopped != "the end of the log" else ""
        found.append(
            Divergence(
                rest.seq,
                getattr(rest, "node_id", None),
                "extra",
                f"the replay ended{why} but the log continues with "
                f"{len(recorded) - len(made)} more event(s), from {type(rest).__name__}",
                recorded=_payload(rest),
            )
        )
    elif not structural and len(made) > len(recorded):
        extra = made[len(recorded)]
        if final.terminal:
            found.append(
                Divergence(
                    None,
                    getattr(extra, "node_id", None),
                    "missing",
                    f"the log ends ({final.status}) but the replay goes on with "
                    f"{type(extra).__name__}",
                    now=_payload(extra),
                )
            )
        else:
            result.notes.append(f"the log ends before {type(extra).__name__}")
            # The log stops inside what the loop decides in one go (one step).
            result.ends_mid_step = (len(recorded) + 1) not in source.boundaries
    found.sort(key=lambda d: (d.seq is None, d.seq or 0))
    for i, d in enumerate(found):
        if d.event_type is None and d.seq is not None and 1 <= d.seq <= len(events):
            found[i] = replace(d, event_type=type(events[d.seq - 1]).__name__)
    result.divergences = found
    result.divergence = found[0] if found else None
    if source.reran:
        for step, why in source.reran:
            result.notes.append(f"node '{step.node_id}': {why}; re-run offline")
    if result.ok and not final.terminal:
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


def slot_of_step(step: decider.Perform) -> RequestKey:
    return (step.node_id, step.task.visit, step.branch)


def _script_problems(
    source: RecordedSource,
    agent_dir: Path | None,
    sources: dict[str, str] | None,
    found: list[Divergence],
) -> list[Divergence]:
    """A re-run script whose output changed: the divergence gets its source diff."""
    out: list[Divergence] = []
    for step, _why in source.reran:
        task = step.task
        if not isinstance(task, ScriptTask):
            continue
        mine = [
            d
            for d in found
            if d.node_id == step.node_id and d.event_type in (None, "ScriptFinished")
        ]
        if not mine:
            continue
        old_text = (sources or {}).get(task.script)
        try:
            new_text = (agent_dir / task.script).read_text() if agent_dir else None
        except OSError:
            new_text = None
        both = old_text is not None and new_text is not None  # else no source diff
        out.append(
            Divergence(
                mine[0].seq,
                step.node_id,
                "request",
                f"script file {task.script} changed since the run was recorded, and its "
                "output changed with it",
                field="script",
                recorded=old_text if both else None,
                now=new_text if both else None,
            )
        )
    return out
