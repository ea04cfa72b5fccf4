"""Reading runs for people: state at any seq, the path taken, audit, diffs."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from graphrun.eventstore.events import (
    ChildRunFinished,
    ChildRunStarted,
    Event,
    HumanInputReceived,
    HumanInputRequested,
    LlmCalled,
    LlmResult,
    NodeCompleted,
    NodeEntered,
    NodeFailed,
    RetrievalDone,
    RunCompleted,
    RunFailed,
    RunStarted,
    ScriptFinished,
    ToolCalled,
)
from graphrun.eventstore.fold import fold
from graphrun.eventstore.projections import decisions
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.errors import UsageError


def _short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = text.replace("\n", "⏎")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def summarize_event(event: Event) -> str:
    """One line saying what an event records."""
    match event:
        case RunStarted():
            prompt = _short(event.initial_prompt, 40)
            return f"graph={event.graph_name} by={event.started_by} prompt={prompt}"
        case NodeEntered():
            return f"{event.node_type} visit {event.visit}"
        case NodeCompleted():
            keys = ",".join(event.updates) if event.updates else ""
            merged = " +output" if event.merge_effect else ""
            failed = f" FAILED({_short(event.error, 40)})" if event.failed else ""
            return f"-> {event.routed_to}{failed} set[{keys}]{merged}"
        case NodeFailed():
            return _short(event.error)
        case ScriptFinished():
            status = "timeout" if event.timed_out else f"exit {event.exit_code}"
            return f"{event.script} {status} {event.duration_ms:.0f}ms" + (
                f" error={_short(event.error, 50)}" if event.error else ""
            )
        case LlmCalled():
            return f"{event.purpose} model={event.model} status={event.status} " + (
                f"error={_short(event.error, 40)}" if event.error else _short(event.text or "", 40)
            )
        case ToolCalled():
            return f"{event.name}({_short(event.arguments, 30)}) -> {_short(event.result, 30)}"
        case LlmResult():
            return f"error={_short(event.error)}" if event.error else _short(event.text or "")
        case RetrievalDone():
            sources = len((event.result or {}).get("sources", []))
            return f"query={_short(event.query, 40)} sources={sources}"
        case HumanInputRequested():
            return f"{event.kind}: {_short(event.question, 50)}"
        case HumanInputReceived():
            return f"{_short(event.answer, 30)} by {event.by} via {event.channel}"
        case ChildRunStarted():
            return f"{event.agent} -> run {event.child_run_id}"
        case ChildRunFinished():
            return f"run {event.child_run_id} {event.status}"
        case RunCompleted():
            return _short(event.output)
        case RunFailed():
            return _short(event.error)
        case _:
            data = msgspec.to_builtins(event)
            for key in ("run_id", "seq", "ts", "type"):
                data.pop(key, None)
            return _short(data)


def describe_run(store: SqliteStore, run_id: str, at_seq: int | None = None) -> dict[str, Any]:
    """Status, path, state and children of a run after event ``at_seq`` (default: last)."""
    row = store.run(run_id)
    if at_seq is not None and not 1 <= at_seq <= row.last_seq:
        raise UsageError(f"--at {at_seq} is outside run {run_id} (it has events 1..{row.last_seq})")
    events = store.read(run_id, upto=at_seq)
    state = fold(events)
    path: list[dict[str, Any]] = []
    for event in events:
        if isinstance(event, NodeEntered):
            path.append(
                {
                    "seq": event.seq,
                    "node": event.node_id,
                    "type": event.node_type,
                    "visit": event.visit,
                    "routed_to": None,
                }
            )
        elif isinstance(event, NodeCompleted | NodeFailed) and path:
            path[-1]["routed_to"] = getattr(event, "routed_to", None)
            if isinstance(event, NodeFailed) or getattr(event, "failed", False):
                path[-1]["error"] = event.error
    children = []
    for child in store.runs(parent=run_id):
        children.append(describe_run(store, child.run_id))
    first = events[0] if events else None
    return {
        "run_id": run_id,
        "graph": state.graph_name,
        "forked_from": getattr(first, "forked_from", None),
        "forked_at": getattr(first, "forked_at", None),
        "status": state.status,
        "at_seq": state.last_seq,
        "last_seq": row.last_seq,
        "parent_run_id": state.parent_run_id,
        "current_node": state.current,
        "waiting": state.waiting.node_id if state.waiting else None,
        "visits": state.visits,
        "path": path,
        "state": state.state,
        "output": state.output,
        "error": state.error,
        "children": children,
    }


def format_description(info: dict[str, Any], depth: int = 0) -> str:
    pad = "  " * depth
    lines = [
        f"{pad}run {info['run_id']}  graph {info['graph']}  status {info['status']}"
        + (
            f"  (at seq {info['at_seq']} of {info['last_seq']})"
            if info["at_seq"] != info["last_seq"]
            else ""
        ),
    ]
    if info.get("parent_run_id") and depth == 0:
        lines.append(f"{pad}parent: {info['parent_run_id']}")
    steps = []
    for p in info["path"]:
        step = p["node"] + (f"#{p['visit']}" if p["visit"] > 1 else "")
        if p.get("error"):
            step += "(failed)"
        steps.append(step)
    lines.append(f"{pad}path: {' -> '.join(steps) if steps else '(not started)'}")
    if info["waiting"]:
        lines.append(f"{pad}waiting at: {info['waiting']}")
    if info["error"]:
        lines.append(f"{pad}error: {info['error']}")
    if info["output"] is not None:
        lines.append(f"{pad}output: {_short(info['output'], 200)}")
    lines.append(f"{pad}state:")
    text = json.dumps(info["state"], indent=2, ensure_ascii=False, sort_keys=True, default=str)
    lines.extend(f"{pad}  {line}" for line in text.splitlines())
    for child in info["children"]:
        lines.append(f"{pad}child:")
        lines.append(format_description(child, depth + 1))
    return "\n".join(lines)


def audit_tree(store: SqliteStore, run_id: str, *, verify: bool) -> dict[str, Any]:
    """Every human decision of a run and of its descendant runs, oldest first.

    Each decision has the run, seq, time, node, the question and options as
    shown, the answer as given, ``used`` (what the graph took: an empty answer to
    an input node takes its default), who answered (claimed name, OS user, host),
    ``via`` (tty, flag, approve, answer) and ``depth`` (0 for the run itself).

    Args:
        store: The event store.
        run_id: The run to audit.
        verify: Also recompute the hash chain of every run's events; each run's
            check (``ok``, first bad ``seq``, ``reason``) is under ``verify``.

    Returns:
        ``{"run_id", "decisions": [...], "verify": [...]}``.
    """
    from graphrun.runtime.transfer import run_tree

    found: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    depths = {run_id: 0}
    for rid in run_tree(store, run_id):
        depth = depths.get(rid, 0)
        for child in store.runs(parent=rid):
            depths[child.run_id] = depth + 1
        if verify:
            problem = store.verify(rid)
            checks.append(
                {
                    "run_id": rid,
                    "ok": problem is None,
                    "events": store.run(rid).last_seq,
                    "seq": problem.seq if problem else None,
                    "reason": problem.reason if problem else None,
                }
            )
        events = store.read(rid)
        defaults = {
            (e.node_id, e.visit): e.default
            for e in events
            if isinstance(e, HumanInputRequested) and e.kind == "input"
        }
        visits = {e.seq: e.visit for e in events if isinstance(e, HumanInputReceived)}
        for d in decisions(events, depth=depth):
            item = dict(d.__dict__)
            default = defaults.get((d.node_id, visits.get(d.seq, 0)))
            item["default"] = default
            blank = not d.answer.strip() and default is not None
            item["used"] = default if blank else d.answer
            found.append(item)
    found.sort(key=lambda d: (d["ts"], d["run_id"], d["seq"]))
    return {"run_id": run_id, "decisions": found, "verify": checks}


def _decision_payloads(events: list[Event]) -> list[tuple[Event, dict[str, Any]]]:
    from graphrun.eventstore.events import DECISION_TYPES

    out = []
    for e in events:
        if isinstance(e, DECISION_TYPES):
            data = msgspec.to_builtins(e)
            for key in ("run_id", "seq", "ts"):
                data.pop(key, None)
            out.append((e, data))
    return out


def _node_records(events: list[Event]) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (node, visit): prompt/request, outputs and state updates."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for e in events:
        node = getattr(e, "node_id", None)
        visit = getattr(e, "visit", None)
        if node is None or visit is None:
            continue
        rec = out.setdefault((node, visit), {})
        match e:
            case LlmCalled(purpose="main", iteration=1, attempt=1):
                rec["request"] = e.request
            case LlmResult():
                rec["output"] = e.text if e.error is None else f"error: {e.error}"
            case ScriptFinished():
                rec["output"] = e.output if e.error is None else f"error: {e.error}"
            case HumanInputReceived():
                rec["output"] = e.answer
            case HumanInputRequested():
                rec["request"] = e.question
            case RetrievalDone():
                rec["request"] = e.query
                rec["output"] = e.result
            case ChildRunFinished():
                rec["output"] = e.output
            case NodeCompleted():
                rec["updates"] = e.updates
                rec["routed_to"] = e.routed_to
            case _:
                pass
    return out


def diff_runs(a: list[Event], b: list[Event]) -> dict[str, Any]:
    """Where two runs part ways: first differing decision, then per-node differences."""
    da, db = _decision_payloads(a), _decision_payloads(b)
    first = None
    for i in range(max(len(da), len(db))):
        left = da[i] if i < len(da) else None
        right = db[i] if i < len(db) else None
        if left is None or right is None or left[1] != right[1]:
            first = {
                "index": i,
                "a_seq": left[0].seq if left else None,
                "b_seq": right[0].seq if right else None,
                "a": left[1] if left else None,
                "b": right[1] if right else None,
            }
            break
    ra, rb = _node_records(a), _node_records(b)
    nodes = []
    for key in sorted(set(ra) | set(rb), key=lambda k: (k[0], k[1])):
        left, right = ra.get(key), rb.get(key)
        if left == right:
            continue
        fields = sorted(set(left or {}) | set(right or {}))
        changed = {
            f: {"a": (left or {}).get(f), "b": (right or {}).get(f)}
            for f in fields
            if (left or {}).get(f) != (right or {}).get(f)
        }
        nodes.append(
            {
                "node": key[0],
                "visit": key[1],
                "only_in": None if left and right else ("a" if left else "b"),
                "changed": changed,
            }
        )
    sa, sb = fold(a).state, fold(b).state
    state_diff = {
        k: {"a": sa.get(k), "b": sb.get(k)}
        for k in sorted(set(sa) | set(sb))
        if sa.get(k) != sb.get(k)
    }
    return {
        "first_difference": first,
        "nodes": nodes,
        "final_state": state_diff,
        "a": a[0].run_id if a else None,
        "b": b[0].run_id if b else None,
    }


def _wants_diff(value: Any) -> bool:
    """Long or multi-line values (prompts, requests) read better as a unified diff."""
    if isinstance(value, str):
        return "\n" in value or len(value) > 70
    return isinstance(value, dict | list) and len(_short(value, 1000)) > 70


def _unified(a: Any, b: Any) -> list[str]:
    import difflib

    def text(v: Any) -> list[str]:
        if v is None:
            return []
        if isinstance(v, str):
            return v.splitlines()
        return json.dumps(v, indent=2, sort_keys=True, ensure_ascii=False, default=str).splitlines()

    out = list(difflib.unified_diff(text(a), text(b), "a", "b", lineterm="", n=1))
    return out[:40] + (["..."] if len(out) > 40 else [])


def format_diff(report: dict[str, Any]) -> str:
    """The text form of :func:`diff_runs`."""
    first = report["first_difference"]
    if first is None:
        return f"runs {report['a']} and {report['b']} made the same decisions"
    lines = [
        f"runs part ways at decision {first['index'] + 1} "
        f"(seq {first['a_seq']} in {report['a']}, seq {first['b_seq']} in {report['b']}):",
        f"  a: {_short(first['a'], 160)}",
        f"  b: {_short(first['b'], 160)}",
    ]
    for node in report["nodes"]:
        head = f"node '{node['node']}' visit {node['visit']}"
        if node["only_in"]:
            lines.append(f"{head}: only in {node['only_in']}")
            continue
        lines.append(f"{head}:")
        for field, vals in node["changed"].items():
            left, right = vals["a"], vals["b"]
            if _wants_diff(left) or _wants_diff(right):
                lines.append(f"  {field}:")
                lines.extend(f"    {line}" for line in _unified(left, right))
                continue
            lines.append(f"  {field}: a={_short(left, 70)}")
            lines.append(f"  {' ' * len(field)}  b={_short(right, 70)}")
    if report["final_state"]:
        lines.append("final state:")
        for key, vals in report["final_state"].items():
            lines.append(f"  {key}: a={_short(vals['a'], 60)} b={_short(vals['b'], 60)}")
    return "\n".join(lines)
