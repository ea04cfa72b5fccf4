"""Agents: graph agents (graph.yaml) and LLM-loop agents (Loki's config.yaml).

An LLM-loop agent runs as a graph too, so it gets the same event log, replay and
audit: :func:`loop_agent_graph` turns its config.yaml into a two-node graph (one
``llm`` node with the agent's instructions and every tool it has, looping on tool
calls to a final answer, then an ``end``). Loki's instruction variables are
resolved when the agent is loaded — ``{{__now__}}`` included — and the resolved
graph text is what ``RunStarted`` records, so a replay sees exactly what ran.

Supported as Loki does: ``model``, ``temperature``, ``top_p``, ``instructions``
with Loki's special variables (``{{__tools__}}`` lists global and agent tools and
each MCP server's meta-functions ``mcp_search_``/``mcp_describe_``/``mcp_invoke_<server>``,
which is how Loki offers MCP servers to its agents) and the agent's
``variables`` (defaults, then ``$<NAME>_VARIABLES`` as JSON), ``dynamic_instructions``
(the ``_instructions`` function of tools.py / tools.sh), ``global_tools``,
``mcp_servers``, ``conversation_starters``, ``description``. Other fields are
accepted and warned about once per process.
"""

from __future__ import annotations

import dataclasses
import json
import locale
import os
import platform
import re
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from graphrun.eventstore.errors import GraphrunError
from graphrun.runtime.errors import GraphLoadError, GraphValidationError
from graphrun.runtime.graph.builtins import SKILL_INSTRUCTIONS, settings_from_config
from graphrun.runtime.graph.loader import LoadedGraph, load_graph, load_text

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
    # Loki's built-in functions (graphrun.runtime.nodes.builtins)
    "can_spawn_agents",
    "spawnable_agents",
    "max_concurrent_agents",
    "max_agent_depth",
    "inject_spawn_instructions",
    "inject_todo_instructions",
    "skills_enabled",
    "enabled_skills",
    "auto_continue",
    "max_auto_continues",
    "continuation_prompt",
    "inject_skill_instructions",
    "skill_instructions",
    "summarization_model",
    "summarization_threshold",
    "escalation_timeout",
}
#: Loki fields graphrun reads but does not act on (warned about once when set).
_UNSUPPORTED = {"agent_session": "graphrun runs have no chat sessions"}
#: Loki fields graphrun acts on only in part (warned about once when set).
_PARTIAL = {
    "escalation_timeout": "a spawned agent's question waits for its parent's reply "
    "(agent__reply_escalation) without a time limit"
}
_warned: set[str] = set()

DEFAULT_MAX_ITERATIONS = 50
#: Seconds an agent's ``_instructions`` function may take.
DYNAMIC_INSTRUCTIONS_TIMEOUT = 60.0


@dataclass(frozen=True)
class AgentRef:
    """A resolved agent directory and its kind."""

    name: str
    path: Path
    kind: str  # "graph" or "loop"


def is_agent_path(name: str) -> bool:
    """Whether an ``agent:`` value is a path (from the graph's folder), not a name."""
    return "/" in name or os.sep in name or name.startswith((".", "~"))


def resolve_agent_dir(
    name: str, agents_dir: Path | None, *, graph_dir: Path | None = None
) -> AgentRef:
    """An agent by name in the agents directory, or a path inside ``graph_dir`` (the
    folder of the graph naming it). Anything else (an absolute path, a path leaving
    the graph's folder) needs the user's allowance (:mod:`graphrun.actors.paths`)."""
    from graphrun.actors.paths import outside_hint, outside_problem

    candidates = []
    if is_agent_path(name):
        path = Path(os.path.expanduser(name))
        if not path.is_absolute() and graph_dir is not None:
            path = graph_dir / path
        problem = outside_problem(graph_dir, path, what=f"agent '{name}'")
        if problem is not None:
            raise GraphLoadError(
                problem, hint="name an agent in the agents directory, or " + outside_hint()
            )
        candidates.append(path)
    elif agents_dir is not None:
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
        hint="set --agents-dir or GRAPHRUN_AGENTS_DIR, or --loki-dir DIR for a Loki/Coyote "
        "configuration directory",
    )


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        print(f"warning: {message}", file=sys.stderr)


def _tool_names(
    agent_dir: Path, global_tools: list[str], mcp_servers: list[str], config_dir: Path | None
) -> list[str]:
    from graphrun.actors.tools.mcp import META_PREFIXES
    from graphrun.actors.tools.toolbox import discover_tools

    names = sorted(discover_tools(agent_dir, global_tools=global_tools, config_dir=config_dir))
    # As Loki offers them to its agents: three meta-functions per server.
    return names + [f"{prefix}_{server}" for server in mcp_servers for prefix in META_PREFIXES]


def _tools_text(
    agent_dir: Path, global_tools: list[str], mcp_servers: list[str], config_dir: Path | None
) -> str:
    """Loki's ``{{__tools__}}``: every enabled tool (global, agent, and each MCP
    server's three meta-functions) with its description. Nothing is started."""
    from graphrun.actors.tools.mcp import McpHub, meta_tools
    from graphrun.actors.tools.toolbox import discover_tools

    specs = dict(discover_tools(agent_dir, global_tools=global_tools, config_dir=config_dir))
    hub = McpHub({})  # the specs only: nothing is called through it
    for server in mcp_servers:
        specs.update({name: tool.spec for name, tool in meta_tools(hub, server).items()})
    return "\n".join(f"- {name}: {spec.description}" for name, spec in sorted(specs.items()))


def builtin_variables(
    agent_dir: Path,
    global_tools: list[str],
    config_dir: Path | None,
    mcp_servers: list[str] | None = None,
    *,
    with_tools: bool = True,
) -> dict[str, str]:
    """Loki's ``{{__os__}}``-style instruction variables (read once, at load time).

    ``with_tools=False`` leaves ``__tools__`` out (it may start MCP servers).
    """
    system = platform.system().lower()
    values = {
        "__os__": {"darwin": "macos"}.get(system, system),
        "__os_family__": "windows" if system == "windows" else "unix",
        "__arch__": platform.machine(),
        "__shell__": os.environ.get("SHELL", "/bin/sh"),
        "__locale__": (locale.getlocale()[0] or "en_US"),
        "__now__": datetime.now().astimezone().isoformat(timespec="seconds"),
        "__cwd__": os.getcwd(),
    }
    if with_tools:
        values["__tools__"] = _tools_text(agent_dir, global_tools, mcp_servers or [], config_dir)
    return values


def agent_variables(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """The agent's ``variables``: defaults, overridden by ``$<NAME>_VARIABLES`` — a
    JSON object of values, or (Loki's form) a JSON array of declarations that
    replaces the declared ones."""
    values: dict[str, Any] = {}
    declared = config.get("variables") or []
    env_name = f"{name.upper().replace('-', '_')}_VARIABLES"
    raw = os.environ.get(env_name)
    override: Any = None
    if raw:
        try:
            override = json.loads(raw)
        except ValueError:
            raise GraphLoadError(f"${env_name} must be a JSON object") from None
        declarations = isinstance(override, list) and all(
            isinstance(v, dict) and isinstance(v.get("name"), str) for v in override
        )
        if not isinstance(override, dict) and not declarations:
            raise GraphLoadError(f"${env_name} must be a JSON object")
        if isinstance(override, list):
            declared = override
    for var in declared:
        if isinstance(var, dict) and "name" in var and var.get("default") is not None:
            values[var["name"]] = var["default"]
    if isinstance(override, dict):
        values.update(override)
    # A variable without a value is resolved when a run starts (--var, a prompt, or
    # the error naming it: graphrun.runtime.graph.variables).
    return values


def _read_config(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """config.yaml as data, with the YAML line of each JSON path."""
    from graphrun.runtime.graph.loader import parse_yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise GraphLoadError(f"cannot read {path}: {exc}") from None
    config, lines, problems = parse_yaml(text, str(path))
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise GraphLoadError(errors[0].message, where=f"{path}:{errors[0].line or 1}")
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise GraphLoadError("config.yaml must be a mapping", where=str(path))
    return config, lines


def _warn_fields(name: str, config: dict[str, Any]) -> None:
    for key, value in config.items():
        if key in _PARTIAL:
            if value not in (None, "", False, [], {}):
                _warn_once(f"{name}:{key}", f"agent '{name}': '{key}': {_PARTIAL[key]}")
        elif key in _UNSUPPORTED:
            if value not in (None, "", False, [], {}):
                _warn_once(
                    f"{name}:{key}",
                    f"agent '{name}': '{key}' is not supported by graphrun and is ignored "
                    f"({_UNSUPPORTED[key]})",
                )
        elif key not in KNOWN_FIELDS:
            _warn_once(
                f"{name}:{key}", f"agent '{name}': config.yaml field '{key}' is ignored by graphrun"
            )


def dynamic_instructions(agent_dir: Path, *, config_dir: Path | None) -> str:
    """The output of the agent's ``_instructions`` function (Loki's ``dynamic_instructions``).

    Loki calls a function named ``_instructions`` in ``tools.py`` (its return value)
    or ``tools.sh`` (an ``@cmd`` function writing to ``$LLM_OUTPUT``) when the agent
    starts. graphrun calls it with no terminal input: an ``_instructions`` that
    prompts for input reads end-of-file.

    Raises:
        GraphLoadError: there is no ``_instructions`` function, or it failed.
    """
    from graphrun.actors.llm.providers.base import ToolSpec
    from graphrun.actors.tools.toolbox import BashTool, PythonTool, _context, parse_argc

    ctx = _context(agent_dir.resolve(), config_dir, agent=True)
    tool: Any = None
    py, sh = agent_dir / "tools.py", agent_dir / "tools.sh"
    if py.is_file() and "def _instructions(" in py.read_text(encoding="utf-8"):
        spec = ToolSpec("_instructions", "dynamic instructions", {}, "tools.py")
        tool = PythonTool(spec, py.resolve(), "_instructions", ctx, True)
    elif sh.is_file():
        _root, commands = parse_argc(sh.read_text(encoding="utf-8"), path=sh)
        command = next((c for c in commands if c.function == "_instructions"), None)
        if command is not None:
            spec = ToolSpec("_instructions", "dynamic instructions", {}, "tools.sh")
            tool = BashTool(spec, sh.resolve(), command, ctx, True)
    if tool is None:
        raise GraphLoadError(
            f"agent '{agent_dir.name}' sets dynamic_instructions but defines no _instructions "
            "function",
            where=str(agent_dir / "config.yaml"),
            hint="define _instructions() in tools.py, or an `@cmd` _instructions function "
            "in tools.sh",
        )
    result = tool.call("{}", cancel=None, timeout=DYNAMIC_INSTRUCTIONS_TIMEOUT)
    if result.is_error:
        raise GraphLoadError(
            f"agent '{agent_dir.name}': _instructions failed: {result.output}",
            where=str(agent_dir / tool.spec.source),
        )
    return result.output


# Synthesized graph paths -> the config.yaml paths they come from (for diagnostics).
_CONFIG_PATHS = {
    "$.model": "$.model",
    "$.temperature": "$.temperature",
    "$.top_p": "$.top_p",
    "$.global_tools": "$.global_tools",
    "$.mcp_servers": "$.mcp_servers",
    "$.conversation_starters": "$.conversation_starters",
    "$.nodes.agent.instructions": "$.instructions",
    "$.nodes.agent.tools": "$.mcp_servers",
    "$.nodes.agent.max_iterations": "$.max_iterations",
}


def _config_lines(
    graph_lines: dict[str, int], config_lines: dict[str, int], config: dict[str, Any]
) -> dict[str, int]:
    """Diagnostics on an LLM-loop agent point at config.yaml, not at the graph it became."""
    out = {"$": 1}
    for graph_path in graph_lines:
        source = _CONFIG_PATHS.get(graph_path)
        if graph_path.startswith("$.nodes.agent.tools") and not config.get("mcp_servers"):
            source = "$.global_tools"
        for prefix in ("$.global_tools", "$.mcp_servers", "$.conversation_starters"):
            if graph_path.startswith(prefix + "["):
                source = graph_path
        if source is not None and source in config_lines:
            out[graph_path] = config_lines[source]
    return out


def loop_agent_graph(
    agent_dir: Path, *, config_dir: Path | None, recorded: Any = None
) -> LoadedGraph:
    """The graph an LLM-loop agent (config.yaml) runs as.

    The instructions are rendered here (Loki's special variables and the agent's
    ``variables``), so the graph text that ``RunStarted`` records is exactly what
    the model was told. Diagnostics point at config.yaml.

    ``recorded`` (a recording's graph, when one is replayed) stands in for what the
    configuration directory would give when it is not here: the default model and
    the global tools' names.
    """
    path = agent_dir / "config.yaml"
    config, config_lines = _read_config(path)
    name = str(config.get("name") or agent_dir.name)
    _warn_fields(name, config)
    global_tools = list(config.get("global_tools") or [])
    mcp_servers = list(config.get("mcp_servers") or [])
    if config.get("dynamic_instructions"):
        template = dynamic_instructions(agent_dir, config_dir=config_dir)
    else:
        template = str(config.get("instructions") or "")
    offline = recorded is not None and (config_dir is None or not Path(config_dir).is_dir())
    try:
        context: dict[str, Any] = builtin_variables(
            agent_dir,
            global_tools,
            config_dir,
            mcp_servers,
            with_tools="__tools__" in template,
        )
    except GraphrunError:
        if not offline:
            raise
        # Replayed without the configuration: the tools' text is in the recorded state.
        context = builtin_variables(agent_dir, global_tools, config_dir, with_tools=False)
        context["__tools__"] = ""
    context.update(agent_variables(name, config))
    # The variables stay templates in the graph and their values go into the run's
    # initial state (recorded in RunStarted): the graph text is the same on every
    # load and machine, so recorded runs replay against it; what the model was told
    # is still in the log. Any other {{...}} renders empty, as Loki renders it.
    instructions = _keep_variables(template, {**_declared_names(name, config), **context})
    try:
        tools = _tool_names(agent_dir, global_tools, mcp_servers, config_dir)
    except GraphrunError:
        node = recorded.nodes.get("agent") if recorded is not None else None
        if not offline or node is None:
            raise
        tools = [name for name in node.tools if not _is_builtin(name)]
    settings = _builtin_settings(config, config_dir, recorded if offline else None)
    tools += settings.names(ask="user__ask" in template)
    instructions += settings.injected(
        skills_installed=_skills_installed(settings, config_dir, recorded if offline else None)
    )
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
    if "model" not in graph:
        model = default_model(name, config_dir) or (recorded.model if recorded else None)
        if model:
            graph["model"] = model
    if config.get("conversation_starters"):
        graph["conversation_starters"] = list(config["conversation_starters"])
    text = yaml.safe_dump(graph, sort_keys=False, allow_unicode=True, width=100)
    try:
        loaded = load_text(text, path=path, agent_dir=agent_dir)
    except GraphValidationError as exc:
        first = next(d for d in exc.diagnostics if d.severity == "error")
        source = _CONFIG_PATHS.get(first.path or "$", first.path or "$")
        line = config_lines.get(source, 1)
        raise GraphLoadError(
            f"agent '{name}': {first.message}", where=f"{path}:{line} ({source})"
        ) from None
    import dataclasses

    return dataclasses.replace(
        loaded,
        lines=_config_lines(loaded.lines, config_lines, config),
        seed_state=dict(context),
    )


def _is_builtin(name: str) -> bool:
    from graphrun.actors.tools.builtin_specs import is_builtin

    return is_builtin(name)


def _builtin_settings(config: dict[str, Any], config_dir: Path | None, recorded: Any) -> Any:
    """Loki's built-in functions for this agent: its own settings, with skills off when
    the configuration directory's ``config.yaml`` turns them off for everyone (replayed
    without it: when the recorded agent was offered none)."""
    settings = settings_from_config(config)
    if settings.skills_enabled and recorded is not None:
        node = recorded.nodes.get("agent")
        if "skill__list" not in (getattr(node, "tools", None) or ()):
            settings = dataclasses.replace(settings, skills_enabled=False)
    elif settings.skills_enabled and config_dir is not None:
        path = Path(config_dir) / "config.yaml"
        try:
            app = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, yaml.YAMLError):
            app = None  # a broken config.yaml is reported where a model is needed
        if isinstance(app, dict) and app.get("skills_enabled") is False:
            settings = dataclasses.replace(settings, skills_enabled=False)
    return settings


def _skills_installed(settings: Any, config_dir: Path | None, recorded: Any) -> bool:
    """Whether a skill the agent may load is installed (Loki hints at skills only
    then). Replayed without the configuration directory, the recorded instructions
    say whether they carried the hint."""
    if not settings.skills_enabled:
        return False
    if recorded is not None:
        node = recorded.nodes.get("agent")
        system = getattr(node, "instructions", None) or ""
        return (settings.skill_instructions or SKILL_INSTRUCTIONS) in system
    from graphrun.runtime.graph.skills import available

    chosen = settings.enabled_skills
    return any(chosen is None or name in chosen for name in available(config_dir))


def _declared_names(name: str, config: dict[str, Any]) -> dict[str, str]:
    """Every declared variable, with or without a value yet (``$<NAME>_VARIABLES``
    as a list replaces the declarations)."""
    declared = config.get("variables") or []
    raw = os.environ.get(f"{name.upper().replace('-', '_')}_VARIABLES")
    try:
        override = json.loads(raw) if raw else None
    except ValueError:
        override = None
    if isinstance(override, list):
        declared = override
    if not isinstance(declared, list):
        return {}
    return {str(v["name"]): "" for v in declared if isinstance(v, dict) and v.get("name")}


def _keep_variables(template: str, variables: dict[str, Any]) -> str:
    from graphrun.runtime.graph.templates import _EXPR, parse_path

    def keep(match: Any) -> str:
        try:
            root = parse_path(match.group(1))[0]
        except ValueError:
            return ""
        return match.group(0) if root in variables else ""

    return _EXPR.sub(keep, template)


def default_model(agent: str, config_dir: Path | None) -> str | None:
    """The model of an agent that names none, as Loki chooses it: ``$<AGENT>_MODEL``,
    else the config directory's ``config.yaml`` ``model:``."""
    from graphrun.actors.tools.lokienv import env_name

    model = os.environ.get(f"{env_name(agent)}_MODEL")
    if model:
        return model
    if config_dir is None or not (Path(config_dir) / "config.yaml").is_file():
        return None
    from graphrun.actors.llm.config import load_llm_config

    try:
        return load_llm_config(config_dir).default_model
    except GraphrunError:
        return None  # validation reports a broken config.yaml where a model is needed


def _with_default_model(
    loaded: LoadedGraph, config_dir: Path | None, fallback_model: str | None = None
) -> LoadedGraph:
    """Loki's default-model chain for a graph agent: llm nodes without a model, in a
    graph without one, use :func:`default_model`. The model is written into the graph
    text (at its end, so no line moves), so the run records it and replays it."""
    graph = loaded.graph
    needs = any(type(n).CALLS_MODEL and not getattr(n, "model", None) for n in graph.nodes.values())
    if graph.model or not needs:
        return loaded
    if re.search(r"^model\s*:", loaded.source, re.MULTILINE):
        return loaded  # an explicit empty model: validation says so
    agent = loaded.agent_dir.name if loaded.path.name == "graph.yaml" else graph.name
    model = default_model(agent, config_dir) or fallback_model
    if not model:
        return loaded
    text = loaded.source
    if text and not text.endswith("\n"):
        text += "\n"
    text += (
        f"model: {json.dumps(model)}  # Loki's default model (${_env_var(agent)} or config.yaml)\n"
    )
    import dataclasses

    reloaded = load_text(text, path=loaded.path, agent_dir=loaded.agent_dir)
    return dataclasses.replace(reloaded, seed_state=loaded.seed_state)


def _env_var(agent: str) -> str:
    from graphrun.actors.tools.lokienv import env_name

    return f"{env_name(agent)}_MODEL"


def load_agent(target: Path, *, config_dir: Path | None, recorded: Any = None) -> LoadedGraph:
    """A graph agent's graph, or the graph an LLM-loop agent runs as.

    ``recorded`` is the graph a recording holds, when one is replayed: what the
    configuration directory would give and it is not here for (Loki's default
    model, global tools' names) is taken from it, so a missing configuration is
    not a changed graph."""
    if target.is_dir() and (target / "config.yaml").exists():
        if (target / "graph.yaml").exists():
            raise GraphLoadError(
                f"{target} has both graph.yaml and config.yaml",
                hint="an agent is either a graph agent or an LLM-loop agent: remove one",
            )
        return loop_agent_graph(target, config_dir=config_dir, recorded=recorded)
    fallback = recorded.model if recorded is not None else None
    return _with_default_model(load_graph(target), config_dir, fallback)
