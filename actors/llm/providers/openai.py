"""The OpenAI Chat Completions wire protocol (also every OpenAI-compatible server).

Requests go to ``<base_url>/chat/completions`` where the base URL includes
``/v1``, as in the official SDK. The system prompt is the first message; tools
are ``{"type": "function", "function": {...}}``; the model's tool calls come back
in ``choices[0].message.tool_calls`` and their results go back as ``role: tool``
messages. What a model accepts comes from one table, :data:`MODEL_RULES`:
OpenAI's reasoning models (``o1``, ``o3``, ``o4-mini``, ``gpt-5`` and their dated or
sized variants) get no ``temperature``/``top_p`` (they answer HTTP 400), take the
output limit as ``max_completion_tokens``, and get ``reasoning_effort`` when they
take it; every other model gets the limit as ``max_tokens`` (what every
OpenAI-compatible server accepts).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from graphrun.actors.llm.providers.base import ChatRequest, Provider, ToolCall


class OpenAIProvider(Provider):
    """OpenAI Chat Completions."""

    name = "openai"
    base_url_env = "OPENAI_BASE_URL"

    def endpoint(self, base_url: str) -> str:
        return f"{base_url.rstrip('/')}/chat/completions"

    def headers(self, api_key: str | None) -> dict[str, str]:
        # No key, no header: local servers (Ollama, llama.cpp) need none.
        return {"authorization": f"Bearer {api_key}"} if api_key else {}

    def build_body(
        self, request: ChatRequest, model: str, max_tokens: int | None
    ) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        messages.extend(_wire_message(message) for message in request.messages)
        body: dict[str, Any] = {"model": model, "messages": messages}
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                }
                for tool in request.tools
            ]
        rule = model_rule(model)
        if rule.sampling:
            if request.temperature is not None:
                body["temperature"] = request.temperature
            if request.top_p is not None:
                body["top_p"] = request.top_p
        if request.reasoning_effort in rule.efforts:  # else the model does not take it
            body["reasoning_effort"] = request.reasoning_effort
        limit = request.max_tokens if request.max_tokens is not None else max_tokens
        if limit is not None:
            body[rule.limit_field] = limit
        return body

    def parse_body(self, body: dict[str, Any]) -> tuple[str, list[ToolCall], dict[str, Any]]:
        choices = body.get("choices") or []
        message = (choices[0].get("message") or {}) if choices else {}
        text = _content_text(message.get("content"))
        calls: list[ToolCall] = []
        for index, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function") or {}
            arguments = function.get("arguments")
            if not isinstance(arguments, str):  # some compatible servers send an object
                arguments = json.dumps(arguments if arguments is not None else {})
            calls.append(
                ToolCall(
                    id=str(call.get("id") or f"call_{index}"),
                    name=str(function.get("name", "")),
                    arguments=arguments,
                )
            )
        usage = body.get("usage")
        return text, calls, usage if isinstance(usage, dict) else {}

    def error_details(self, body: dict[str, Any]) -> tuple[str, str]:
        error = body.get("error")
        if isinstance(error, dict):
            kind = error.get("code") or error.get("type") or ""
            return str(error.get("message") or ""), str(kind)
        if isinstance(error, str):
            return error, ""
        return "", ""

    def body_error(self, body: dict[str, Any]) -> tuple[str, str] | None:
        # Some compatible servers answer 200 with only an error object.
        if "error" in body and not body.get("choices"):
            message, kind = self.error_details(body)
            return message or "error response", kind
        return None


@dataclass(frozen=True)
class ModelRule:
    """What a family of models accepts in a Chat Completions request.

    Attributes:
        pattern: the model names (the provider's own, maybe ``org/``-prefixed).
        sampling: ``temperature`` and ``top_p`` are accepted (reasoning models
            reject them with HTTP 400, so they are left out, never sent).
        limit_field: the name of the output limit.
        efforts: the ``reasoning_effort`` values the model takes (empty: none;
            an effort the model does not take is left out).
    """

    pattern: re.Pattern[str]
    sampling: bool = True
    limit_field: str = "max_tokens"
    efforts: frozenset[str] = frozenset()


def _rule(pattern: str, **kwargs: Any) -> ModelRule:
    return ModelRule(re.compile(rf"(?:.*/)?(?:{pattern})(?:[-.:].*)?", re.IGNORECASE), **kwargs)


_EFFORTS = frozenset({"low", "medium", "high"})
#: First match wins; a model no rule matches is an ordinary chat model.
MODEL_RULES: tuple[ModelRule, ...] = (
    # gpt-5-chat is the non-reasoning chat model of the gpt-5 family.
    _rule("gpt-5-chat", limit_field="max_completion_tokens"),
    _rule(
        "gpt-5",
        sampling=False,
        limit_field="max_completion_tokens",
        efforts=_EFFORTS | {"minimal"},
    ),
    # o1-mini and o1-preview predate reasoning_effort.
    _rule("o1-mini|o1-preview", sampling=False, limit_field="max_completion_tokens"),
    _rule(r"o\d+", sampling=False, limit_field="max_completion_tokens", efforts=_EFFORTS),
)
_DEFAULT_RULE = ModelRule(re.compile(".*"))


@functools.lru_cache(maxsize=256)
def model_rule(model: str) -> ModelRule:
    """The :class:`ModelRule` for ``model`` (see :data:`MODEL_RULES`; found once per
    model, not once per call)."""
    for rule in MODEL_RULES:
        if rule.pattern.fullmatch(model):
            return rule
    return _DEFAULT_RULE


def is_reasoning_model(model: str) -> bool:
    """Whether ``model`` is one of OpenAI's reasoning models (no sampling parameters)."""
    return not model_rule(model).sampling


def _wire_message(message: dict[str, Any]) -> dict[str, Any]:
    role = message["role"]
    if role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message["tool_call_id"],
            "content": message.get("content", ""),
        }
    if role == "assistant":
        wire: dict[str, Any] = {"role": "assistant", "content": message.get("content") or None}
        calls = message.get("tool_calls") or []
        if calls:
            wire["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
                for call in calls
            ]
        return wire
    return {"role": role, "content": message.get("content", "")}


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts, from some compatible servers
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") in ("text", "output_text")
        )
    return ""
