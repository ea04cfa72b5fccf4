"""The tools of one ``llm`` visit: the node's own, plus the built-in functions it names."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from graphrun.actors.base import CancelToken
from graphrun.actors.llm.providers.base import ToolResult, ToolSpec
from graphrun.actors.tools.builtin_specs import builtin_specs, known, result


class BuiltinToolbox:
    """One visit's tools: ``inner`` (the node's own) and the built-ins it names.

    Made per visit (the built-ins record into the visit's context); ``close`` ends
    what the visit left running (children never collected are cancelled, as
    Loki abandons them).
    """

    def __init__(
        self, inner: Any, names: Sequence[str], *, ports: Any, ctx: Any, node_id: str
    ) -> None:
        from graphrun.runtime.graph.builtins import node_skills, settings_for
        from graphrun.runtime.nodes.builtins.agents import Supervisor
        from graphrun.runtime.nodes.builtins.skills import Skills
        from graphrun.runtime.nodes.builtins.todo import Todos
        from graphrun.runtime.nodes.builtins.user import UserQuestions

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
