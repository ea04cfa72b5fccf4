"""The Anthropic Messages wire protocol.

Requests go to ``<base_url>/v1/messages`` where the base URL does *not* include
``/v1``, as in the official SDK, with the ``anthropic-version`` header. The
system prompt is the top-level ``system`` field; ``max_tokens`` is required
(default :data:`DEFAULT_MAX_TOKENS`); tools are ``{name, description,
input_schema}``. The model's tool calls are ``tool_use`` content blocks whose
``input`` is an object; their results go back in the next *user* message as
``tool_result`` blocks. Roles must alternate, so consecutive messages of one
role are merged into one message of content blocks.

Sampling follows :data:`MODEL_RULES`, as the OpenAI provider's table does: the
Claude models from Opus 4.1 and the 4.5 generation on refuse ``temperature`` and
``top_p`` together, so when a graph sets both they get ``temperature`` only;
older models get both.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from graphrun.actors.llm.providers.base import ChatRequest, Provider, ToolCall

#: The API version this module speaks.
ANTHROPIC_VERSION = "2023-06-01"
#: ``max_tokens`` when neither the node nor the model config sets one.
DEFAULT_MAX_TOKENS = 4096


#: ``(model pattern, temperature and top_p are exclusive)``; the first full match wins.
MODEL_RULES: tuple[tuple[re.Pattern[str], bool], ...] = (
    (re.compile(r"claude-(opus|sonnet|haiku)-4-(1|[5-9])(-.*)?"), True),
    (re.compile(r"claude-(opus|sonnet|haiku)-([5-9]|\d\d)(-.*)?"), True),
)


@functools.lru_cache(maxsize=256)
def exclusive_sampling(model: str) -> bool:
    """Whether ``model`` refuses ``temperature`` and ``top_p`` in one request."""
    return any(exclusive for pattern, exclusive in MODEL_RULES if pattern.fullmatch(model))


class AnthropicProvider(Provider):
    """Anthropic Messages."""

    name = "anthropic"
    base_url_env = "ANTHROPIC_BASE_URL"

    def endpoint(self, base_url: str) -> str:
        return f"{base_url.rstrip('/')}/v1/messages"

    def headers(self, api_key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        return headers

    def build_body(
        self, request: ChatRequest, model: str, max_tokens: int | None
    ) -> dict[str, Any]:
        limit = request.max_tokens if request.max_tokens is not None else max_tokens
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": limit if limit is not None else DEFAULT_MAX_TOKENS,
        }
        if request.system:
            body["system"] = request.system
        body["messages"] = _wire_messages(request.messages)
        if request.tools:
            body["tools"] = [
                {
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": tool.parameters,
                }
                for tool in request.tools
            ]
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.top_p is not None and not (
            request.temperature is not None and exclusive_sampling(model)
        ):
            body["top_p"] = request.top_p
        return body

    def parse_body(self, body: dict[str, Any]) -> tuple[str, list[ToolCall], dict[str, Any]]:
        texts: list[str] = []
        calls: list[ToolCall] = []
        for index, block in enumerate(body.get("content") or []):
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                texts.append(str(block.get("text", "")))
            elif block.get("type") == "tool_use":
                calls.append(
                    ToolCall(
                        id=str(block.get("id") or f"toolu_{index}"),
                        name=str(block.get("name", "")),
                        arguments=json.dumps(block.get("input") or {}, ensure_ascii=False),
                    )
                )
        usage = body.get("usage")
        return "".join(texts), calls, usage if isinstance(usage, dict) else {}

    def error_details(self, body: dict[str, Any]) -> tuple[str, str]:
        error = body.get("error")
        if isinstance(error, dict):
            return str(error.get("message") or ""), str(error.get("type") or "")
        return "", ""

    def body_error(self, body: dict[str, Any]) -> tuple[str, str] | None:
        # An error can arrive as a 200 body of type "error" (e.g. overloaded_error).
        if body.get("type") == "error":
            message, kind = self.error_details(body)
            return message or "error response", kind
        return None


def _wire_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    wire: list[dict[str, Any]] = []
    for message in messages:
        role, blocks = _blocks(message)
        if wire and wire[-1]["role"] == role:
            previous = wire[-1]
            if isinstance(previous["content"], str):
                previous["content"] = [{"type": "text", "text": previous["content"]}]
            previous["content"].extend(blocks)
        elif len(blocks) == 1 and blocks[0]["type"] == "text":
            wire.append({"role": role, "content": blocks[0]["text"]})
        else:
            wire.append({"role": role, "content": blocks})
    return wire


def _blocks(message: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    role = message["role"]
    if role == "tool":
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": message["tool_call_id"],
            "content": message.get("content", ""),
        }
        if message.get("is_error"):
            block["is_error"] = True
        return "user", [block]
    blocks: list[dict[str, Any]] = []
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": call["name"],
                "input": _arguments_object(call["arguments"]),
            }
        )
    return role, blocks


def _arguments_object(arguments: str) -> dict[str, Any]:
    # tool_use.input must be an object; arguments we could not parse are kept whole.
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_value": value}
