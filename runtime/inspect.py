"""Reading runs for people: state at any seq, the path taken, audit, diffs."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from graphrun.eventstore.events import (
    BranchesJoined,
    BranchesMerged,
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
    RetrievalDone,
    RunCompleted,
    RunFailed,
    RunStarted,
    ScriptFinished,
    StepStarted,
    ToolCalled,
)
from graphrun.eventstore.fold import RunState, apply, fold
from graphrun.eventstore.projections import decisions, graph_version
from graphrun.eventstore.store import SqliteStore, read_in_pages
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
            if event.failed and event.error_kind:
                failed = f" FAILED {event.error_kind}({_short(event.error, 40)})"
            skipped = f" SKIPPED({_short(event.skipped, 40)})" if event.skipped else ""
            target = f"[{', '.join(event.fan_out)}]" if event.fan_out else event.routed_to
            return f"-> {target}{failed}{skipped} set[{keys}]{merged}"
        case StepStarted():
            return f"super-step {event.step}: {', '.join(event.frontier)}"
        case BranchesJoined():
            named = (
                f"{b}: {_short(event.errors[b], 40)}" if event.errors.get(b) else b
                for b in event.failed
            )
            failed = f" failed [{', '.join(named)}]" if event.failed else ""
            return (
                f"super-step {event.step} joined ({event.reason}): counted "
                f"[{', '.join(event.counted)}]{failed} cancelled [{', '.join(event.cancelled)}]"
            )
        case BranchesMerged():
            merged = ", ".join(
                f"{k}({event.reducers[k]})" if k in event.reducers else k for k in event.merged
            )
            return (
                f"super-step {event.step} merged [{merged}] -> {', '.join(event.targets) or 'END'}"
            )
        case NodeFailed():
            return (f"{event.error_kind}: " if event.error_kind else "") + _short(event.error)
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
        case LlmContinued():
            return f"{event.reason} #{event.count}: {_short(event.prompt, 40)}"
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
        case GraphUpgraded():
            retry = f", {event.retry_node} again" if event.retry_node else ""
            return (
                f"graph {graph_version(event.old_hash)} -> {graph_version(event.new_hash)} "
                f"by {event.by} ({event.was}{retry})"
            )
        case RunCompleted():
            if event.unhandled_failures:
                n = len(event.unhandled_failures)
                return f"{_short(event.output)} (with {n} unhandled failure{'s' * (n != 1)})"
            return _short(event.output)
        case RunFailed():
            return _short(event.error)
        case _:
            data = msgspec.to_builtins(event)
            for key in ("run_id", "seq", "ts", "type"):
                data.pop(key, None)
            return _short(data)


def waiting_dict(request: HumanInputRequested | None) -> dict[str, Any] | None:
    """What a run waits for, as ``run --json``, ``runs --json`` and ``show --json`` show it."""
    if request is None:
        return None
    return {
        "node_id": request.node_id,
        "kind": request.kind,
        "question": request.question,
        "options": list(request.options),
        "default": request.default,
        "approvers": list(request.approvers),
    }


def display_status(store: Any, row: Any) -> str:
    """A run's status as people read it: a ``running`` run no process drives is
    ``queued`` (submitted, no worker has claimed it yet), ``waiting (child)`` when a
    child run waits for a person, else ``interrupted``."""
    if row.status != "running" or store.is_live(row.run_id):
        return str(row.status)
    queued = getattr(store, "queued", None)  # the PostgreSQL store's run queue
    if queued is not None:
        entry = queued(row.run_id)
        if entry is not None and entry["run_id"] == row.run_id and entry["state"] == "queued":
            return "queued"
    waiting_child = any(c.status == "waiting" for c in store.runs(parent=row.run_id, limit=100))
    return "waiting (child)" if waiting_child else "interrupted"


def run_summary(
    store: Any, row: Any, prices: dict[str, tuple[float, float]] | None = None
) -> dict[str, Any]:
    """One run, in the shape every ``--json`` listing of runs shares (``runs``, ``show``).

    Keys: run_id, graph (and graph_name), status (as stored), display_status,
    live, parent_run_id, forked_from, forked_at, started_at, updated_at,
    started_by, last_seq, current_node, waiting_node, waiting (what it waits
    for, or null), output, error, usage (this run's LLM calls), tree_usage
    (with every child run's).
    """
    from graphrun.runtime.engine.usage import run_usage, tree_usage

    events = store.read(row.run_id)
    state = fold(events)
    first = events[0] if events else None
    own, _ = run_usage(events, prices)
    data = row.as_dict()
    data.update(
        {
            "graph": row.graph_name,
            "display_status": display_status(store, row),
            "live": store.is_live(row.run_id),
            "forked_from": getattr(first, "forked_from", None),
            "forked_at": getattr(first, "forked_at", None),
            "waiting": waiting_dict(state.waiting) if state.status == "waiting" else None,
            "unhandled_failures": list(state.unhandled),
            "left_out_branches": list(state.left_out),
            "graph_hash": state.graph_hash,
            "usage": own.as_dict(),
            "tree_usage": tree_usage(store, row.run_id, prices).as_dict(),
        }
    )
    return data


def describe_run(
    store: SqliteStore,
    run_id: str,
    at_seq: int | None = None,
    prices: dict[str, tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """Status, path, state and children of a run after event ``at_seq`` (default: last).

    The keys of :func:`run_summary` (as of ``at_seq``), plus ``at_seq``, ``visits``,
    ``path``, ``state``, ``node_usage`` and ``children`` (each described alike).
    """
    from graphrun.runtime.engine.usage import Usage, UsageTally, load_prices

    if prices is None:
        prices = load_prices(_config_dir())
    row = store.run(run_id)
    if at_seq is not None and not 1 <= at_seq <= row.last_seq:
        raise UsageError(f"--at {at_seq} is outside run {run_id} (it has events 1..{row.last_seq})")
    # One pass over the log, a page at a time: the fold, the path, the usage and
    # the todo list are each built as the events go by (a run of 100,000 events is
    # never held decoded at once). Nothing here looks inside an LLM call's request or
    # response: they are read light (left undecoded).
    state = RunState()
    path: list[dict[str, Any]] = []
    state_step = 0
    first: Event | None = None
    usage = UsageTally(prices)
    todo_calls: list[ToolCalled] = []
    upto = row.last_seq if at_seq is None else at_seq
    for event in read_in_pages(store, run_id, upto=upto, light=True):
        if first is None:
            first = event
        state = apply(state, event)
        if isinstance(event, NodeEntered):
            path.append(
                {
                    "seq": event.seq,
                    "node": event.node_id,
                    "type": event.node_type,
                    "visit": event.visit,
                    "routed_to": None,
                    # The parallel super-step the node ran in (0: a sequential step).
                    "step": state_step if event.branch else 0,
                }
            )
        elif isinstance(event, StepStarted):
            state_step = event.step
        elif isinstance(event, NodeCompleted | NodeFailed) and path:
            entry = next((p for p in reversed(path) if p["node"] == event.node_id), path[-1])
            entry["routed_to"] = getattr(event, "routed_to", None)
            fan_out = getattr(event, "fan_out", None)
            if fan_out:
                entry["fan_out"] = list(fan_out)
            if isinstance(event, NodeFailed) or getattr(event, "failed", False):
                entry["error"] = event.error
        elif isinstance(event, LlmCalled):
            usage.add(event)
        elif isinstance(event, ToolCalled) and event.name.startswith("todo__"):
            todo_calls.append(event)
    children = []
    for child in store.runs(parent=run_id):
        children.append(describe_run(store, child.run_id, prices=prices))
    own, per_node = usage.total, usage.per_node
    tree = Usage()
    tree.add(own)
    for described in children:
        child_usage = described["tree_usage"]
        tree.calls += child_usage["calls"]
        tree.input_tokens += child_usage["input_tokens"]
        tree.output_tokens += child_usage["output_tokens"]
        tree.cost += child_usage["cost_usd"] or 0.0
        tree.unpriced |= set(child_usage["unpriced_models"])
    waiting = state.waiting if state.status == "waiting" else None
    return {
        "run_id": run_id,
        "graph": state.graph_name,
        "graph_name": state.graph_name,
        "forked_from": getattr(first, "forked_from", None),
        "forked_at": getattr(first, "forked_at", None),
        "status": state.status,
        "display_status": display_status(store, row) if at_seq is None else state.status,
        "live": store.is_live(run_id),
        "at_seq": state.last_seq,
        "last_seq": row.last_seq,
        "parent_run_id": state.parent_run_id,
        "started_at": row.started_at,
        "updated_at": row.updated_at,
        "started_by": row.started_by,
        "current_node": state.current,
        "waiting_node": waiting.node_id if waiting else None,
        "waiting": waiting_dict(waiting),
        "visits": state.visits,
        "path": path,
        "state": state.state,
        "output": state.output,
        "error": state.error,
        "unhandled_failures": list(state.unhandled),
        "left_out_branches": list(state.left_out),
        "graph_hash": state.graph_hash,
        "usage": own.as_dict(),
        "tree_usage": tree.as_dict(),
        "node_usage": {node: u.as_dict() for node, u in per_node.items()},
        "children": children,
        "todos": _todos(todo_calls),
    }


def _todos(events: Any) -> dict[str, Any] | None:
    """The run's todo list (Loki's ``todo__*``), when it kept one."""
    from graphrun.runtime.nodes.builtins.todo import todo_list

    todos = todo_list(events)
    return None if todos is None else {"goal": todos.goal, "todos": todos.todos}


def _config_dir() -> Any:
    from graphrun.runtime.graph.config import config_dir

    return config_dir(None)


def format_description(info: dict[str, Any], depth: int = 0) -> str:
    pad = "  " * depth
    lines = [
        f"{pad}run {info['run_id']}  graph {info['graph']}"
        + (f" (version {graph_version(info['graph_hash'])})" if info.get("graph_hash") else "")
        + f"  status {info['status']}"
        + (
            f"  (at seq {info['at_seq']} of {info['last_seq']})"
            if info["at_seq"] != info["last_seq"]
            else ""
        ),
    ]
    if info.get("parent_run_id") and depth == 0:
        lines.append(f"{pad}parent: {info['parent_run_id']}")
    steps: list[str] = []
    group: list[str] = []
    group_step = 0
    for p in info["path"]:
        step = p["node"] + (f"#{p['visit']}" if p["visit"] > 1 else "")
        if p.get("error"):
            step += "(failed)"
        if p.get("step"):
            # The nodes of one parallel super-step, shown together: {a, b}.
            if group and p["step"] != group_step:
                steps.append("{" + ", ".join(group) + "}")
                group = []
            group_step = p["step"]
            group.append(step)
            continue
        if group:
            steps.append("{" + ", ".join(group) + "}")
            group = []
        steps.append(step)
    if group:
        steps.append("{" + ", ".join(group) + "}")
    lines.append(f"{pad}path: {' -> '.join(steps) if steps else '(not started)'}")
    if info.get("waiting_node") and info["status"] == "waiting":
        lines.append(f"{pad}waiting at: {info['waiting_node']}")
    if info["error"]:
        lines.append(f"{pad}error: {info['error']}")
    if info.get("unhandled_failures"):
        from graphrun.eventstore.projections import unhandled_summary

        lines.append(f"{pad}completed with errors: {unhandled_summary(info['unhandled_failures'])}")
    for f in info.get("left_out_branches") or ():
        error = f.get("error") or "its error was not recorded"
        lines.append(
            f"{pad}left out by the join of super-step {f['step']}: branch {f['branch']} "
            f"(node {f['node']}) failed: {_short(error, 200)}"
        )
    if info["output"] is not None:
        lines.append(f"{pad}output: {_short(info['output'], 200)}")
    usage = info.get("usage") or {}
    if usage.get("calls") or (info.get("tree_usage") or {}).get("calls"):
        lines.extend(_usage_lines(info, pad))
    if info.get("todos") is not None:
        from graphrun.runtime.nodes.builtins.todo import TodoList

        lines.append(f"{pad}todos:")
        rendered = TodoList(info["todos"]["goal"], info["todos"]["todos"]).render()
        lines.extend(f"{pad}  {line}" for line in rendered.splitlines())
    lines.append(f"{pad}state:")
    text = json.dumps(info["state"], indent=2, ensure_ascii=False, sort_keys=True, default=str)
    lines.extend(f"{pad}  {line}" for line in text.splitlines())
    for child in info["children"]:
        lines.append(f"{pad}child:")
        lines.append(format_description(child, depth + 1))
    return "\n".join(lines)


def _usage_text(u: dict[str, Any]) -> str:
    from graphrun.runtime.observe.usage import format_cost

    cost = format_cost(u["cost_usd"]) if u.get("cost_usd") is not None else "cost unknown"
    calls = u["calls"]
    return (
        f"{u['total_tokens']} tokens ({u['input_tokens']} in, {u['output_tokens']} out), "
        f"{calls} call{'s' if calls != 1 else ''}, {cost}"
    )


def _usage_lines(info: dict[str, Any], pad: str) -> list[str]:
    lines = [f"{pad}usage: {_usage_text(info['usage'])}"]
    tree = info.get("tree_usage") or {}
    if info.get("children") and tree:
        lines.append(f"{pad}usage with child runs: {_usage_text(tree)}")
    for node, u in (info.get("node_usage") or {}).items():
        lines.append(f"{pad}  {node}: {_usage_text(u)}")
    return lines


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
    from graphrun.runtime.replay.transfer import run_tree

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
        found.extend(_cancellations(events, depth))
    found.sort(key=lambda d: (d["ts"], d["run_id"], d["seq"]))
    return {"run_id": run_id, "decisions": found, "verify": checks}


def _cancellations(events: list[Event], depth: int) -> list[dict[str, Any]]:
    """A run's cancellation as an audit row: who cancelled it, when, why, at which node."""
    from graphrun.eventstore.events import RunCancelled

    out = []
    node = None
    for e in events:
        if isinstance(e, NodeEntered):
            node = e.node_id
        if isinstance(e, RunCancelled):
            by = e.by or "(runtime)"
            out.append(
                {
                    "run_id": e.run_id,
                    "seq": e.seq,
                    "ts": e.ts,
                    "node_id": node or "(run)",
                    "question": "(cancel the run)",
                    "options": [],
                    "answer": f"cancelled: {e.reason}",
                    "by": by,
                    "os_user": by,
                    "host": "",
                    "via": "cancel",
                    "requested_at": None,
                    "depth": depth,
                    "default": None,
                    "used": f"cancelled: {e.reason}",
                    "identity": "claimed",
                    "visit": 0,
                }
            )
    return out


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
        rec_a, rec_b = ra.get(key), rb.get(key)
        if rec_a == rec_b:
            continue
        in_a, in_b = rec_a or {}, rec_b or {}
        fields = sorted(set(in_a) | set(in_b))
        changed = {
            f: {"a": in_a.get(f), "b": in_b.get(f)} for f in fields if in_a.get(f) != in_b.get(f)
        }
        nodes.append(
            {
                "node": key[0],
                "visit": key[1],
                "only_in": None if rec_a and rec_b else ("a" if rec_a else "b"),
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


def _pair(a: Any, b: Any, limit: int) -> tuple[str, str]:
    """Two values shortened so that where they differ stays visible in both."""

    def text(v: Any) -> str:
        t = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)
        return t.replace("\n", "⏎")

    ta, tb = text(a), text(b)
    if len(ta) <= limit and len(tb) <= limit:
        return ta, tb
    at = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), None)
    if at is None:
        at = min(len(ta), len(tb))
    start = max(0, at - limit // 3)

    def window(t: str) -> str:
        head = "…" if start else ""
        body = t[start:]
        room = limit - len(head)
        return head + (body if len(body) <= room else body[: room - 1] + "…")

    return window(ta), window(tb)


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
    ]
    short_a, short_b = _pair(first["a"], first["b"], 160)
    lines += [f"  a: {short_a}", f"  b: {short_b}"]
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
            short_a, short_b = _pair(left, right, 70)
            lines.append(f"  {field}: a={short_a}")
            lines.append(f"  {' ' * len(field)}  b={short_b}")
    if report["final_state"]:
        lines.append("final state:")
        for key, vals in report["final_state"].items():
            short_a, short_b = _pair(vals["a"], vals["b"], 60)
            lines.append(f"  {key}: a={short_a} b={short_b}")
    return "\n".join(lines)
