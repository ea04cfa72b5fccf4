"""``graphrun logs``: a run's LLM conversations as Markdown, and their usage."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from graphrun.eventstore.events import ChildRunStarted, LlmCalled, RunStarted
from graphrun.runtime.engine.usage import Usage, call_usage, format_usage
from graphrun.runtime.observe.report import request_messages


def llm_log(
    store: Any, run_id: str, prices: Mapping[str, tuple[float, float]]
) -> tuple[list[dict[str, Any]], Usage]:
    """Every LLM call of a run and its child runs (in start order), and their total usage.

    Each entry has the run, graph, node, visit, purpose, turn, attempt, model, time,
    the messages new in this turn (``[(role, text)]``), the response text, tool
    calls, error and usage.
    """
    entries: list[dict[str, Any]] = []
    total = Usage()

    def walk(rid: str) -> None:
        events = store.read(rid)
        graph = events[0].graph_name if events and isinstance(events[0], RunStarted) else ""
        seen: dict[tuple[str, int, str], int] = {}
        for e in events:
            if isinstance(e, LlmCalled):
                u = call_usage(e, prices)
                total.add(u)
                messages = request_messages(e.request)
                key = (e.node_id, e.visit, e.purpose)
                new = messages[seen.get(key, 0) :] if e.attempt == 1 else messages
                seen[key] = len(messages)
                entries.append(
                    {
                        "run_id": rid,
                        "graph": graph,
                        "node_id": e.node_id,
                        "visit": e.visit,
                        "purpose": e.purpose,
                        "iteration": e.iteration,
                        "attempt": e.attempt,
                        "model": e.model,
                        "ts": e.ts,
                        "latency_ms": e.latency_ms,
                        "messages": new,
                        "response": e.text,
                        "tool_calls": e.tool_calls,
                        "error": e.error,
                        "usage": u.as_dict(),
                    }
                )
            elif isinstance(e, ChildRunStarted) and store.has_run(e.child_run_id):
                walk(e.child_run_id)

    walk(run_id)
    return entries, total


def _fence(text: str) -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}\n{text}\n{ticks}"


def log_markdown(
    run_id: str, entries: list[dict[str, Any]], usage: Usage, *, usage_only: bool = False
) -> str:
    """The Markdown text of :func:`llm_log`'s result."""
    lines = [f"# Run {run_id}", ""]
    if not usage_only:
        if not entries:
            lines += ["No LLM calls.", ""]
        for e in entries:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e["ts"]))
            turn = f" · turn {e['iteration']}" if e["iteration"] > 1 else ""
            attempt = f" · attempt {e['attempt']}" if e["attempt"] > 1 else ""
            purpose = f" · {e['purpose']}" if e["purpose"] != "main" else ""
            u = e["usage"]
            lines.append(f"## {e['graph']} › {e['node_id']} #{e['visit']}{purpose}{turn}{attempt}")
            lines.append("")
            lines.append(
                f"*{e['model']} · {when} UTC · {e['latency_ms']:.0f} ms · "
                f"{u['total_tokens']} tokens ({u['input_tokens']} in, {u['output_tokens']} out)"
                + (f" · run {e['run_id']}" if e["run_id"] != run_id else "")
                + "*"
            )
            lines.append("")
            for role, text in e["messages"]:
                lines += [f"### {role}", "", text.strip(), ""]
            if e["error"]:
                lines += ["### error", "", str(e["error"]), ""]
            if e["response"]:
                lines += ["### response", "", str(e["response"]).strip(), ""]
            for call in e["tool_calls"]:
                lines += [
                    f"### tool call: {call.get('name')}",
                    "",
                    _fence(str(call.get("arguments"))),
                    "",
                ]
    lines += ["## Usage", "", format_usage(usage), ""]
    return "\n".join(lines)


__all__ = ["llm_log", "log_markdown"]
