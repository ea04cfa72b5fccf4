"""Wire protocols, model resolution and the HTTP seam, against a real local server."""

from __future__ import annotations

import email.utils
import socket
import time
from pathlib import Path

import pytest

from graphrun.actors.llm.client import ClientFactory, LlmReplayMissError
from graphrun.actors.llm.config import LlmConfig, LlmConfigError, load_llm_config
from graphrun.actors.llm.providers import get_provider
from graphrun.actors.llm.providers.base import (
    ChatRequest,
    ChatResponse,
    LlmCallError,
    ToolSpec,
    is_transient_message,
    parse_retry_after,
)
from graphrun.eventstore.events import LlmCalled
from tests.support.fake_llm import FakeLlm, http_error, raw, text, tool_calls

KEY = "sk-test-0123456789-secret"

WEATHER = ToolSpec(
    name="weather",
    description="Current weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
    source="tools.py",
)

# A conversation after one tool round trip, in the neutral shape.
CONVERSATION = [
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [{"id": "c1", "name": "weather", "arguments": '{"city": "Oslo"}'}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "-3C", "is_error": False},
]


def config_for(fake: FakeLlm, **extra: str) -> LlmConfig:
    env = {
        "OPENAI_BASE_URL": fake.url_openai,
        "OPENAI_API_KEY": KEY,
        "ANTHROPIC_BASE_URL": fake.url_anthropic,
        "ANTHROPIC_API_KEY": KEY,
        **extra,
    }
    return load_llm_config(None, env=env)


def call(factory: ClientFactory, request: ChatRequest) -> ChatResponse:
    resolved = factory.resolve(request.model)
    provider = get_provider(resolved.provider)
    return provider.call(factory.client(resolved.base_url), resolved, request)


@pytest.fixture
def factory(fake_llm: FakeLlm):
    with ClientFactory(config_for(fake_llm)) as made:
        yield made


# --- exact request bodies ---------------------------------------------------------


def test_openai_body_headers_and_tool_round_trip(fake_llm: FakeLlm, factory) -> None:
    fake_llm.script(text("It is -3C."))
    response = call(
        factory,
        ChatRequest(
            model="openai:gpt-test",
            system="Be brief.",
            messages=CONVERSATION,
            tools=[WEATHER],
            temperature=0.2,
        ),
    )
    (request,) = fake_llm.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.body == {
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "-3C"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "description": "Current weather for a city.",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            }
        ],
        "temperature": 0.2,
    }
    assert response.text == "It is -3C."
    assert response.request_body == request.body
    assert response.url == f"{fake_llm.url_openai}/chat/completions"
    assert response.usage["total_tokens"] == response.usage["prompt_tokens"] + 3


def test_anthropic_body_headers_and_tool_round_trip(fake_llm: FakeLlm, factory) -> None:
    fake_llm.script(text("It is -3C."))
    call(
        factory,
        ChatRequest(
            model="anthropic:claude-test",
            system="Be brief.",
            messages=[
                *CONVERSATION,
                {"role": "tool", "tool_call_id": "c2", "content": "no", "is_error": True},
            ],
            tools=[WEATHER],
            top_p=0.9,
        ),
    )
    (request,) = fake_llm.requests
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == KEY
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    assert request.body == {
        "model": "claude-test",
        "max_tokens": 4096,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Oslo"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "-3C"},
                    {"type": "tool_result", "tool_use_id": "c2", "content": "no", "is_error": True},
                ],
            },
        ],
        "tools": [
            {
                "name": "weather",
                "description": "Current weather for a city.",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
            }
        ],
        "top_p": 0.9,
    }


def test_sampling_parameters_and_system_are_left_out_when_unset(fake_llm, factory) -> None:
    call(factory, ChatRequest(model="openai:o-test", messages=[{"role": "user", "content": "x"}]))
    call(factory, ChatRequest(model="anthropic:c", messages=[{"role": "user", "content": "x"}]))
    assert [r.body for r in fake_llm.requests] == [
        {"model": "o-test", "messages": [{"role": "user", "content": "x"}]},
        {"model": "c", "max_tokens": 4096, "messages": [{"role": "user", "content": "x"}]},
    ]


@pytest.mark.parametrize(
    ("model", "key"),
    [
        ("gpt-4o-mini", "max_tokens"),
        ("llama3.1:8b", "max_tokens"),
        ("o3-mini", "max_completion_tokens"),
        ("o1-2024-12-17", "max_completion_tokens"),
        ("gpt-5", "max_completion_tokens"),
    ],
)
def test_openai_output_limit_is_max_completion_tokens_for_reasoning_models(
    fake_llm, factory, model: str, key: str
) -> None:
    fake_llm.script(text("ok"))
    call(
        factory,
        ChatRequest(
            model=f"openai:{model}", messages=[{"role": "user", "content": "x"}], max_tokens=64
        ),
    )
    body = fake_llm.requests[-1].body
    assert body[key] == 64
    (other,) = {"max_tokens", "max_completion_tokens"} - {key}
    assert other not in body


@pytest.mark.parametrize("model", ["openai:gpt-test", "anthropic:claude-test"])
def test_tool_calls_are_read_back_in_both_protocols(fake_llm, factory, model: str) -> None:
    fake_llm.script(tool_calls(("weather", {"city": "Oslo"}), ("weather", {"city": "Rome"})))
    response = call(factory, ChatRequest(model=model, messages=CONVERSATION[:1], tools=[WEATHER]))
    assert [(c.name, c.arguments) for c in response.tool_calls] == [
        ("weather", '{"city": "Oslo"}'),
        ("weather", '{"city": "Rome"}'),
    ]
    assert len({c.id for c in response.tool_calls}) == 2


# --- errors -----------------------------------------------------------------------


def error_of(factory: ClientFactory, model: str = "openai:gpt-test") -> LlmCallError:
    with pytest.raises(LlmCallError) as caught:
        call(factory, ChatRequest(model=model, messages=[{"role": "user", "content": "x"}]))
    return caught.value


def test_http_400_is_permanent_and_says_http_400(fake_llm, factory) -> None:
    fake_llm.script(http_error(400, "temperature is not supported with this model"))
    err = error_of(factory)
    assert err.message == (
        f"HTTP 400 from {fake_llm.url_openai}/chat/completions: temperature is not supported "
        "with this model (invalid_request_error)"
    )
    assert (err.status, err.transient, err.retry_after) == (400, False, None)


def test_http_429_is_transient_with_retry_after(fake_llm, factory) -> None:
    fake_llm.script(http_error(429, "Rate limit reached", retry_after=7))
    err = error_of(factory, "anthropic:claude-test")
    assert err.message == (
        f"HTTP 429 from {fake_llm.url_anthropic}/v1/messages: Rate limit reached (rate_limit_error)"
    )
    assert (err.status, err.transient, err.retry_after) == (429, True, 7.0)


def test_exhausted_quota_is_not_transient_even_with_429(fake_llm, factory) -> None:
    fake_llm.script(http_error(429, "You exceeded your quota", error_type="insufficient_quota"))
    err = error_of(factory)
    assert err.status == 429
    assert not err.transient


@pytest.mark.parametrize("status", [408, 409, 500, 502, 503, 529])
def test_server_side_statuses_are_transient(fake_llm, factory, status: int) -> None:
    fake_llm.script(http_error(status))
    err = error_of(factory)
    assert f"HTTP {status}" in err.message
    assert err.transient


@pytest.mark.parametrize("status", [401, 403, 404])
def test_client_side_statuses_are_permanent(fake_llm, factory, status: int) -> None:
    fake_llm.script(http_error(status, "rate limit wording must not matter"))
    assert not error_of(factory).transient


def test_anthropic_overloaded_error_in_a_200_body_is_transient(fake_llm, factory) -> None:
    fake_llm.script(
        raw('{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}')
    )
    err = error_of(factory, "anthropic:claude-test")
    assert err.message == (
        f"HTTP 200 from {fake_llm.url_anthropic}/v1/messages: Overloaded (overloaded_error)"
    )
    assert err.transient


def test_a_body_that_is_not_json_is_reported_with_an_excerpt(fake_llm, factory) -> None:
    fake_llm.script(raw("<html>Bad gateway</html>", status=502, content_type="text/html"))
    err = error_of(factory)
    assert err.message == (
        f"HTTP 502 from {fake_llm.url_openai}/chat/completions: <html>Bad gateway</html>"
    )
    assert err.transient
    assert err.body == {"_raw": "<html>Bad gateway</html>"}


def test_an_empty_reply_produced_no_output_and_is_transient(fake_llm, factory) -> None:
    fake_llm.script(text(""))
    err = error_of(factory)
    assert err.message.endswith("openai:gpt-test produced no output")
    assert err.transient


def test_the_key_is_redacted_from_error_messages_and_bodies(fake_llm, factory) -> None:
    fake_llm.script(http_error(401, f"Incorrect API key provided: {KEY}"))
    err = error_of(factory)
    assert KEY not in err.message
    assert KEY not in str(err.body)
    assert "Incorrect API key provided: ***" in err.message


def test_unreachable_base_url_says_it_could_not_be_reached() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {"OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1"}
    with ClientFactory(load_llm_config(None, env=env)) as factory:
        err = error_of(factory)
    assert err.message.startswith(f"could not reach http://127.0.0.1:{port}/v1/chat/completions: ")
    assert "Connection refused" in err.message
    assert err.message.endswith("(check OPENAI_BASE_URL)")
    assert err.status is None
    assert err.transient  # the spec lists "Connection refused" as transient


def test_a_slow_server_times_out_within_the_call_budget(fake_llm, factory) -> None:
    fake_llm.script(text("late", delay=5))
    started = time.monotonic()
    with pytest.raises(LlmCallError) as caught:
        call(
            factory,
            ChatRequest(
                model="openai:gpt-test", messages=[{"role": "user", "content": "x"}], timeout=0.3
            ),
        )
    assert time.monotonic() - started < 2
    assert caught.value.message.startswith(
        f"request to {fake_llm.url_openai}/chat/completions timed out after 0.3s"
    )
    assert caught.value.transient


def test_proxies_from_the_environment_still_apply(fake_llm, monkeypatch) -> None:
    # The fake server plays the proxy: a proxied plain-HTTP request reaches it in
    # absolute form, naming a host that does not exist.
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", fake_llm.url)
    config = load_llm_config(None, env={"OPENAI_BASE_URL": "http://llm.invalid/v1"})
    fake_llm.script(text("via the proxy"))
    with ClientFactory(config) as made:
        response = call(
            made, ChatRequest(model="openai:m", messages=[{"role": "user", "content": "hi"}])
        )
    assert response.text == "via the proxy"
    assert fake_llm.requests[-1].path == "http://llm.invalid/v1/chat/completions"


def test_parse_retry_after_reads_seconds_dates_and_milliseconds() -> None:
    now = 1_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after({"Retry-After": "12"}, now) == 12.0
    assert parse_retry_after({"retry-after": date}, now) == 30.0
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}, now) == 1.5
    assert parse_retry_after({"retry-after": "soon"}, now) is None
    assert parse_retry_after({}, now) is None


@pytest.mark.parametrize(
    ("message", "transient"),
    [
        ("request timed out", True),
        ("Rate limit exceeded", True),
        ("HTTP 429", True),
        ("[Errno 104] Connection reset by peer", True),
        ("[Errno 111] Connection refused", True),
        ("model produced no output", True),
        ("invalid model name", False),
    ],
)
def test_transient_messages_are_the_spec_list(message: str, transient: bool) -> None:
    assert is_transient_message(message) is transient


# --- model resolution -------------------------------------------------------------


def test_builtin_clients_use_the_sdk_defaults_and_variables() -> None:
    config = load_llm_config(None, env={"OPENAI_API_KEY": "k1", "ANTHROPIC_API_KEY": "k2"})
    openai = config.resolve("openai:gpt-4o-mini")
    assert (openai.provider, openai.model, openai.base_url, openai.api_key) == (
        "openai",
        "gpt-4o-mini",
        "https://api.openai.com/v1",
        "k1",
    )
    claude = config.resolve("claude:claude-3-5-haiku-latest")
    assert (claude.provider, claude.base_url, claude.api_key, claude.client_name) == (
        "anthropic",
        "https://api.anthropic.com",
        "k2",
        "anthropic",
    )
    assert config.resolve("openai:llama3:8b").model == "llama3:8b"
    assert KEY not in repr(config.resolve("openai:x"))


def test_unknown_provider_names_the_known_ones() -> None:
    config = load_llm_config(None, env={})
    with pytest.raises(LlmConfigError) as caught:
        config.resolve("gemini:pro")
    assert str(caught.value) == (
        "unknown LLM provider or client 'gemini'; known: anthropic, claude, openai "
        "(use provider:model with one of those, or add a client named 'gemini' under "
        "clients: in config.yaml)"
    )
    with pytest.raises(LlmConfigError, match="'gpt-4o' is not a provider:model id"):
        config.resolve("gpt-4o")


def test_check_ready_names_the_missing_variable_never_a_key() -> None:
    config = load_llm_config(None, env={"ANTHROPIC_API_KEY": KEY})
    config.check_ready("anthropic:claude")
    with pytest.raises(LlmConfigError) as caught:
        config.check_ready("openai:gpt-4o")
    assert str(caught.value) == (
        "model 'openai:gpt-4o' needs an API key but OPENAI_API_KEY is not set "
        "(export OPENAI_API_KEY=... or set api_key for client 'openai' in config.yaml)"
    )


def test_openai_base_url_without_a_key_sends_no_authorization(fake_llm) -> None:
    config = load_llm_config(None, env={"OPENAI_BASE_URL": fake_llm.url_openai})
    config.check_ready("openai:local")  # a local server needs no key
    with ClientFactory(config) as factory:
        call(
            factory, ChatRequest(model="openai:local", messages=[{"role": "user", "content": "x"}])
        )
    assert "authorization" not in fake_llm.requests[0].headers


def test_config_file_clients_models_and_aliases(tmp_path: Path, fake_llm) -> None:
    (tmp_path / "config.yaml").write_text(
        f"""
model: ollama:llama
clients:
  - type: openai-compatible
    name: ollama
    api_base: {fake_llm.url_openai}
    models:
      - name: llama
        real_name: llama3.1:8b
        max_input_tokens: 128000
  - type: claude
    api_base: {fake_llm.url_anthropic}/v1
    models:
      - name: haiku
        real_name: claude-3-5-haiku-latest
        max_output_tokens: 1000
""",
        encoding="utf-8",
    )
    config = load_llm_config(tmp_path, env={"OLLAMA_API_KEY": "ollama-key", "CLAUDE_API_KEY": KEY})
    llama = config.resolve("ollama:llama")
    assert (llama.provider, llama.model, llama.base_url, llama.api_key) == (
        "openai",
        "llama3.1:8b",
        fake_llm.url_openai,
        "ollama-key",
    )
    for model_id in ("claude:haiku", "anthropic:haiku"):
        haiku = config.resolve(model_id)
        assert (haiku.provider, haiku.model, haiku.base_url, haiku.client_name) == (
            "anthropic",
            "claude-3-5-haiku-latest",
            fake_llm.url_anthropic,
            "claude",
        )
        assert haiku.api_key == KEY
    config.check_ready("anthropic:haiku")
    with ClientFactory(config) as factory:
        call(
            factory,
            ChatRequest(model="anthropic:haiku", messages=[{"role": "user", "content": "x"}]),
        )
    assert fake_llm.requests[0].body["max_tokens"] == 1000
    assert fake_llm.requests[0].body["model"] == "claude-3-5-haiku-latest"


def test_openai_compatible_client_needs_no_key_but_needs_api_base(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("clients:\n  - type: openai-compatible\n    name: local\n", encoding="utf-8")
    config = load_llm_config(tmp_path, env={})  # loads: an error only when used
    with pytest.raises(LlmConfigError) as caught:
        config.resolve("local:any")
    assert str(caught.value) == (
        f"{path} ($.clients[0]): client 'local' (openai-compatible) needs api_base "
        "(e.g. api_base: http://localhost:11434/v1)"
    )
    path.write_text(
        "clients:\n  - type: openai-compatible\n    name: local\n    api_base: http://h/v1\n",
        encoding="utf-8",
    )
    config = load_llm_config(tmp_path, env={})
    config.check_ready("local:any")
    assert config.resolve("local:any").api_key is None


def test_malformed_config_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("clients:\n  - type: [unclosed\n", encoding="utf-8")
    with pytest.raises(LlmConfigError) as caught:
        load_llm_config(tmp_path, env={})
    assert str(caught.value).startswith(f"{path}:3: config file is not valid YAML: ")
    path.write_text(
        "clients:\n  - type: bedrock\n    name: b\n  - type: openai\n", encoding="utf-8"
    )
    config = load_llm_config(tmp_path, env={"OPENAI_API_KEY": "sk-x"})
    config.check_ready("openai:gpt-4o")  # an unusable client blocks only its own models
    with pytest.raises(LlmConfigError) as caught:
        config.check_ready("b:claude")
    assert str(caught.value) == (
        f"{path} ($.clients[0]): client 'b' has type 'bedrock', which graphrun cannot call "
        "(graphrun speaks the OpenAI and Anthropic wire protocols: use a client of type "
        "openai, openai-compatible, gemini, azure-openai or claude (an OpenAI-compatible "
        "proxy such as LiteLLM reaches the others))"
    )


# --- replay -----------------------------------------------------------------------


def recorded_call(response: ChatResponse, model: str) -> LlmCalled:
    return LlmCalled(
        node_id="n",
        visit=1,
        model=model,
        url=response.url,
        request=response.request_body,
        status=response.status,
        response=response.body,
        text=response.text,
    )


def test_replay_serves_recorded_calls_in_order_with_the_server_stopped() -> None:
    request = ChatRequest(model="openai:gpt-test", messages=[{"role": "user", "content": "q"}])
    with FakeLlm() as fake, ClientFactory(config_for(fake)) as live:
        fake.script(http_error(503, "busy"), text("first"), text("second"))
        with pytest.raises(LlmCallError) as caught:
            call(live, request)
        failed = caught.value
        recorded = [
            LlmCalled(
                node_id="n",
                visit=1,
                model="openai:gpt-test",
                url=failed.url,
                request=failed.request_body,
                status=failed.status,
                response=failed.body,
                error=failed.message,
            )
        ]
        recorded += [recorded_call(call(live, request), "openai:gpt-test") for _ in range(2)]
    # The server is gone and this machine has no key or base URL for the client.
    with ClientFactory.replay(recorded, load_llm_config(None, env={})) as replay:
        with pytest.raises(LlmCallError) as caught:
            call(replay, request)
        assert caught.value.message == (
            "HTTP 503 from https://api.openai.com/v1/chat/completions: busy (server_error)"
        )
        assert caught.value.transient
        assert call(replay, request).text == "first"
        assert call(replay, request).text == "second"
        with pytest.raises(LlmReplayMissError) as missed:
            call(replay, request)
    assert str(missed.value) == (
        "no recorded LLM response matches POST /v1/chat/completions (model 'gpt-test'): "
        "the recording has this request only 3 time(s)"
    )


def test_replay_miss_names_what_differs() -> None:
    with FakeLlm() as fake, ClientFactory(config_for(fake)) as live:
        asked = ChatRequest(model="openai:gpt-test", messages=[{"role": "user", "content": "q"}])
        recorded = [recorded_call(call(live, asked), "openai:gpt-test")]
    changed = ChatRequest(
        model="openai:gpt-test", messages=[{"role": "user", "content": "q2"}], temperature=0.5
    )
    replay = ClientFactory.replay(recorded, load_llm_config(None, env={}))
    with replay, pytest.raises(LlmReplayMissError) as caught:
        call(replay, changed)
    assert str(caught.value) == (
        "no recorded LLM response matches POST /v1/chat/completions (model 'gpt-test'): "
        "the closest recorded request differs in messages, temperature (the prompt, model or "
        "settings changed since the run was recorded)"
    )


def test_replay_resolves_a_client_only_the_recording_knows() -> None:
    event = LlmCalled(
        node_id="n",
        visit=1,
        model="ollama:llama3.1:8b",
        url="http://localhost:11434/v1/chat/completions",
        request={"model": "llama3.1:8b", "messages": [{"role": "user", "content": "q"}]},
        status=200,
        response={"choices": [{"message": {"role": "assistant", "content": "a"}}]},
    )
    with ClientFactory.replay([event], load_llm_config(None, env={})) as replay:
        resolved = replay.resolve("ollama:llama")
        assert (resolved.provider, resolved.base_url) == ("openai", "http://localhost:11434/v1")
        request = ChatRequest(model="ollama:llama", messages=[{"role": "user", "content": "q"}])
        assert call(replay, request).text == "a"
    with pytest.raises(LlmConfigError):
        ClientFactory(load_llm_config(None, env={})).resolve("ollama:llama")
