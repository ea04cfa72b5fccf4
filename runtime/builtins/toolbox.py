"""The tools of one ``llm`` visit: the node's own, plus the built-in functions it names."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from graphrun.actors.base import CancelToken
from graphrun.actors.llm.providers.base import ToolResult, ToolSpec

PREFIXES = ("agent__", "user__", "todo__", "skill__")
SOURCE = "builtin"


def is_builtin(name: str) -> bool:
    """Whether ``name`` is one of Loki's built-in functions."""
    return name.startswith(PREFIXES)


def _obj(properties: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


_S = {"type": "string"}
_ID = {"type": "string", "description": "The id agent__spawn returned"}
_QUESTION = {"type": "string", "description": "The question to show the user"}
_OPTIONS = {"type": "array", "items": _S, "description": "The options to choose from"}
_SKILL = {"type": "string", "description": "The skill's name"}

_SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    "agent__spawn": (
        "Start another agent in the background with a prompt; returns its id at once. "
        "Collect (agent__collect) or cancel (agent__cancel) it before your final answer.",
        _obj(
            {
                "agent": {"type": "string", "description": "The agent to start"},
                "prompt": {"type": "string", "description": "The task for the agent"},
                "task_id": {"type": "string", "description": "Optional task id"},
            },
            ["agent", "prompt"],
        ),
    ),
    "agent__check": (
        "Whether a spawned agent has finished: its result if so, else pending.",
        _obj({"id": _ID}, ["id"]),
    ),
    "agent__collect": (
        "Wait for a spawned agent to finish and return its output.",
        _obj({"id": _ID}, ["id"]),
    ),
    "agent__list_running": ("The agents you spawned and their status.", _obj({})),
    "agent__list_available": ("The agents you may spawn, with descriptions.", _obj({})),
    "agent__cancel": ("Stop a spawned agent.", _obj({"id": _ID}, ["id"])),
    "user__ask": (
        "Ask the user to pick one of several options (or answer in their own words).",
        _obj({"question": _QUESTION, "options": _OPTIONS}, ["question", "options"]),
    ),
    "user__select": (
        "Ask the user to pick exactly one of two or more named options.",
        _obj({"question": _QUESTION, "options": _OPTIONS}, ["question", "options"]),
    ),
    "user__confirm": (
        'Ask the user a yes/no question; returns "yes" or "no".',
        _obj({"question": _QUESTION}, ["question"]),
    ),
    "user__input": (
        "Ask the user for free text.",
        _obj({"question": _QUESTION}, ["question"]),
    ),
    "user__checkbox": (
        "Ask the user to pick any number of options; returns the chosen ones.",
        _obj({"question": _QUESTION, "options": _OPTIONS}, ["question", "options"]),
    ),
    "todo__init": (
        "Start a new todo list for a goal (drops the current one).",
        _obj({"goal": {"type": "string", "description": "What the todos achieve"}}, ["goal"]),
    ),
    "todo__add": (
        "Add a todo to the list.",
        _obj({"task": {"type": "string", "description": "The todo"}}, ["task"]),
    ),
    "todo__done": (
        "Mark a todo as done by its id.",
        _obj({"id": {"type": "integer", "description": "The todo's id"}}, ["id"]),
    ),
    "todo__list": ("The todo list and the status of each todo.", _obj({})),
    "todo__clear": ("Drop the todo list and its goal.", _obj({})),
    "skill__list": ("The skills you may load, with descriptions.", _obj({})),
    "skill__load": (
        "Load a skill: its instructions are returned to you.",
        _obj({"name": _SKILL}, ["name"]),
    ),
    "skill__unload": ("Unload a loaded skill.", _obj({"name": _SKILL}, ["name"])),
}


def builtin_specs(names: Sequence[str]) -> list[ToolSpec]:
    """The declarations of the built-in functions ``names`` (unknown names skipped)."""
    return [
        ToolSpec(name, _SPECS[name][0], _SPECS[name][1], SOURCE) for name in names if name in _SPECS
    ]


def known(name: str) -> bool:
    return name in _SPECS


def result(value: Any, *, started: float, error: bool = False) -> ToolResult:
    """A built-in's answer as the model sees it: JSON."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return ToolResult(text, error, round((time.perf_counter() - started) * 1000, 3), SOURCE)


class BuiltinToolbox:
    """One visit's tools: ``inner`` (the node's own) and the built-ins it names.

    Made per visit (the built-ins record into the visit's context); ``close`` ends
    what the visit left running (children never collected are cancelled, as
    Loki abandons them).
    """

    def __init__(
        self, inner: Any, names: Sequence[str], *, ports: Any, ctx: Any, node_id: str
    ) -> None:
        from graphrun.runtime.builtins.agents import Supervisor
        from graphrun.runtime.builtins.settings import node_skills, settings_for
        from graphrun.runtime.builtins.skills import Skills
        from graphrun.runtime.builtins.todo import Todos
        from graphrun.runtime.builtins.user import UserQuestions

        self.inner = inner
        self.names = [n for n in names if known(n)]
        self.specs: list[ToolSpec] = builtin_specs(self.names) + list(
            inner.specs if inner is not None else []
        )
        settings = settings_for(ports.agent_dir)
        node = ports.graph.nodes.get(node_id)
        enabled, chosen = node_skills(ports.graph, node)
        if enabled:  # a graph's llm node with Loki's skills settings
            settings = replace(settings, skills_enabled=True, enabled_skills=chosen)
        prior = tuple(getattr(ctx, "prior", ()) or ())
        self.agents = Supervisor(ports, ctx, node_id, settings, prior)
        self.user = UserQuestions(ports, ctx, node_id, prior)
        self.todos = Todos(prior, node_id)
        self.skills = Skills(ports, settings, prior, node_id)

    def call(self, name: str, arguments: str, *, cancel: CancelToken) -> ToolResult:
        if name not in self.names:
            if self.inner is None:
                return ToolResult(f"unknown tool '{name}'", True, 0.0, "")
            return self.inner.call(name, arguments, cancel=cancel)
        started = time.perf_counter()
        try:
            args = json.loads(arguments or "{}")
        except ValueError:
            args = None
        if not isinstance(args, dict):
            return result(
                {"error": f"{name}: arguments must be a JSON object"}, started=started, error=True
            )
        group, _, action = name.partition("__")
        handler: Any = {
            "agent": self.agents,
            "user": self.user,
            "todo": self.todos,
            "skill": self.skills,
        }[group]
        value = handler.call(action, args, cancel)
        failed = "error" in value or value.get("status") == "error"
        return result(value, started=started, error=failed)

    def close(self) -> None:
        self.agents.close()
