"""``agent__task_*``: Loki's task queue, tasks that wait for each other.

Tasks are numbered from 1; one created with ``blocked_by`` waits (``blocked``)
until each of those is completed, then becomes ``pending`` again. Completing a
task returns the tasks it unblocked; one created with an ``agent`` and a
``prompt`` is then claimed (``in_progress``, owner ``auto:<agent>``) and that
agent spawned as ``agent__spawn`` would. Failing a task leaves its dependents
blocked. Like the todo list, the queue is a fold over the visit's recorded
calls (``ToolCalled``), so a resumed visit has the queue it had.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graphrun.eventstore.events import ToolCalled


@dataclass
class _Task:
    id: str
    subject: str
    description: str = ""
    status: str = "pending"  # pending, blocked, in_progress, completed, failed
    owner: str | None = None
    blocked_by: list[str] = field(default_factory=list)
    blocks: list[str] = field(default_factory=list)
    agent: str | None = None
    prompt: str | None = None


class TaskQueue:
    """The task queue of one visit."""

    def __init__(self, prior: tuple[Any, ...], node_id: str, visit: int) -> None:
        self.tasks: dict[str, _Task] = {}
        for event in prior:
            if (
                isinstance(event, ToolCalled)
                and event.node_id == node_id
                and event.visit == visit
                and event.name.startswith("agent__task_")
                and not event.is_error
            ):
                try:
                    args = json.loads(event.arguments or "{}")
                except ValueError:
                    continue
                if isinstance(args, dict):
                    self.apply(event.name[len("agent__") :], args)

    def apply(self, action: str, args: dict[str, Any]) -> tuple[dict[str, Any], list[_Task]]:
        """Perform ``action``: the answer, and the tasks claimed for an agent to start."""
        if action == "task_create":
            return self._create(args), []
        if action == "task_list":
            return {"tasks": [self._shown(t) for t in self.tasks.values()]}, []
        task_id = str(args.get("task_id") or "")
        if not task_id:
            return {"status": "error", "message": "'task_id' is required"}, []
        task = self.tasks.get(task_id)
        if task is None:
            return {"status": "error", "message": f"Task '{task_id}' not found"}, []
        if action == "task_fail":
            task.status = "failed"
            return {
                "status": "ok",
                "task_id": task_id,
                "blocked_dependents": list(task.blocks),
                "message": f"Task '{task_id}' marked as failed. {len(task.blocks)} dependent "
                "task(s) will remain blocked.",
            }, []
        if action != "task_complete":
            return {"status": "error", "message": f"unknown function 'agent__{action}'"}, []
        task.status = "completed"
        unblocked: list[_Task] = []
        for dependent_id in task.blocks:
            dependent = self.tasks.get(dependent_id)
            if dependent is None or task_id not in dependent.blocked_by:
                continue
            dependent.blocked_by.remove(task_id)
            if not dependent.blocked_by and dependent.status == "blocked":
                dependent.status = "pending"
                unblocked.append(dependent)
        claimed = []
        for dependent in unblocked:
            if dependent.agent and dependent.prompt and dependent.owner is None:
                dependent.owner = f"auto:{dependent.agent}"
                dependent.status = "in_progress"
                claimed.append(dependent)
        answer = {
            "status": "ok",
            "task_id": task_id,
            "newly_runnable": [
                {
                    "id": t.id,
                    "subject": t.subject,
                    "description": t.description,
                    "agent": t.agent,
                }
                for t in unblocked
            ],
        }
        return answer, claimed

    def _create(self, args: dict[str, Any]) -> dict[str, Any]:
        subject = args.get("subject")
        if not isinstance(subject, str) or not subject:
            return {"status": "error", "message": "'subject' is required"}
        agent = args.get("agent") if isinstance(args.get("agent"), str) else None
        prompt = args.get("prompt") if isinstance(args.get("prompt"), str) else None
        if agent and not prompt:
            return {"status": "error", "message": "'prompt' is required when 'agent' is set"}
        new_id = str(max((int(t) for t in self.tasks), default=0) + 1)
        task = _Task(
            new_id, subject, str(args.get("description") or ""), agent=agent, prompt=prompt
        )
        self.tasks[new_id] = task
        warnings = []
        raw = args.get("blocked_by")
        for blocker_id in [str(v) for v in raw] if isinstance(raw, list) else []:
            problem = self._depend(task, blocker_id)
            if problem:
                warnings.append(problem)
        answer: dict[str, Any] = {"status": "ok", "task_id": new_id}
        if agent:
            answer["auto_dispatch"] = True
        if warnings:
            answer["warnings"] = warnings
        return answer

    def _depend(self, task: _Task, blocker_id: str) -> str | None:
        if blocker_id == task.id:
            return "A task cannot depend on itself"
        blocker = self.tasks.get(blocker_id)
        if blocker is None:
            return f"Dependency task '{blocker_id}' does not exist"
        if self._reaches(blocker_id, task.id):
            return f"Adding dependency {task.id} -> {blocker_id} would create a cycle"
        if blocker_id not in task.blocked_by:
            task.blocked_by.append(blocker_id)
        task.status = "blocked"
        if task.id not in blocker.blocks:
            blocker.blocks.append(task.id)
        return None

    def _reaches(self, start: str, target: str) -> bool:
        """Whether ``start`` waits, directly or not, on ``target``."""
        seen: set[str] = set()
        stack = [start]
        while stack:
            current = stack.pop()
            if current == target:
                return True
            if current in seen or current not in self.tasks:
                continue
            seen.add(current)
            stack.extend(self.tasks[current].blocked_by)
        return False

    @staticmethod
    def _shown(task: _Task) -> dict[str, Any]:
        return {
            "id": task.id,
            "subject": task.subject,
            "status": task.status,
            "owner": task.owner,
            "blocked_by": list(task.blocked_by),
            "blocks": list(task.blocks),
            "agent": task.agent,
            "prompt": task.prompt,
        }


class Tasks:
    """The task functions of one visit; ``spawn`` starts a claimed task's agent."""

    def __init__(
        self,
        prior: tuple[Any, ...],
        node_id: str,
        visit: int,
        spawn: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> None:
        self.queue = TaskQueue(prior, node_id, visit)
        self.spawn = spawn

    def call(self, action: str, args: dict[str, Any], cancel: Any) -> dict[str, Any]:
        answer, claimed = self.queue.apply(action, args)
        spawned = [self.spawn({"agent": t.agent, "prompt": t.prompt}) for t in claimed]
        if spawned:
            answer["auto_dispatched"] = spawned
        return answer
