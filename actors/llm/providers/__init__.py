"""LLM wire protocols, by name: ``openai`` (Chat Completions) and ``anthropic`` (Messages)."""

from __future__ import annotations

from graphrun.actors.llm.providers.anthropic import AnthropicProvider
from graphrun.actors.llm.providers.base import (
    ChatRequest,
    ChatResponse,
    LlmCallError,
    Provider,
    RetryPolicy,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from graphrun.actors.llm.providers.openai import OpenAIProvider

PROVIDERS: dict[str, Provider] = {
    "openai": OpenAIProvider(),
    "anthropic": AnthropicProvider(),
}


def get_provider(name: str) -> Provider:
    """The wire protocol called ``name`` (``"openai"`` or ``"anthropic"``)."""
    return PROVIDERS[name]


__all__ = [
    "PROVIDERS",
    "AnthropicProvider",
    "ChatRequest",
    "ChatResponse",
    "LlmCallError",
    "OpenAIProvider",
    "Provider",
    "RetryPolicy",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "get_provider",
]
