"""Checks made before a run starts, so bad configuration fails before anything runs."""

from __future__ import annotations

from typing import Any

from graphrun.runtime.graph.loader import LoadedGraph


def preflight(loaded: LoadedGraph, options: Any) -> None:
    """Raise a GraphrunError if the graph cannot run with this configuration.

    LLM nodes need a known provider or client and its API key (the variable is
    named, a key is never echoed) unless responses are served from a recording
    (``--llm-replay``), which needs neither network nor key.
    """
    graph = loaded.graph
    users: dict[str, list[str]] = {}  # model id -> the llm nodes calling it
    for node_id, node in graph.nodes.items():
        if type(node).CALLS_MODEL:
            model = getattr(node, "model", None) or graph.model or ""
            users.setdefault(model, []).append(node_id)
    if not users or options.llm_replay is not None:
        return
    from graphrun.actors.llm.config import LlmConfigError, load_llm_config

    config = load_llm_config(options.config_dir)
    for model in sorted(users):
        named = users[model]
        nodes = ("llm nodes " if len(named) > 1 else "llm node ") + ", ".join(
            f"'{n}'" for n in named
        )
        try:
            config.check_ready(model)
        except LlmConfigError as exc:
            exc.message = f"{nodes}: {exc.message}"
            exc.args = (exc.message,)
            raise


def check_answers(loaded: LoadedGraph, answers: dict[str, list[str]]) -> None:
    """``--answer NODE=VALUE`` must name an input or approval node of the graph.

    Graphs with agent nodes are not checked: an answer may be for a child run's node.
    """
    from graphrun.runtime.errors import UsageError

    nodes = loaded.graph.nodes
    if loaded.graph.can_spawn_agents:
        return
    human = [nid for nid, n in nodes.items() if type(n).HUMAN]
    for node_id in answers:
        if node_id in human:
            continue
        import difflib

        close = difflib.get_close_matches(node_id, human, n=1)
        if node_id in nodes:
            message = (
                f"--answer {node_id}=…: node '{node_id}' ({nodes[node_id].type}) "
                "is not an input or approval node"
            )
        else:
            message = f"--answer {node_id}=…: the graph has no node '{node_id}'"
        hint = (
            f"did you mean '{close[0]}'?"
            if close
            else (
                f"input/approval nodes: {', '.join(human)}" if human else "the graph asks nothing"
            )
        )
        raise UsageError(message, hint=hint)
