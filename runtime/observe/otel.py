"""A run as OpenTelemetry spans, following the GenAI semantic conventions.

One trace per run tree: a root span for the run (``invoke_agent <graph>``), a
span per node visit under it, and under each node a ``chat <model>`` span per LLM
call and an ``execute_tool <name>`` span per tool call. A child run started by
an agent node is an ``invoke_agent`` span under that node's span (same trace),
so Langfuse, Phoenix or any OTLP collector shows the whole tree. Times are the
recorded ones; nothing is measured again.

Needs the ``otel`` extra (``opentelemetry-sdk``, and the OTLP/HTTP exporter to send).
"""

from __future__ import annotations

import sys
from typing import Any

from graphrun.eventstore.events import (
    ChildRunStarted,
    Event,
    HumanInputReceived,
    LlmCalled,
    NodeCompleted,
    NodeEntered,
    NodeFailed,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    ToolCalled,
)
from graphrun.runtime.engine.usage import call_tokens
from graphrun.runtime.errors import UsageError

_MISSING = (
    "OpenTelemetry export needs the otel extra",
    "pip install -e '<checkout>[otel]' (make demo installs it)",
)


def _ns(ts: float) -> int:
    return int(ts * 1_000_000_000)


def _provider_name(model: str) -> str:
    provider = model.split(":", 1)[0] if ":" in model else ""
    return {"claude": "anthropic"}.get(provider, provider)


def emit_spans(store: Any, run_id: str, tracer: Any) -> int:
    """Start and end the spans of ``run_id``'s tree on ``tracer``; returns how many."""
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    count = 0

    def span(
        name: str,
        parent: Any,
        start: float,
        end: float,
        attrs: dict[str, Any],
        kind: Any = SpanKind.INTERNAL,
        error: str | None = None,
    ) -> Any:
        nonlocal count
        ctx = trace.set_span_in_context(parent) if parent is not None else None
        clean = {k: v for k, v in attrs.items() if v is not None and v != ""}
        s = tracer.start_span(name, context=ctx, kind=kind, attributes=clean, start_time=_ns(start))
        if error:
            s.set_status(Status(StatusCode.ERROR, error))
        count += 1
        return s, end

    def run_span(rid: str, parent: Any, agent: str) -> None:
        events: list[Event] = store.read(rid)
        if not events:
            return
        first = events[0]
        graph = first.graph_name if isinstance(first, RunStarted) else ""
        last = events[-1]
        end_event = next(
            (e for e in reversed(events) if isinstance(e, RunCompleted | RunFailed | RunCancelled)),
            None,
        )
        error = None
        if isinstance(end_event, RunFailed):
            error = end_event.error
        elif isinstance(end_event, RunCancelled):
            error = f"cancelled: {end_event.reason}"
        root, root_end = span(
            f"invoke_agent {agent or graph}",
            parent,
            first.ts,
            last.ts,
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": agent or graph,
                "gen_ai.conversation.id": rid,
                "graphrun.run.id": rid,
                "graphrun.graph.name": graph,
                "graphrun.run.status": type(end_event).__name__ if end_event else "running",
                "graphrun.run.parent_id": getattr(first, "parent_run_id", None),
            },
            error=error,
        )
        nodes: dict[tuple[str, int, str], tuple[Any, float]] = {}
        pending: list[tuple[Any, float]] = []
        for e in events:
            branch = str(getattr(e, "branch", "") or "")
            if isinstance(e, NodeEntered):
                nodes[(e.node_id, e.visit, branch)] = span(
                    f"node {e.node_id}",
                    root,
                    e.ts,
                    last.ts,
                    {
                        "graphrun.node.id": e.node_id,
                        "graphrun.node.type": e.node_type,
                        "graphrun.node.visit": e.visit,
                        "graphrun.branch": branch,
                        "graphrun.run.id": rid,
                    },
                )
                continue
            node_id = getattr(e, "node_id", None)
            key = (node_id or "", getattr(e, "visit", 0), branch)
            owner = nodes.get(key)
            if isinstance(e, NodeCompleted | NodeFailed):
                if owner is not None:
                    s, _ = nodes.pop(key)
                    if isinstance(e, NodeFailed):
                        from opentelemetry.trace import Status, StatusCode

                        s.set_status(Status(StatusCode.ERROR, e.error))
                    elif e.routed_to:
                        s.set_attribute("graphrun.node.routed_to", e.routed_to)
                    s.end(end_time=_ns(e.ts))
                continue
            parent_span = owner[0] if owner is not None else root
            node_start = parent_span.start_time / 1e9 if owner is not None else first.ts
            if isinstance(e, HumanInputReceived):
                from graphrun.runtime.observe.report import identity_label

                # Who answered and how that is known (a signature is checked by
                # `graphrun audit --verify`; the span says what the log records).
                parent_span.set_attribute("graphrun.human.by", e.by)
                parent_span.set_attribute("graphrun.human.identity", identity_label(e))
                parent_span.set_attribute("graphrun.human.channel", e.channel)
            elif isinstance(e, LlmCalled):
                inp, out = call_tokens(e.usage or {})
                request = e.request or {}
                start = max(e.ts - e.latency_ms / 1000, node_start)
                model = e.model.split(":", 1)[-1]
                response_model = (e.response or {}).get("model")
                finish = [
                    str(c.get("finish_reason"))
                    for c in (e.response or {}).get("choices", [])
                    if isinstance(c, dict) and c.get("finish_reason")
                ] or (
                    [str((e.response or {}).get("stop_reason"))]
                    if (e.response or {}).get("stop_reason")
                    else []
                )
                pending.append(
                    span(
                        f"chat {model}",
                        parent_span,
                        start,
                        e.ts,
                        {
                            "gen_ai.operation.name": "chat",
                            "gen_ai.system": _provider_name(e.model),
                            "gen_ai.provider.name": _provider_name(e.model),
                            "gen_ai.request.model": model,
                            "gen_ai.response.model": response_model,
                            "gen_ai.request.temperature": request.get("temperature"),
                            "gen_ai.request.top_p": request.get("top_p"),
                            "gen_ai.request.max_tokens": request.get("max_tokens")
                            or request.get("max_completion_tokens"),
                            "gen_ai.response.id": (e.response or {}).get("id"),
                            "gen_ai.response.finish_reasons": finish or None,
                            "gen_ai.usage.input_tokens": inp,
                            "gen_ai.usage.output_tokens": out,
                            "server.address": e.url or None,
                            "http.response.status_code": e.status,
                            "graphrun.llm.purpose": e.purpose,
                            "graphrun.llm.iteration": e.iteration,
                            "graphrun.llm.attempt": e.attempt,
                        },
                        kind=SpanKind.CLIENT,
                        error=e.error,
                    )
                )
            elif isinstance(e, ToolCalled):
                start = max(e.ts - e.duration_ms / 1000, node_start)
                pending.append(
                    span(
                        f"execute_tool {e.name}",
                        parent_span,
                        start,
                        e.ts,
                        {
                            "gen_ai.operation.name": "execute_tool",
                            "gen_ai.tool.name": e.name,
                            "gen_ai.tool.call.id": e.call_id,
                            "gen_ai.tool.type": "function",
                            "graphrun.tool.source": e.source,
                        },
                        error=e.result if e.is_error else None,
                    )
                )
            elif isinstance(e, ChildRunStarted) and store.has_run(e.child_run_id):
                run_span(e.child_run_id, parent_span, e.agent)
        for s, end in pending:
            s.end(end_time=_ns(end))
        for s, end in nodes.values():  # visits still open (a run in progress)
            s.end(end_time=_ns(end))
        root.end(end_time=_ns(root_end))

    run_span(run_id, None, "")
    return count


def tracer_provider(exporter: Any) -> Any:
    """A TracerProvider sending every span to ``exporter`` as it ends."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    except ImportError:
        raise UsageError(_MISSING[0], hint=_MISSING[1]) from None
    provider = TracerProvider(resource=Resource.create({"service.name": "graphrun"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def export_run(
    store: Any, run_id: str, *, endpoint: str | None = None, console: bool = False
) -> int:
    """Send ``run_id``'s spans to an OTLP/HTTP endpoint, or print them as JSON lines."""
    try:
        from opentelemetry.sdk.trace.export import SpanExportResult
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    except ImportError:
        raise UsageError(_MISSING[0], hint=_MISSING[1]) from None
    memory = InMemorySpanExporter()
    provider = tracer_provider(memory)
    count = emit_spans(store, run_id, provider.get_tracer("graphrun"))
    provider.force_flush()
    spans = memory.get_finished_spans()
    if console:
        for s in spans:
            sys.stdout.write(s.to_json(indent=None) + "\n")
        return count
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise UsageError(_MISSING[0], hint=_MISSING[1]) from None
    import logging

    exporter = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
    # The exporter logs each failed attempt; the one-line error below says it all.
    quiet = logging.NullHandler()
    otel_log = logging.getLogger("opentelemetry")
    otel_log.addHandler(quiet)
    try:
        result = exporter.export(spans)
    finally:
        exporter.shutdown()
        otel_log.removeHandler(quiet)
    if result is not SpanExportResult.SUCCESS:
        where = endpoint or "the endpoint in $OTEL_EXPORTER_OTLP_*ENDPOINT (default localhost:4318)"
        raise UsageError(f"could not send {count} spans to {where}")
    return count


__all__ = ["emit_spans", "export_run", "tracer_provider"]
