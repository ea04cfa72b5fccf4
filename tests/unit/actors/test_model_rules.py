"""The per-model rule table of the OpenAI wire protocol, and requests as servers get them."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphrun.actors.llm.client import ClientFactory
from graphrun.actors.llm.config import load_llm_config
from graphrun.actors.llm.providers.base import ChatRequest
from graphrun.actors.llm.providers.openai import OpenAIProvider, model_rule
from tests.support.fake_llm import FakeLlm, text


def body(model: str, **kwargs: object) -> dict[str, object]:
    request = ChatRequest(
        model=f"openai:{model}",
        messages=[{"role": "user", "content": "q"}],
        temperature=0.2,
        top_p=0.9,
        max_tokens=100,
        **kwargs,  # type: ignore[arg-type]
    )
    built = OpenAIProvider().build_body(request, model, None)
    built.pop("messages")
    return built


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-4o-mini", {"temperature": 0.2, "top_p": 0.9, "max_tokens": 100}),
        ("o3", {"max_completion_tokens": 100, "reasoning_effort": "high"}),
        ("o4-mini-2025-04-16", {"max_completion_tokens": 100, "reasoning_effort": "high"}),
        ("openai/o1", {"max_completion_tokens": 100, "reasoning_effort": "high"}),
        ("o1-mini", {"max_completion_tokens": 100}),
        ("gpt-5", {"max_completion_tokens": 100, "reasoning_effort": "high"}),
        ("gpt-5-mini", {"max_completion_tokens": 100, "reasoning_effort": "high"}),
        (
            "gpt-5-chat-latest",
            {"temperature": 0.2, "top_p": 0.9, "max_completion_tokens": 100},
        ),
        ("llama3.1:8b", {"temperature": 0.2, "top_p": 0.9, "max_tokens": 100}),
    ],
)
def test_each_model_gets_only_what_it_takes(model: str, expected: dict[str, object]) -> None:
    assert body(model, reasoning_effort="high") == {"model": model, **expected}


def test_an_effort_the_model_does_not_take_is_left_out() -> None:
    assert "reasoning_effort" not in body("o3", reasoning_effort="minimal")
    assert body("gpt-5-nano", reasoning_effort="minimal")["reasoning_effort"] == "minimal"
    assert model_rule("o3").sampling is False and model_rule("gpt-4.1").sampling is True


def test_config_default_effort_and_no_sampling_reach_the_server(tmp_path: Path) -> None:
    with FakeLlm() as fake:
        (tmp_path / "config.yaml").write_text(
            "clients:\n"
            "  - type: openai-compatible\n"
            "    name: proxy\n"
            f"    api_base: {fake.url_openai}\n"
            "    models:\n"
            "      - name: o3\n"
            "        default_reasoning_effort: low\n",
            encoding="utf-8",
        )
        fake.script(text("ok"))
        config = load_llm_config(tmp_path, env={})
        request = ChatRequest(
            model="proxy:o3", messages=[{"role": "user", "content": "q"}], temperature=0.7
        )
        with ClientFactory(config) as factory:
            resolved = factory.resolve("proxy:o3")
            OpenAIProvider().call(factory.client(resolved.base_url), resolved, request)
        sent = fake.requests[0].body
    assert "temperature" not in sent and "top_p" not in sent
    assert sent["reasoning_effort"] == "low"


@pytest.mark.parametrize(
    ("model", "sampling"),
    [
        ("claude-3-5-sonnet-20241022", {"temperature": 0.2, "top_p": 0.9}),
        ("claude-sonnet-4-20250514", {"temperature": 0.2, "top_p": 0.9}),
        ("claude-opus-4-0", {"temperature": 0.2, "top_p": 0.9}),
        ("claude-opus-4-1", {"temperature": 0.2}),
        ("claude-sonnet-4-5-20250929", {"temperature": 0.2}),
        ("claude-haiku-4-5", {"temperature": 0.2}),
        ("claude-sonnet-4-6", {"temperature": 0.2}),
        ("claude-opus-5", {"temperature": 0.2}),
    ],
)
def test_anthropic_models_that_refuse_temperature_with_top_p_get_temperature(
    model: str, sampling: dict[str, float]
) -> None:
    from graphrun.actors.llm.providers.anthropic import AnthropicProvider

    request = ChatRequest(
        model=f"anthropic:{model}",
        messages=[{"role": "user", "content": "q"}],
        temperature=0.2,
        top_p=0.9,
        max_tokens=100,
    )
    built = AnthropicProvider().build_body(request, model, None)
    assert {k: built[k] for k in ("temperature", "top_p") if k in built} == sampling


def test_anthropic_top_p_alone_is_sent() -> None:
    from graphrun.actors.llm.providers.anthropic import AnthropicProvider

    request = ChatRequest(
        model="anthropic:claude-sonnet-4-5",
        messages=[{"role": "user", "content": "q"}],
        top_p=0.9,
        max_tokens=100,
    )
    built = AnthropicProvider().build_body(request, "claude-sonnet-4-5", None)
    assert built["top_p"] == 0.9 and "temperature" not in built
