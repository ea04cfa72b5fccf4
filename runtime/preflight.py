"""Checks made before a run starts, so bad configuration fails before anything runs."""

from __future__ import annotations

from typing import Any

from graphrun.runtime.graph import LlmNode
from graphrun.runtime.loader import LoadedGraph


def preflight(loaded: LoadedGraph, options: Any) -> None:
    """Raise a GraphrunError if the graph cannot run with this configuration.

    LLM nodes need a known provider or client and its API key (named, never
    echoed) unless responses are served from a recording.
    """
    graph = loaded.graph
    models = {
        node.model or graph.model or ""
        for node in graph.nodes.values()
        if isinstance(node, LlmNode)
    }
    if not models or options.llm_replay is not None:
        return
    from graphrun.actors.llmconfig import load_llm_config

    config = load_llm_config(options.config_dir)
    for model in sorted(models):
        config.check_ready(model)
