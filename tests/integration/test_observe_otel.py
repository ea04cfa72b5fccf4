"""OpenTelemetry export: one trace tree per run tree, GenAI attributes, real OTLP/HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pytest

from tests.conftest import ROOT, GraphrunCli

pytest.importorskip("opentelemetry.sdk")


def _store(graphrun: GraphrunCli) -> Any:
    from graphrun.eventstore.store import SqliteStore

    return SqliteStore(graphrun.db)


def _spans(graphrun: GraphrunCli, run_id: str) -> list[Any]:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from graphrun.runtime.observe.otel import emit_spans, tracer_provider

    exporter = InMemorySpanExporter()
    provider = tracer_provider(exporter)
    count = emit_spans(_store(graphrun), run_id, provider.get_tracer("test"))
    provider.force_flush()
    spans = list(exporter.get_finished_spans())
    assert len(spans) == count
    return spans


def _events(graphrun: GraphrunCli, run_id: str) -> list[dict[str, Any]]:
    return graphrun("events", run_id, "--json").json_lines()  # type: ignore[return-value]


def test_a_run_with_a_child_agent_is_one_trace_tree(graphrun: GraphrunCli):
    assert graphrun("import", str(ROOT / "replays" / "research-desk.run.jsonl")).code == 0
    rows = graphrun("runs", "--json").json_lines()
    parent = next(r["run_id"] for r in rows if not r["parent_run_id"])  # type: ignore[index]
    child = next(r["run_id"] for r in rows if r["parent_run_id"])  # type: ignore[index]
    spans = _spans(graphrun, parent)
    by_id = {s.context.span_id: s for s in spans}
    assert len({s.context.trace_id for s in spans}) == 1  # one trace
    (root,) = [s for s in spans if s.parent is None]
    assert root.name == "invoke_agent research-desk"
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"

    def parent_of(s: Any) -> Any:
        return by_id[s.parent.span_id]

    # Node spans under the run; chat spans under their node.
    nodes = {s.attributes["graphrun.node.id"]: s for s in spans if s.name.startswith("node ")}
    pe = _events(graphrun, parent)
    ce = _events(graphrun, child)
    entered = [e for e in pe + ce if e["type"] == "NodeEntered"]
    assert len([s for s in spans if s.name.startswith("node ")]) == len(entered)
    for name in ("plan", "research", "write"):
        assert parent_of(nodes[name]) is root
    # The child run: an invoke_agent span under the agent node, its nodes under it.
    (child_span,) = [s for s in spans if s.name == "invoke_agent fact-finder"]
    assert parent_of(child_span) is nodes["research"]
    assert child_span.attributes["graphrun.run.id"] == child
    find = next(s for s in spans if s.attributes.get("graphrun.node.id") == "find")
    assert parent_of(find) is child_span
    # Every LLM call a chat span with the GenAI attributes and the recorded usage.
    calls = [e for e in pe + ce if e["type"] == "LlmCalled"]
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert len(chats) == len(calls)
    assert sum(s.attributes["gen_ai.usage.input_tokens"] for s in chats) == sum(
        c["usage"]["prompt_tokens"] for c in calls
    )
    assert sum(s.attributes["gen_ai.usage.output_tokens"] for s in chats) == sum(
        c["usage"]["completion_tokens"] for c in calls
    )
    for s in chats:
        assert s.attributes["gen_ai.operation.name"] == "chat"
        assert s.attributes["gen_ai.request.model"] == "gpt-4o-mini"
        assert s.attributes["gen_ai.provider.name"] == "openai"
        assert parent_of(s).name.startswith("node ")
    chats_in_find = [s for s in chats if parent_of(s) is find]
    assert len(chats_in_find) == len([c for c in ce if c["type"] == "LlmCalled"])
    # Tool calls of the child's loop.
    tools = [s for s in spans if s.name.startswith("execute_tool ")]
    assert len(tools) == len([e for e in ce if e["type"] == "ToolCalled"]) > 0
    for s in tools:
        assert parent_of(s) is find
        assert s.attributes["gen_ai.tool.name"] == s.name.split(" ", 1)[1]
    # Spans nest in time too.
    for s in spans:
        if s.parent is not None:
            assert parent_of(s).start_time <= s.start_time


class _Collector(BaseHTTPRequestHandler):
    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.bodies.append(self.rfile.read(length))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[HTTPServer]:
    _Collector.bodies = []
    server = HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def test_otel_command_sends_otlp_http(graphrun: GraphrunCli, collector: HTTPServer):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    graphrun("import", str(ROOT / "replays" / "ticket-triage.run.jsonl"))
    run_id = graphrun.last_run()
    url = f"http://127.0.0.1:{collector.server_address[1]}/v1/traces"
    res = graphrun("otel", run_id, "--endpoint", url)
    assert res.code == 0, res.stderr
    (body,) = _Collector.bodies
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    names = [s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    count = int(res.stderr.split()[1])
    assert len(names) == count and "invoke_agent ticket-triage" in names
    assert sum(n.startswith("chat ") for n in names) == 2


def test_otel_console_and_an_unreachable_endpoint(graphrun: GraphrunCli):
    graphrun("import", str(ROOT / "replays" / "handbook-qa.run.jsonl"))
    run_id = graphrun.last_run()
    res = graphrun("otel", run_id, "--console")
    assert res.code == 0, res.stderr
    spans = [json.loads(line) for line in res.stdout.splitlines()]
    assert {s["name"] for s in spans} >= {"invoke_agent handbook-qa", "chat gpt-4o-mini"}
    down = graphrun("otel", run_id, "--endpoint", "http://127.0.0.1:9/v1/traces", timeout=120)
    assert down.code == 2
    assert down.stderr.startswith("error: could not send")
    assert "Traceback" not in down.stderr
