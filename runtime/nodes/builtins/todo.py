"""``todo__*``: the agent's todo list, as Loki keeps it, rebuilt from the run's log.

Each todo call is recorded (``ToolCalled`` with its arguments), so the list is a
fold over those calls: a resumed visit starts from the list it had, and
``graphrun show`` prints it (:func:`todo_list`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from graphrun.eventstore.events import ToolCalled


@dataclass
class TodoList:
    """A goal and numbered todos (ids count up from 1; ``clear`` starts over)."""

    goal: str = ""
    todos: list[dict[str, Any]] = field(default_factory=list)

    def apply(self, action: str, args: dict[str, Any]) -> dict[str, Any]:
        """Perform ``action`` (init, add, done, list, clear); the answer to the model."""
        if action == "init":
            self.goal = str(args.get("goal") or "")
            self.todos = []
            return {"status": "ok", "message": "Initialized new todo list"}
        if action == "add":
            task = str(args.get("task") or "")
            if not task:
                return {"error": "task description is required"}
            new_id = max((t["id"] for t in self.todos), default=0) + 1
            self.todos.append({"id": new_id, "desc": task, "done": False})
            return {"status": "ok", "id": new_id}
        if action == "done":
            raw = args.get("id")
            try:
                wanted = int(raw) if raw is not None and not isinstance(raw, bool) else None
            except (TypeError, ValueError):
                wanted = None
            if wanted is None:
                return {"error": "id is required and must be a number"}
            for todo in self.todos:
                if todo["id"] == wanted:
                    todo["done"] = True
                    return {"status": "ok", "message": f"Marked todo {wanted} as done"}
            return {"error": f"Todo {wanted} not found"}
        if action == "list":
            return {"goal": self.goal, "todos": [dict(t) for t in self.todos]}
        if action == "clear":
            self.goal, self.todos = "", []
            return {"status": "ok", "message": "Todo list cleared"}
        return {"error": f"unknown todo function 'todo__{action}'"}

    def render(self) -> str:
        """The list for people: goal, progress, one line per todo."""
        done = sum(1 for t in self.todos if t["done"])
        lines = [f"Goal: {self.goal}"] if self.goal else []
        lines.append(f"Progress: {done}/{len(self.todos)} completed")
        lines += [f"  {'✓' if t['done'] else '○'} {t['id']}. {t['desc']}" for t in self.todos]
        return "\n".join(lines)


def _replayed(events: Iterable[Any], node_id: str | None) -> TodoList | None:
    todos: TodoList | None = None
    for event in events:
        if not isinstance(event, ToolCalled) or not event.name.startswith("todo__"):
            continue
        if node_id is not None and event.node_id != node_id:
            continue
        try:
            args = json.loads(event.arguments or "{}")
        except ValueError:
            continue
        if todos is None:
            todos = TodoList()
        if isinstance(args, dict) and not event.is_error:
            todos.apply(event.name[len("todo__") :], args)
    return todos


def todo_list(events: Iterable[Any]) -> TodoList | None:
    """The run's todo list (None when the run never used one)."""
    return _replayed(events, None)


class Todos:
    """The todo functions of one visit."""

    def __init__(self, prior: tuple[Any, ...], node_id: str) -> None:
        self.list = _replayed(prior, node_id) or TodoList()

    def call(self, action: str, args: dict[str, Any], cancel: Any) -> dict[str, Any]:
        return self.list.apply(action, args)
