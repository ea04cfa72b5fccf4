"""What an agent's ``config.yaml`` says about Loki's built-in functions.

Loki's defaults: no spawning unless ``can_spawn_agents``; at most
``max_concurrent_agents`` (4) children at once, ``max_agent_depth`` (3) levels;
the todo functions come with ``auto_continue``, which also prompts the agent
again while todos are open (at most ``max_auto_continues``, 10, times, with
``continuation_prompt``); skills are on unless the agent (or the configuration
directory's ``config.yaml``) sets ``skills_enabled: false``, limited to
``enabled_skills`` when given. Every agent is offered the user-interaction
functions (a spawned agent's questions go to the agent that spawned it, which
answers with ``agent__reply_escalation``) and the teammate functions
(``agent__send_message``, ``agent__check_inbox``). ``inject_spawn_instructions``,
``inject_todo_instructions`` and ``inject_skill_instructions`` (all default true)
add a paragraph to the instructions saying how to use them; the teammate and
user paragraphs are always added. A child's output of ``summarization_threshold``
(4000) characters or more is summarised by ``summarization_model`` (else the
agent's own) before ``agent__collect`` hands it over.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

AGENT = ("spawn", "check", "collect", "list_running", "list_available", "cancel")
TASKS = ("task_create", "task_list", "task_complete", "task_fail")
TEAMMATE = ("send_message", "check_inbox")
USER = ("select", "confirm", "input", "checkbox")
TODO = ("init", "add", "done", "list", "clear")
SKILL = ("list", "load", "unload")

SPAWN_INSTRUCTIONS = """

## Delegating to other agents
You can hand work to other agents that run in the background while you continue.
- `agent__list_available` names the agents you may start.
- `agent__spawn` starts one with a prompt and returns its id at once; start
  independent agents together, then collect them.
- `agent__check` tells whether it has finished; `agent__collect` waits for it and
  returns its output; `agent__cancel` stops one you no longer need.
- `agent__task_create` (with `blocked_by`, and optionally an `agent` and `prompt` to
  start when it becomes runnable), `agent__task_list`, `agent__task_complete` and
  `agent__task_fail` keep a queue of tasks that depend on each other.
- A spawned agent cannot ask the user itself: its questions show up as
  `pending_escalations` in your tool results. Answer each with
  `agent__reply_escalation` (ask the user with a `user__*` function first if you
  cannot answer yourself).
Collect or cancel every agent you started before you give your final answer: an
answer given while agents still run is sent back to you.
"""

TODO_INSTRUCTIONS = """

## Keeping a todo list
For work with several steps, keep a todo list: `todo__init` with the goal, then
`todo__add` for each step, `todo__done` as soon as a step is finished and
`todo__list` to see where you are. `todo__clear` drops the list when the task
changes or is cancelled. If you stop while todos are still open, you are asked
to continue.
"""

TEAMMATE_INSTRUCTIONS = """

## Messages between agents
`agent__send_message` (an agent id and a message) leaves a message for an agent
you spawned or one working next to you; `agent__check_inbox` returns the messages
left for you. Look at your inbox before you finish when you work alongside others.
"""

USER_INSTRUCTIONS = """

## Asking the user
- `user__select`: pick one of two or more named options (returns the choice).
- `user__confirm`: a yes/no question (returns "yes" or "no").
- `user__input`: free text.
- `user__checkbox`: pick any number of options (returns the chosen ones).
Ask when you need a decision, a preference or a clarification. When you run as
a spawned agent, the agent that spawned you answers.
"""

SKILL_INSTRUCTIONS = """## Skills
Skills (documents with instructions for particular kinds of work) may be
available. Call `skill__list` early to see which fit the task, `skill__load` the
ones that do, and `skill__unload` them when their part of the work is done."""

#: Loki's prompt when the agent stopped with todos open (the list follows it).
CONTINUATION_PROMPT = (
    "[auto-continue] You stopped while todos are still open. Continue with the next "
    "open todo, and mark each one done with todo__done as soon as it is finished."
)


@dataclass(frozen=True)
class BuiltinSettings:
    """The built-in functions an agent has, and their limits."""

    can_spawn_agents: bool = False
    spawnable_agents: tuple[str, ...] | None = None
    max_concurrent_agents: int = 4
    max_agent_depth: int = 3
    todo: bool = False
    max_auto_continues: int = 10
    continuation_prompt: str | None = None
    inject_spawn_instructions: bool = True
    inject_todo_instructions: bool = True
    skills_enabled: bool = True
    enabled_skills: tuple[str, ...] | None = None
    inject_skill_instructions: bool = True
    skill_instructions: str | None = None
    summarization_model: str | None = None
    summarization_threshold: int = 4000

    def names(self, *, agent: bool = True, ask: bool = False) -> list[str]:
        """The built-in function names this agent is offered (``agent``: an agent, which
        Loki always gives the user and teammate functions; ``ask``: also the older
        ``user__ask``, for instructions that still name it)."""
        names: list[str] = []
        if self.todo:
            names += [f"todo__{n}" for n in TODO]
        if self.can_spawn_agents:
            names += [f"agent__{n}" for n in AGENT + TASKS]
            names.append("agent__reply_escalation")
        if agent:
            names += [f"agent__{n}" for n in TEAMMATE]
            names += [f"user__{n}" for n in USER]
            if ask:
                names.append("user__ask")
        if self.skills_enabled:
            names += [f"skill__{n}" for n in SKILL]
        return names

    def injected(self, *, skills_installed: bool = False) -> str:
        """The paragraphs Loki appends to an agent's instructions (the skills one only
        when some enabled skill is installed)."""
        text = ""
        if self.todo and self.inject_todo_instructions:
            text += TODO_INSTRUCTIONS
        if self.can_spawn_agents and self.inject_spawn_instructions:
            text += SPAWN_INSTRUCTIONS
        text += TEAMMATE_INSTRUCTIONS + USER_INSTRUCTIONS
        if self.skills_enabled and self.inject_skill_instructions and skills_installed:
            text += "\n\n" + (self.skill_instructions or SKILL_INSTRUCTIONS)
        return text


def _names(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    return None


def _int(value: Any, default: int) -> int:
    if value is None or isinstance(value, bool):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def settings_from_config(config: dict[str, Any]) -> BuiltinSettings:
    """The settings of a parsed ``config.yaml``."""
    return BuiltinSettings(
        can_spawn_agents=bool(config.get("can_spawn_agents")),
        spawnable_agents=_names(config.get("spawnable_agents")),
        max_concurrent_agents=_int(config.get("max_concurrent_agents"), 4),
        max_agent_depth=_int(config.get("max_agent_depth"), 3),
        todo=bool(config.get("auto_continue")),
        max_auto_continues=_int(config.get("max_auto_continues"), 10),
        continuation_prompt=(
            str(config["continuation_prompt"]) if config.get("continuation_prompt") else None
        ),
        inject_spawn_instructions=config.get("inject_spawn_instructions") is not False,
        inject_todo_instructions=config.get("inject_todo_instructions") is not False,
        skills_enabled=config.get("skills_enabled") is not False,
        enabled_skills=_names(config.get("enabled_skills")),
        inject_skill_instructions=config.get("inject_skill_instructions") is not False,
        skill_instructions=(
            str(config["skill_instructions"]) if config.get("skill_instructions") else None
        ),
        summarization_model=(
            str(config["summarization_model"]) if config.get("summarization_model") else None
        ),
        summarization_threshold=_int(config.get("summarization_threshold"), 4000),
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


def node_skill_instructions(graph: Any, node: Any) -> str | None:
    """The skills paragraph Loki appends to a graph llm node's instructions: the
    node's ``skill_instructions``, else the graph's, else Loki's own; none when the
    node has no skills or ``inject_skill_instructions`` (node, else graph) is false."""
    enabled, _chosen = node_skills(graph, node)
    if not enabled:
        return None
    inject = getattr(node, "inject_skill_instructions", None)
    if inject is None:
        inject = getattr(graph, "inject_skill_instructions", None)
    if inject is False:
        return None
    return (
        getattr(node, "skill_instructions", None)
        or getattr(graph, "skill_instructions", None)
        or SKILL_INSTRUCTIONS
    )


def node_tools(graph: Any, node: Any) -> tuple[str, ...]:
    """An llm node's ``tools:`` plus the skill functions its skills settings give it."""
    tools = tuple(getattr(node, "tools", None) or ())
    enabled, _chosen = node_skills(graph, node)
    if not enabled:
        return tools
    return tools + tuple(f"skill__{n}" for n in SKILL if f"skill__{n}" not in tools)
