"""LLM calls: wire protocols, the httpx client factory, structured output, model config."""
