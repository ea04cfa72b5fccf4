"""Loki's client configuration: every type loads, {{NAME}} keys, Gemini and Azure
OpenAI over their OpenAI-compatible endpoints, and keys kept out of the log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from graphrun.actors.llm.config import LlmConfigError, load_llm_config
from graphrun.actors.secrets import child_env, redact_url
from graphrun.eventstore import redaction
from graphrun.eventstore.events import LlmCalled, ToolCalled


@pytest.fixture(autouse=True)
def _forget_secrets() -> Iterator[None]:
    redaction.clear()
    yield
    redaction.clear()


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "config.yaml").write_text(text, encoding="utf-8")
    return tmp_path


CLIENTS = """\
model: gem:gemini-2.5-flash
clients:
  - type: gemini
    name: gem
    api_key: '{{GEMINI_KEY}}'
  - type: azure-openai
    name: az
    api_base: https://res.openai.azure.com/
    api_key: '{{AZURE_KEY}}'
  - type: vertexai
    name: vx
  - type: openai-compatible
    name: nokey
    api_base: '{{NOKEY_BASE}}'
"""


def test_every_client_type_loads_and_placeholders_resolve(tmp_path: Path) -> None:
    config_dir = write(tmp_path, CLIENTS)
    (config_dir / ".env").write_text("AZURE_KEY=azure-secret-987654\n")
    config = load_llm_config(config_dir, env={"GEMINI_KEY": "gem-secret-123456"})
    assert config.default_model == "gem:gemini-2.5-flash"
    gem = config.resolve("gem:gemini-2.5-flash")
    assert (gem.provider, gem.base_url, gem.api_key) == (
        "openai",
        "https://generativelanguage.googleapis.com/v1beta/openai",
        "gem-secret-123456",
    )
    az = config.resolve("az:my-deployment")
    assert (az.base_url, az.api_key, az.model) == (
        "https://res.openai.azure.com/openai/v1",
        "azure-secret-987654",  # from the config dir's .env
        "my-deployment",
    )
    with pytest.raises(LlmConfigError) as caught:
        config.resolve("nokey:m")
    assert "client 'nokey' uses {{NOKEY_BASE}}, which is not set" in str(caught.value)
    with pytest.raises(LlmConfigError) as caught:
        config.resolve("vx:gemini")
    assert "client 'vx' has type 'vertexai', which graphrun cannot call" in str(caught.value)
    # Both keys are now secrets: never recorded.
    assert set(redaction.secrets()) >= {"gem-secret-123456", "azure-secret-987654"}


def test_events_are_redacted_in_every_field() -> None:
    redaction.register("sk-abcdef123456")
    event = LlmCalled(
        node_id="n",
        visit=1,
        model="openai:gpt",
        url="http://u:sk-abcdef123456@h/v1",
        request={"messages": [{"content": "key sk-abcdef123456"}]},
        status=200,
        response={"echo": ["sk-abcdef123456"]},
        text="the key is sk-abcdef123456",
    )
    red = redaction.redact_event(event)
    assert "sk-abcdef123456" not in repr(red)
    assert red.text == "the key is ***" and red.response == {"echo": ["***"]}
    untouched = ToolCalled(node_id="n", visit=1, name="t", arguments="{}", result="fine")
    assert redaction.redact_event(untouched) is untouched  # nothing secret: the same object


def test_url_userinfo_and_child_environment() -> None:
    assert redact_url("http://me:pw-secret@host:8/v1") == "http://me:***@host:8/v1"
    assert redact_url("http://host/v1") == "http://host/v1"
    env = child_env(
        ["NEEDED_API_KEY"],
        base={"PATH": "/bin", "OPENAI_API_KEY": "sk-1234567", "NEEDED_API_KEY": "n-1234567"},
    )
    assert env == {"PATH": "/bin", "NEEDED_API_KEY": "n-1234567"}
    assert "sk-1234567" in redaction.secrets()
