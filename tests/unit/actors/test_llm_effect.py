"""The llm node's effect: retries, the tool loop, structured output, replay, cancellation."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

from graphrun.actors.base import CancelToken, ListContext
from graphrun.actors.llm.call import LlmTask, perform_llm
from graphrun.actors.llm.client import ClientFactory, LlmReplayMissError
from graphrun.actors.llm.config import load_llm_config
from graphrun.actors.llm.providers.base import RetryPolicy, ToolResult, ToolSpec
from graphrun.eventstore.events import LlmCalled, LlmResult, ToolCalled
from tests.support.fake_llm import FakeLlm, RecordedRequest, http_error, text, tool_calls

KEY = "sk-live-abcdef0123456789"
FAST = RetryPolicy(base_delay=0.01, max_delay=0.02, retry_after_cap=0.05)
MODELS = ["openai:gpt-test", "anthropic:claude-test"]

SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"type": "string"},
        "priority": {"type": "string", "enum": ["low", "medium", "high"]},
    },
    "required": ["action", "priority"],
}


class PythonToolbox:
    """Real tools: Python callables run with the model's JSON arguments."""

    def __init__(self, **functions: Callable[..., Any]) -> None:
        self.functions = functions
        self.specs = [
            ToolSpec(
                name=name,
                description=function.__doc__ or name,
                parameters={"type": "object", "properties": {}},
                source="tools.py",
            )
            for name, function in functions.items()
        ]
        self.ran: list[tuple[str, dict[str, Any]]] = []

    def call(self, name: str, arguments: str, *, cancel: CancelToken) -> ToolResult:
        start = time.perf_counter()
        function = self.functions.get(name)
        if function is None:
            return ToolResult(f"unknown tool '{name}'", True, 0.0, "")
        kwargs = json.loads(arguments or "{}")
        self.ran.append((name, kwargs))
        try:
            output, is_error = str(function(**kwargs)), False
        except Exception as exc:
            output, is_error = f"{type(exc).__name__}: {exc}", True
        return ToolResult(output, is_error, (time.perf_counter() - start) * 1000.0, "tools.py")


@pytest.fixture
def factory(fake_llm: FakeLlm) -> Iterator[ClientFactory]:
    env = {
        "OPENAI_BASE_URL": fake_llm.url_openai,
        "OPENAI_API_KEY": KEY,
        "ANTHROPIC_BASE_URL": fake_llm.url_anthropic,
        "ANTHROPIC_API_KEY": KEY,
    }
    with ClientFactory(load_llm_config(None, env=env), retry=FAST) as made:
        yield made


def run(
    factory: ClientFactory,
    ctx: ListContext | None = None,
    toolbox: PythonToolbox | None = None,
    **fields: Any,
) -> tuple[LlmResult, ListContext]:
    ctx = ctx or ListContext(node_id="ask", visit=2)
    fields.setdefault("model", "openai:gpt-test")
    fields.setdefault("prompt", "Say hi")
    task = LlmTask(node_id="ask", **fields)
    return perform_llm(task, ctx, client_factory=factory, toolbox=toolbox), ctx


def of_type(ctx: ListContext, kind: type) -> list[Any]:
    return [event for event in ctx.events if isinstance(event, kind)]


# --- one call ---------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_a_plain_call_records_the_call_then_the_result(fake_llm, factory, model: str) -> None:
    fake_llm.script(text("Hi there"))
    result, ctx = run(factory, model=model, system="Be kind.", temperature=0.0)
    assert result == LlmResult(node_id="ask", visit=2, text="Hi there", calls=1)
    called, last = ctx.events
    assert last == result
    assert isinstance(called, LlmCalled)
    assert (called.purpose, called.iteration, called.attempt, called.status) == ("main", 1, 1, 200)
    assert called.model == model
    assert called.request == fake_llm.requests[0].body
    assert called.request["temperature"] == 0.0
    assert called.text == "Hi there"
    assert called.usage
    assert called.error is None


def test_429_with_retry_after_is_retried_then_succeeds(fake_llm, factory) -> None:
    fake_llm.script(http_error(429, "Rate limit reached", retry_after=0), text("ok"))
    result, ctx = run(factory, max_attempts=3)
    assert (result.text, result.error, result.calls) == ("ok", None, 2)
    first, second = of_type(ctx, LlmCalled)
    assert (first.attempt, first.status, first.transient) == (1, 429, True)
    assert first.error.startswith("HTTP 429 from ")
    assert (second.attempt, second.status, second.error) == (2, 200, None)


def test_a_long_retry_after_is_capped(fake_llm, factory) -> None:
    fake_llm.script(http_error(429, retry_after=3600), text("ok"))
    started = time.monotonic()
    result, _ = run(factory, max_attempts=2)
    assert result.text == "ok"
    assert time.monotonic() - started < 1.0  # capped at FAST.retry_after_cap, not an hour


def test_400_is_not_retried(fake_llm, factory) -> None:
    fake_llm.script(http_error(400, "Unsupported value: 'temperature'"), text("never sent"))
    result, ctx = run(factory, max_attempts=3, temperature=0.5)
    assert result.error == (
        f"HTTP 400 from {fake_llm.url_openai}/chat/completions: Unsupported value: "
        "'temperature' (invalid_request_error)"
    )
    assert result.calls == 1
    assert len(fake_llm.requests) == 1
    assert of_type(ctx, LlmCalled)[0].transient is False


def test_500_is_retried_up_to_max_attempts(fake_llm, factory) -> None:
    fake_llm.script(*(http_error(500, "boom") for _ in range(3)), text("too late"))
    result, ctx = run(factory, model="anthropic:claude-test", max_attempts=3)
    assert result.error == (
        f"HTTP 500 from {fake_llm.url_anthropic}/v1/messages: boom (api_error) "
        "(gave up after 3 attempts)"
    )
    assert [event.attempt for event in of_type(ctx, LlmCalled)] == [1, 2, 3]
    assert fake_llm.pending == 1


def test_default_max_attempts_is_one(fake_llm, factory) -> None:
    fake_llm.script(http_error(503), text("never sent"))
    result, _ = run(factory)
    assert result.calls == 1
    assert result.error is not None and "HTTP 503" in result.error


# --- timeout and cancellation -----------------------------------------------------


def test_node_timeout_aborts_the_in_flight_request(fake_llm, factory) -> None:
    fake_llm.script(text("too slow", delay=10))
    started = time.monotonic()
    result, ctx = run(factory, timeout=0.3, max_attempts=3)
    assert time.monotonic() - started < 2.0
    assert result.error == "timed out after 0.3s (node timeout)"
    (called,) = of_type(ctx, LlmCalled)
    assert called.error == "timed out after 0.3s (node timeout)"
    assert called.transient is False  # not retried past the node's deadline


def test_cancellation_aborts_the_in_flight_request(fake_llm, factory) -> None:
    fake_llm.script(text("too slow", delay=10))
    ctx = ListContext(node_id="ask")
    timer = threading.Timer(0.2, ctx.cancel.cancel, args=("run timeout",))
    timer.start()
    started = time.monotonic()
    try:
        result, _ = run(factory, ctx=ctx)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 2.0
    assert result.error == "cancelled (run timeout)"


def test_an_already_cancelled_node_makes_no_call(fake_llm, factory) -> None:
    ctx = ListContext(node_id="ask")
    ctx.cancel.cancel("parent finished")
    result, _ = run(factory, ctx=ctx)
    assert (result.error, result.calls) == ("cancelled (parent finished)", 0)
    assert fake_llm.requests == []


# --- the tool loop ----------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_tool_calls_run_and_their_results_go_back(fake_llm, factory, model: str) -> None:
    toolbox = PythonToolbox(add=lambda a, b: a + b)
    fake_llm.script(tool_calls(("add", {"a": 2, "b": 3})), text("The sum is 5."))
    result, ctx = run(factory, toolbox=toolbox, model=model, prompt="2+3?")
    assert (result.text, result.calls) == ("The sum is 5.", 2)
    assert toolbox.ran == [("add", {"a": 2, "b": 3})]
    (tool,) = of_type(ctx, ToolCalled)
    assert (tool.name, tool.arguments, tool.result, tool.is_error) == (
        "add",
        '{"a": 2, "b": 3}',
        "5",
        False,
    )
    assert (tool.iteration, tool.source, tool.visit) == (1, "tools.py", 2)
    assert [type(event).__name__ for event in ctx.events] == [
        "LlmCalled",
        "ToolCalled",
        "LlmCalled",
        "LlmResult",
    ]
    first, second = fake_llm.requests
    offered = first.body["tools"][0]
    assert (offered.get("function") or offered)["name"] == "add"
    assert tool_result_of(second) == (tool.call_id, "5")


def tool_result_of(request: RecordedRequest) -> tuple[str, str]:
    last = request.body["messages"][-1]
    if request.protocol == "openai":
        assert last["role"] == "tool"
        return last["tool_call_id"], last["content"]
    (block,) = last["content"]
    assert (last["role"], block["type"]) == ("user", "tool_result")
    return block["tool_use_id"], block["content"]


def test_a_failing_tool_is_reported_to_the_model(fake_llm, factory) -> None:
    toolbox = PythonToolbox(div=lambda a, b: a / b)
    fake_llm.script(tool_calls(("div", {"a": 1, "b": 0})), text("Cannot divide."))
    result, ctx = run(factory, toolbox=toolbox)
    assert result.text == "Cannot divide."
    (tool,) = of_type(ctx, ToolCalled)
    assert (tool.result, tool.is_error) == ("ZeroDivisionError: division by zero", True)


def test_the_tool_loop_stops_at_max_iterations(fake_llm, factory) -> None:
    toolbox = PythonToolbox(count=lambda n: n + 1)
    counter = iter(range(100))
    fake_llm.default = lambda request: tool_calls(("count", {"n": next(counter)}))
    result, ctx = run(factory, toolbox=toolbox, max_iterations=3)
    assert result.error == "tool-call loop hit max_iterations=3"
    assert result.calls == 3
    assert [event.iteration for event in of_type(ctx, LlmCalled)] == [1, 2, 3]
    assert len(toolbox.ran) == 2  # the last turn's calls are not run: no turn is left


def test_an_identical_repeated_call_is_not_run_again(fake_llm, factory) -> None:
    toolbox = PythonToolbox(lookup=lambda key: f"value of {key}")
    fake_llm.script(
        tool_calls(("lookup", {"key": "a"})),
        tool_calls(("lookup", {"key": "a"})),
        text("done"),
    )
    result, ctx = run(factory, toolbox=toolbox)
    assert result.text == "done"
    assert toolbox.ran == [("lookup", {"key": "a"})]
    first, repeated = of_type(ctx, ToolCalled)
    assert (first.is_error, repeated.is_error, repeated.iteration) == (False, True, 2)
    assert repeated.result.startswith("Not run: this call to lookup is identical to one")
    assert tool_result_of(fake_llm.requests[2]) == (repeated.call_id, repeated.result)


def test_tool_calls_without_a_toolbox_get_an_error_result(fake_llm, factory) -> None:
    fake_llm.script(tool_calls(("rm", {"path": "/"})), text("ok"))
    result, ctx = run(factory)
    assert result.text == "ok"
    assert of_type(ctx, ToolCalled)[0].result == (
        "No tools are available to this node; 'rm' cannot be called."
    )
    assert "tools" not in fake_llm.requests[0].body


# --- structured output ------------------------------------------------------------


def test_valid_json_takes_the_fast_path(fake_llm, factory) -> None:
    fake_llm.script(text('```json\n{"action": "buy", "priority": "high"}\n```'))
    result, _ = run(factory, output_schema=SCHEMA)
    assert (result.extracted, result.extract_error, result.calls) == (None, None, 1)


@pytest.mark.parametrize("model", MODELS)
def test_malformed_json_goes_to_the_extractor(fake_llm, factory, model: str) -> None:
    fake_llm.script(
        text("Action: buy milk, priority high"),
        text('{"action": "buy milk", "priority": "high"}'),
    )
    result, ctx = run(factory, model=model, output_schema=SCHEMA, temperature=0.7)
    assert result.text == "Action: buy milk, priority high"
    assert result.extracted == '{"action": "buy milk", "priority": "high"}'
    assert result.extract_error is None
    main, extract = of_type(ctx, LlmCalled)
    assert (main.purpose, extract.purpose) == ("main", "extract")
    body = fake_llm.requests[1].body
    system = body["system"] if "system" in body else body["messages"][0]["content"]
    assert system.startswith("You convert text into structured data.")
    assert '"enum": [\n        "low",' in system
    assert "temperature" not in body
    assert body["messages"][-1] == {"role": "user", "content": "Action: buy milk, priority high"}


def test_a_bad_extraction_gets_one_repair(fake_llm, factory) -> None:
    fake_llm.script(
        text("buy milk, urgent"),
        text('{"action": "buy milk", "priority": "urgent"}'),
        text('{"action": "buy milk", "priority": "high"}'),
    )
    result, ctx = run(factory, output_schema=SCHEMA)
    assert result.extracted == '{"action": "buy milk", "priority": "high"}'
    assert [event.purpose for event in of_type(ctx, LlmCalled)] == ["main", "extract", "repair"]
    repair = fake_llm.requests[2].body["messages"]
    assert repair[-2] == {
        "role": "assistant",
        "content": '{"action": "buy milk", "priority": "urgent"}',
    }
    assert repair[-1]["content"].startswith(
        "That reply cannot be used: output does not match the schema at $.priority: 'urgent' is "
        "not one of ['low', 'medium', 'high']."
    )


def test_extractor_failure_is_reported_as_extract_error(fake_llm, factory) -> None:
    fake_llm.script(text("no idea"), text("still prose"), text("```json\n{broken\n```"))
    result, _ = run(factory, output_schema=SCHEMA)
    assert result.error is None
    assert result.text == "no idea"
    assert result.extracted is None
    assert result.extract_error == (
        "structured output extraction failed: output is not valid JSON: Expecting property "
        "name enclosed in double quotes: line 1 column 2 (char 1)"
    )
    assert result.calls == 3


# --- keys, replay, unreachable servers --------------------------------------------


def test_the_key_never_appears_in_any_recorded_event(fake_llm, factory) -> None:
    toolbox = PythonToolbox(echo=lambda s: s)
    fake_llm.script(
        http_error(401, f"Incorrect API key provided: {KEY}"),
        tool_calls(("echo", {"s": "x"})),
        text("not json"),
        text('{"action": "a", "priority": "low"}'),
    )
    _, ctx_failed = run(factory, max_attempts=2)
    _, ctx_ok = run(factory, toolbox=toolbox, output_schema=SCHEMA)
    assert all(r.headers.get("authorization") == f"Bearer {KEY}" for r in fake_llm.requests)
    recorded = msgspec.json.encode([*ctx_failed.events, *ctx_ok.events])
    assert KEY.encode() not in recorded
    assert b"Incorrect API key provided: ***" in recorded


def test_replay_reproduces_a_run_with_the_server_stopped(fake_llm: FakeLlm) -> None:
    toolbox = PythonToolbox(add=lambda a, b: a + b)
    env = {"ANTHROPIC_BASE_URL": fake_llm.url_anthropic, "ANTHROPIC_API_KEY": KEY}
    fake_llm.script(
        http_error(529, "Overloaded"),
        tool_calls(("add", {"a": 1, "b": 2})),
        text("three"),
        text('{"action": "add", "priority": "low"}'),
    )
    fields: dict[str, Any] = {
        "model": "anthropic:claude-test",
        "max_attempts": 2,
        "output_schema": SCHEMA,
    }
    with ClientFactory(load_llm_config(None, env=env), retry=FAST) as live:
        recorded, live_ctx = run(live, toolbox=toolbox, **fields)
    fake_llm.stop()
    calls = of_type(live_ctx, LlmCalled)
    assert [(c.purpose, c.status) for c in calls] == [
        ("main", 529),
        ("main", 200),
        ("main", 200),
        ("extract", 200),
    ]

    with ClientFactory.replay(calls, load_llm_config(None, env={})) as replay:
        replayed, replay_ctx = run(replay, toolbox=PythonToolbox(add=lambda a, b: a + b), **fields)
        assert replayed == recorded
        assert [c.request for c in of_type(replay_ctx, LlmCalled)] == [c.request for c in calls]

        with pytest.raises(LlmReplayMissError) as caught:
            run(replay, toolbox=toolbox, **{**fields, "prompt": "Say hello"})
    assert str(caught.value).startswith(
        "no recorded LLM response matches POST /v1/messages (model 'claude-test'): "
        "the closest recorded request differs in messages"
    )


def test_an_unreachable_server_fails_the_node_with_a_clear_message() -> None:
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": KEY}
    with ClientFactory(load_llm_config(None, env=env), retry=FAST) as factory:
        result, ctx = run(factory, max_attempts=2)
    assert result.error is not None
    assert result.error.startswith(
        "could not reach http://127.0.0.1:9/v1/chat/completions: [Errno 111] Connection refused"
    )
    assert result.error.endswith("(gave up after 2 attempts)")
    assert [c.status for c in of_type(ctx, LlmCalled)] == [None, None]


def test_an_unknown_provider_fails_the_node_without_a_call(factory) -> None:
    result, ctx = run(factory, model="mistral:large")
    assert result.error == (
        "unknown LLM provider or client 'mistral'; known: anthropic, claude, openai (use "
        "provider:model with one of those, or add a client named 'mistral' under clients: in "
        "config.yaml)"
    )
    assert ctx.events == [result]
