"""Loki's built-in functions as the model is offered them: names and declarations.

What each does is in :mod:`graphrun.runtime.nodes.builtins`; this module only says
which names are built-ins and how they are declared to the model.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

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
    "agent__task_create": (
        "Create a task in the task queue; returns its id. A task with blocked_by waits "
        "until those tasks are completed; with agent and prompt, that agent is started "
        "when it becomes runnable.",
        _obj(
            {
                "subject": {"type": "string", "description": "A short title"},
                "description": {"type": "string", "description": "What the task is"},
                "blocked_by": {
                    "type": "array",
                    "items": _S,
                    "description": "Ids of tasks that must be completed first",
                },
                "agent": {"type": "string", "description": "An agent to start when runnable"},
                "prompt": {"type": "string", "description": "The prompt for that agent"},
            },
            ["subject"],
        ),
    ),
    "agent__task_list": ("The tasks in the queue, their status and dependencies.", _obj({})),
    "agent__task_complete": (
        "Mark a task completed; returns the tasks it unblocked (and the agents started).",
        _obj({"task_id": {"type": "string", "description": "The task's id"}}, ["task_id"]),
    ),
    "agent__task_fail": (
        "Mark a task failed; the tasks waiting on it stay blocked.",
        _obj({"task_id": {"type": "string", "description": "The task's id"}}, ["task_id"]),
    ),
    "agent__reply_escalation": (
        "Answer the question of a spawned agent that waits for you (from "
        "pending_escalations); it goes on with your reply.",
        _obj(
            {
                "escalation_id": {
                    "type": "string",
                    "description": "The escalation_id from pending_escalations",
                },
                "reply": {
                    "type": "string",
                    "description": "Your answer: an option's exact text, or free text",
                },
            },
            ["escalation_id", "reply"],
        ),
    ),
    "agent__send_message": (
        "Leave a message for an agent you spawned or one working next to you.",
        _obj(
            {
                "id": {"type": "string", "description": "The agent's id"},
                "message": {"type": "string", "description": "The message"},
            },
            ["id", "message"],
        ),
    ),
    "agent__check_inbox": (
        "The messages other agents left for you since you last looked.",
        _obj({}),
    ),
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


__all__ = ["PREFIXES", "SOURCE", "builtin_specs", "is_builtin", "known", "result"]
