"""What an agent's ``config.yaml`` says about Loki's built-in functions.

Loki's defaults: no spawning unless ``can_spawn_agents``; at most
``max_concurrent_agents`` (4) children at once, ``max_agent_depth`` (3) levels;
the todo functions come with ``auto_continue``; skills are on unless the agent
sets ``skills_enabled: false``, limited to ``enabled_skills`` when given; the
user-interaction functions are always there. ``inject_spawn_instructions`` and
``inject_todo_instructions`` (both default true) add a paragraph to the
instructions saying how to use them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

AGENT = ("spawn", "check", "collect", "list_running", "list_available", "cancel")
USER = ("ask", "select", "confirm", "input", "checkbox")
TODO = ("init", "add", "done", "list", "clear")
SKILL = ("list", "load", "unload")

SPAWN_INSTRUCTIONS = """

## Delegating to other agents
You can hand work to other agents that run in the background while you continue.
- `agent__list_available` names the agents you may start.
- `agent__spawn` starts one with a prompt and returns its id at once.
- `agent__check` tells whether it has finished; `agent__collect` waits for it and
  returns its output; `agent__cancel` stops one you no longer need.
Collect or cancel every agent you started before you give your final answer.
"""

TODO_INSTRUCTIONS = """

## Keeping a todo list
For work with several steps, keep a todo list: `todo__init` with the goal, then
`todo__add` for each step, `todo__done` when a step is finished and `todo__list`
to see where you are. `todo__clear` drops the list when the task changes.
"""


@dataclass(frozen=True)
class BuiltinSettings:
    """The built-in functions an agent has, and their limits."""

    can_spawn_agents: bool = False
    spawnable_agents: tuple[str, ...] | None = None
    max_concurrent_agents: int = 4
    max_agent_depth: int = 3
    todo: bool = False
    inject_spawn_instructions: bool = True
    inject_todo_instructions: bool = True
    skills_enabled: bool = True
    enabled_skills: tuple[str, ...] | None = None

    def names(self, *, user: bool) -> list[str]:
        """The built-in function names this agent is offered."""
        names: list[str] = []
        if self.todo:
            names += [f"todo__{n}" for n in TODO]
        if self.can_spawn_agents:
            names += [f"agent__{n}" for n in AGENT]
        if user:
            names += [f"user__{n}" for n in USER]
        if self.skills_enabled:
            names += [f"skill__{n}" for n in SKILL]
        return names

    def injected(self) -> str:
        """The paragraphs Loki appends to the agent's instructions."""
        text = ""
        if self.todo and self.inject_todo_instructions:
            text += TODO_INSTRUCTIONS
        if self.can_spawn_agents and self.inject_spawn_instructions:
            text += SPAWN_INSTRUCTIONS
        return text


def _names(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    return None


def settings_from_config(config: dict[str, Any]) -> BuiltinSettings:
    """The settings of a parsed ``config.yaml``."""
    return BuiltinSettings(
        can_spawn_agents=bool(config.get("can_spawn_agents")),
        spawnable_agents=_names(config.get("spawnable_agents")),
        max_concurrent_agents=int(config.get("max_concurrent_agents") or 4),
        max_agent_depth=int(config.get("max_agent_depth") or 3),
        todo=bool(config.get("auto_continue")),
        inject_spawn_instructions=config.get("inject_spawn_instructions") is not False,
        inject_todo_instructions=config.get("inject_todo_instructions") is not False,
        skills_enabled=config.get("skills_enabled") is not False,
        enabled_skills=_names(config.get("enabled_skills")),
    )


def settings_for(agent_dir: Path) -> BuiltinSettings:
    """The settings of the agent in ``agent_dir`` (defaults for a graph agent)."""
    path = agent_dir / "config.yaml"
    if not path.is_file():
        return BuiltinSettings()
    import yaml

    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return BuiltinSettings()
    return settings_from_config(config if isinstance(config, dict) else {})


def node_skills(graph: Any, node: Any) -> tuple[bool, tuple[str, ...] | None]:
    """Whether a graph's llm node has skills, and which (Loki: the node's
    ``skills_enabled``/``enabled_skills``, else the graph's; off unless set)."""
    enabled = getattr(node, "skills_enabled", None)
    if enabled is None:
        enabled = getattr(graph, "skills_enabled", None)
    chosen = getattr(node, "enabled_skills", None)
    if chosen is None:
        chosen = getattr(graph, "enabled_skills", None)
    return bool(enabled), (tuple(chosen) if chosen is not None else None)


def node_tools(graph: Any, node: Any) -> tuple[str, ...]:
    """An llm node's ``tools:`` plus the skill functions its skills settings give it."""
    tools = tuple(getattr(node, "tools", None) or ())
    enabled, _chosen = node_skills(graph, node)
    if not enabled:
        return tools
    return tools + tuple(f"skill__{n}" for n in SKILL if f"skill__{n}" not in tools)
