"""Model tables (Loki's models.yaml shape): aliases, required limits, body patches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from graphrun.actors.llm.config import load_llm_config
from graphrun.actors.llm.models import merge_patch
from graphrun.actors.llm.providers import get_provider
from graphrun.actors.llm.providers.base import ChatRequest


def sent(config_dir: Path | None, model_id: str, **kwargs: Any) -> dict[str, Any]:
    """The JSON body graphrun would send for ``model_id``."""
    config = load_llm_config(config_dir, env={"ANTHROPIC_API_KEY": "k", "OPENAI_API_KEY": "k"})
    resolved = config.resolve(model_id)
    request = ChatRequest(model=model_id, messages=[{"role": "user", "content": "q"}], **kwargs)
    post = next(get_provider(resolved.provider).exchange(resolved, request))
    body = json.loads(post.content)
    body.pop("messages")
    return body  # type: ignore[no-any-return]


def test_a_thinking_variant_is_sent_as_loki_sends_it() -> None:
    assert sent(None, "claude:claude-sonnet-4-6:thinking", temperature=0.3, top_p=0.9) == {
        "model": "claude-sonnet-4-6",
        "max_tokens": 24000,
        "thinking": {"type": "enabled", "budget_tokens": 16000},
    }


def test_a_plain_claude_model_gets_its_table_limit() -> None:
    assert sent(None, "anthropic:claude-sonnet-4-6") == {
        "model": "claude-sonnet-4-6",
        "max_tokens": 8192,
    }
    # A node's own limit still wins.
    assert sent(None, "anthropic:claude-sonnet-4-6", max_tokens=100)["max_tokens"] == 100


def test_a_config_dirs_models_yaml_and_override(tmp_path: Path) -> None:
    (tmp_path / "models.yaml").write_text(
        "- provider: openai\n"
        "  models:\n"
        "    - name: quick\n"
        "      real_name: gpt-4o-mini\n"
        "      max_output_tokens: 300\n"
        "      require_max_tokens: true\n"
        "      patch:\n"
        "        body:\n"
        "          seed: 7\n"
    )
    (tmp_path / "models-override.yaml").write_text(
        "version: 0.8.3\n"
        "list:\n"
        "  - provider: claude\n"
        "    models:\n"
        "      - name: claude-sonnet-4-6\n"
        "        max_output_tokens: 16000\n"
        "        require_max_tokens: true\n"
    )
    assert sent(tmp_path, "openai:quick", temperature=0.5) == {
        "model": "gpt-4o-mini",
        "max_tokens": 300,
        "seed": 7,
        "temperature": 0.5,
    }
    assert sent(tmp_path, "claude:claude-sonnet-4-6")["max_tokens"] == 16000


def test_merge_patch_is_rfc_7386() -> None:
    assert merge_patch(
        {"a": 1, "b": {"c": 2, "d": 3}, "e": 4}, {"a": None, "b": {"c": None, "x": 1}, "f": [1]}
    ) == {"b": {"d": 3, "x": 1}, "e": 4, "f": [1]}


def test_validate_names_an_unknown_model_variant(tmp_path: Path) -> None:
    from graphrun.runtime.graph.loader import load_text
    from graphrun.runtime.graph.validate import Check, validate

    graph = tmp_path / "graph.yaml"
    text = (
        'name: g\nversion: "1.0"\nstart: a\nmodel: claude:claude-sonet-4-6:thinking\n'
        "nodes:\n  a: {type: llm, prompt: hi, next: done}\n  done: {type: end}\n"
    )
    graph.write_text(text)
    loaded = load_text(text, path=graph, agent_dir=tmp_path)
    found = [
        d
        for d in validate(Check(loaded, config_dir=None, agents_dir=None))
        if d.rule == "unknown-model"
    ]
    assert [(d.severity, d.message, d.hint) for d in found] == [
        (
            "error",
            "llm node 'a': model 'claude:claude-sonet-4-6:thinking' is in no models table nor "
            "client 'anthropic''s models, so its variant would be sent as a literal model id",
            "did you mean 'claude:claude-sonnet-4-6:thinking'?",
        )
    ]
