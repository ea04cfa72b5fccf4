"""Agents: graph agents (graph.yaml) and LLM-loop agents (Loki's config.yaml).

An LLM-loop agent runs as a graph too, so it gets the same event log, replay and
audit: :func:`loop_agent_graph` turns its config.yaml into a two-node graph (one
``llm`` node with the agent's instructions and every tool it has, looping on tool
calls to a final answer, then an ``end``). Loki's instruction variables are
resolved when the agent is loaded — ``{{__now__}}`` included — and the resolved
graph text is what ``RunStarted`` records, so a replay sees exactly what ran.
"""

from __future__ import annotations

import json
import locale
import os
import platform
import sys
import warnings
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from graphrun.runtime.errors import GraphLoadError
from graphrun.runtime.loader import LoadedGraph, load_graph, load_text

#: config.yaml fields graphrun reads; others are accepted and warned about once.
KNOWN_FIELDS = {
    "name",
    "model",
    "temperature",
    "top_p",
    "instructions",
    "variables",
    "dynamic_instructions",
    "global_tools",
    "mcp_servers",
    "conversation_starters",
    "description",
    "version",
    "agent_session",
    "max_iterations",
}
_IMPLEMENTED_LATER = {"dynamic_instructions"}
_warned: set[str] = set()

DEFAULT_MAX_ITERATIONS = 50


@dataclass(frozen=True)
class AgentRef:
    """A resolved agent directory and its kind."""

    name: str
    path: Path
    kind: str  # "graph" or "loop"


def resolve_agent_dir(name: str, agents_dir: Path | None) -> AgentRef:
    """An agent by name in the agents directory (or a path)."""
    candidates = [Path(name)] if ("/" in name or Path(name).is_dir()) else []
    if agents_dir is not None:
        candidates.append(agents_dir / name)
    for path in candidates:
        if path.is_dir():
            has_graph = (path / "graph.yaml").exists()
            has_config = (path / "config.yaml").exists()
            if has_graph and has_config:
                raise GraphLoadError(
                    f"agent '{name}' ({path}) has both graph.yaml and config.yaml",
                    hint="an agent is either a graph agent or an LLM-loop agent: remove one",
                )
            if has_graph:
                return AgentRef(name, path, "graph")
            if has_config:
                return AgentRef(name, path, "loop")
            raise GraphLoadError(f"agent '{name}' ({path}) has neither graph.yaml nor config.yaml")
    raise GraphLoadError(
        f"no agent '{name}' in {agents_dir}",
        hint="set --agents-dir or GRAPHRUN_AGENTS_DIR",
    )


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        print(f"warning: {message}", file=sys.stderr)


def _tool_names(
    agent_dir: Path, global_tools: list[str], mcp_servers: list[str], config_dir: Path | None
) -> list[str]:
    from graphrun.actors.tools import discover_tools

    names = sorted(discover_tools(agent_dir, global_tools=global_tools, config_dir=config_dir))
    return names + [f"mcp:{server}" for server in mcp_servers]


def _tools_text(agent_dir: Path, global_tools: list[str], config_dir: Path | None) -> str:
    from graphrun.actors.tools import discover_tools

    specs = discover_tools(agent_dir, global_tools=global_tools, config_dir=config_dir)
    return "\n".join(f"- {name}: {spec.description}" for name, spec in sorted(specs.items()))


def builtin_variables(
    agent_dir: Path, global_tools: list[str], config_dir: Path | None
) -> dict[str, str]:
    """Loki's ``{{__os__}}``-style instruction variables (read once, at load time)."""
    system = platform.system().lower()
    return {
        "__os__": {"darwin": "macos"}.get(system, system),
        "__os_family__": "windows" if system == "windows" else "unix",
        "__arch__": platform.machine(),
        "__shell__": os.environ.get("SHELL", "/bin/sh"),
        "__locale__": (locale.getlocale()[0] or "en_US"),
        "__now__": datetime.now().astimezone().isoformat(timespec="seconds"),
        "__cwd__": os.getcwd(),
        "__tools__": _tools_text(agent_dir, global_tools, config_dir),
    }


def agent_variables(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """The agent's ``variables``: defaults, overridden by ``$<NAME>_VARIABLES`` (JSON)."""
    values: dict[str, Any] = {}
    declared = config.get("variables") or []
    for var in declared:
        if isinstance(var, dict) and "name" in var and var.get("default") is not None:
            values[var["name"]] = var["default"]
    env_name = f"{name.upper().replace('-', '_')}_VARIABLES"
    raw = os.environ.get(env_name)
    if raw:
        try:
            override = json.loads(raw)
        except ValueError:
            raise GraphLoadError(f"${env_name} must be a JSON object") from None
        if not isinstance(override, dict):
            raise GraphLoadError(f"${env_name} must be a JSON object")
        values.update(override)
    missing = [
        var["name"]
        for var in declared
        if isinstance(var, dict) and "name" in var and var["name"] not in values
    ]
    if missing:
        raise GraphLoadError(
            f"agent '{name}' needs variables {', '.join(missing)}",
            hint=f"give them defaults in config.yaml or set ${env_name} to a JSON object",
        )
    return values


def loop_agent_graph(agent_dir: Path, *, config_dir: Path | None) -> LoadedGraph:
    """The graph an LLM-loop agent (config.yaml) runs as."""
    from graphrun.runtime.templates import render

    path = agent_dir / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise GraphLoadError(
            f"malformed YAML: {getattr(exc, 'problem', exc)}", where=where
        ) from None
    except OSError as exc:
        raise GraphLoadError(f"cannot read {path}: {exc}") from None
    if not isinstance(config, dict):
        raise GraphLoadError("config.yaml must be a mapping", where=str(path))
    name = str(config.get("name") or agent_dir.name)
    for key in config:
        if key in _IMPLEMENTED_LATER and config[key]:
            _warn_once(
                f"{name}:{key}",
                f"agent '{name}': '{key}' is not supported by graphrun and is ignored",
            )
        elif key not in KNOWN_FIELDS:
            _warn_once(
                f"{name}:{key}", f"agent '{name}': config.yaml field '{key}' is ignored by graphrun"
            )
    global_tools = list(config.get("global_tools") or [])
    mcp_servers = list(config.get("mcp_servers") or [])
    context = {
        **builtin_variables(agent_dir, global_tools, config_dir),
        **agent_variables(name, config),
    }
    instructions = render(str(config.get("instructions") or ""), context, strict=False)
    tools = _tool_names(agent_dir, global_tools, mcp_servers, config_dir)
    graph: dict[str, Any] = {
        "name": name,
        "description": config.get("description") or f"LLM-loop agent {name}",
        "version": "1.0",
        "global_tools": global_tools,
        "mcp_servers": mcp_servers,
        "start": "agent",
        "nodes": {
            "agent": {
                "type": "llm",
                "instructions": instructions,
                "prompt": "{{initial_prompt}}",
                "tools": tools,
                "max_iterations": int(config.get("max_iterations") or DEFAULT_MAX_ITERATIONS),
                "state_updates": {"answer": "{{output}}"},
                "fallback": "failed",
                "next": "done",
            },
            "done": {"type": "end", "output": "{{answer}}"},
            "failed": {"type": "end", "status": "failed", "output": "{{_error.message}}"},
        },
    }
    for key in ("model", "temperature", "top_p"):
        if config.get(key) is not None:
            graph[key] = config[key]
    if config.get("conversation_starters"):
        graph["conversation_starters"] = list(config["conversation_starters"])
    # Templates in the instructions are resolved; escape what's left so the decider
    # does not treat a literal "{{" in the agent's prose as a state reference.
    text = yaml.safe_dump(graph, sort_keys=False, allow_unicode=True, width=100)
    with warnings.catch_warnings():
        return load_text(text, path=path.with_name("config.yaml"), agent_dir=agent_dir)


def load_agent(target: Path, *, config_dir: Path | None) -> LoadedGraph:
    """A graph agent's graph, or the graph an LLM-loop agent runs as."""
    if target.is_dir() and (target / "config.yaml").exists():
        if (target / "graph.yaml").exists():
            raise GraphLoadError(
                f"{target} has both graph.yaml and config.yaml",
                hint="an agent is either a graph agent or an LLM-loop agent: remove one",
            )
        return loop_agent_graph(target, config_dir=config_dir)
    return load_graph(target)
