"""The tools of one ``llm`` visit: the node's own, plus the built-in functions it names."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from graphrun.actors.base import CancelToken
from graphrun.actors.llm.providers.base import ToolResult, ToolSpec
from graphrun.actors.tools.builtin_specs import builtin_specs, known, result
from graphrun.eventstore.events import LlmContinued, ToolCalled

ESCALATION_INSTRUCTION = (
    "Child agents are blocked waiting for your reply. Call agent__reply_escalation for "
    "each pending escalation to unblock them."
)


class BuiltinToolbox:
    """One visit's tools: ``inner`` (the node's own) and the built-ins it names.

    Made per visit (the built-ins record into the visit's context); ``close`` ends
    what the visit left running (children never collected are cancelled, as
    Loki abandons them). :meth:`continuation` says whether a model that ended its
    turn is prompted again.
    """

    def __init__(
        self,
        inner: Any,
        names: Sequence[str],
        *,
        ports: Any,
        ctx: Any,
        node_id: str,
        clients: Any = None,
        grant: Any = None,
    ) -> None:
        from graphrun.runtime.graph.builtins import node_skills, settings_for
        from graphrun.runtime.nodes.builtins.agents import Supervisor
        from graphrun.runtime.nodes.builtins.inbox import Inbox
        from graphrun.runtime.nodes.builtins.skills import Skills
        from graphrun.runtime.nodes.builtins.tasks import Tasks
        from graphrun.runtime.nodes.builtins.todo import Todos
        from graphrun.runtime.nodes.builtins.user import UserQuestions

        self.inner = inner
        self.names = [n for n in names if known(n)]
        # The agent's own tools first, then Loki's built-ins, in Loki's order.
        self.own: list[ToolSpec] = list(inner.specs if inner is not None else []) + (
            builtin_specs(self.names)
        )
        # ``grant(names)``: the toolbox of the tools loaded skills grant (or raises).
        self.grant = grant
        self._granted: Any = None
        settings = settings_for(ports.agent_dir)
        node = ports.graph.nodes.get(node_id)
        enabled, chosen = node_skills(ports.graph, node)
        if enabled:  # a graph's llm node with Loki's skills settings
            settings = replace(settings, skills_enabled=True, enabled_skills=chosen)
        self.settings = settings
        self.ports = ports
        prior = tuple(getattr(ctx, "prior", ()) or ())
        self.agents = Supervisor(ports, ctx, node_id, settings, prior)
        self.agents.clients = clients
        self.inbox = Inbox(ports, ctx, node_id, self.agents)
        self.tasks = Tasks(prior, node_id, ctx.visit, self._dispatch)
        self.user = UserQuestions(ports, ctx, node_id, prior)
        self.todos = Todos(prior, node_id)
        self.skills = Skills(ports, settings, prior, node_id)
        self._notified: set[str] = set()  # escalation ids the model was told about
        # Loki's auto-continue count: since the visit began or the list was cleared.
        self.continued = 0
        for event in prior:
            if getattr(event, "node_id", None) != node_id or getattr(event, "visit", 0) != (
                ctx.visit
            ):
                continue
            if isinstance(event, LlmContinued) and event.reason == "todos":
                self.continued = event.count
            elif isinstance(event, ToolCalled) and event.name == "todo__clear":
                self.continued = 0
        self._prepare_granted()

    def _prepare_granted(self) -> None:
        """Load the toolbox the loaded skills grant now, off the run's loop (the box is
        made on its executor; loading may wait for an MCP server), so that
        :attr:`specs`, read on the loop, finds it made. A failure is raised again
        where the box is used."""
        from graphrun.actors.tools.base import ToolError

        with contextlib.suppress(ToolError):
            self._granted_box()

    @property
    def specs(self) -> list[ToolSpec]:
        """The tools offered on the next turn: the node's, then those the loaded
        skills grant (Loki's ``enabled_tools`` of a skill) that it lacks."""
        granted = self._granted_box()
        if granted is None:
            return list(self.own)
        have = {spec.name for spec in self.own}
        return self.own + [spec for spec in granted.specs if spec.name not in have]

    def _granted_names(self) -> tuple[str, ...]:
        """The tools the loaded skills grant beyond the node's own (none when no
        grant can be made)."""
        if self.grant is None:
            return ()
        return tuple(n for n in self.skills.granted() if n not in {s.name for s in self.own})

    def _granted_box(self) -> Any:
        names = self._granted_names()
        if not names:
            return None
        if self._granted is None or self._granted[0] != names:
            self._granted = (names, self.grant(names))
        return self._granted[1]

    def _dispatch(self, args: dict[str, Any]) -> dict[str, Any]:
        return self.agents.call("spawn", args, CancelToken())

    def _box_of(self, name: str) -> Any:
        """The toolbox of the node's own or a loaded skill's tool ``name``, if the
        tools the skills grant are made already (else None: :meth:`call` makes them)."""
        if name in self.names:
            return None
        names = self._granted_names()
        granted = None
        if names:
            if self._granted is None or self._granted[0] != names:
                return None
            granted = self._granted[1]
        if granted is not None and name in {spec.name for spec in granted.specs}:
            return granted
        return self.inner

    async def call_async(
        self,
        name: str,
        arguments: str,
        *,
        cancel: CancelToken,
        timeout: float | None = None,
        executor: Any = None,
    ) -> ToolResult:
        """:meth:`call` on the run's loop: a tool of the node's own or a skill's grant
        is awaited as its toolbox awaits it (an MCP call on the loop, a process
        watched from it); Loki's built-ins, which block (they record, drive child
        runs, ask a person), run on ``executor``."""
        import asyncio
        import functools

        loop = asyncio.get_running_loop()
        box = self._box_of(name)
        if getattr(box, "call_async", None) is None:
            whole = functools.partial(self.call, name, arguments, cancel=cancel)
            done: ToolResult = await loop.run_in_executor(executor, whole)
            return done
        done = await box.call_async(
            name, arguments, cancel=cancel, timeout=timeout, executor=executor
        )
        if not self.agents.children:
            return done
        notified: ToolResult = await loop.run_in_executor(executor, self._notify, done)
        return notified

    def call(self, name: str, arguments: str, *, cancel: CancelToken) -> ToolResult:
        if name not in self.names:
            granted = self._granted_box()
            if granted is not None and name in {spec.name for spec in granted.specs}:
                return self._notify(granted.call(name, arguments, cancel=cancel))
            if self.inner is None:
                return ToolResult(f"unknown tool '{name}'", True, 0.0, "")
            return self._notify(self.inner.call(name, arguments, cancel=cancel))
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
        if group == "agent" and action in ("send_message", "check_inbox"):
            handler = self.inbox  # every agent's, spawning or not
        elif group == "agent" and action.startswith("task_"):
            if not self.settings.can_spawn_agents:
                handler = self.agents  # refuses: this agent cannot spawn agents
            else:
                handler = self.tasks
        if group == "todo" and action == "clear":
            self.continued = 0
        value = handler.call(action, args, cancel)
        if action in ("collect", "cancel") and group == "agent":
            self.agents.reclaimed()
        failed = "error" in value or value.get("status") == "error"
        # A loaded skill's body goes into the system prompt, not into the result;
        # the tools it grants are offered from the next turn on.
        loaded = value.pop("instructions", None) if group == "skill" else None
        tools = tuple(value.pop("tools", ())) if group == "skill" else ()
        if isinstance(loaded, str) and tools:
            problem = self._offer(str(args.get("name") or ""), tools)
            if problem is not None:
                return self._notify(result({"error": problem}, started=started, error=True))
        if group == "skill":
            self._prepare_granted()  # what the skills loaded now grant (made, or cached)
        done = result(value, started=started, error=failed)
        if isinstance(loaded, str):
            done = replace(done, instructions=loaded, tools=tools)
        return self._notify(done)

    def _offer(self, skill: str, tools: tuple[str, ...]) -> str | None:
        """Make the tools a skill grants callable; why not (the load is taken back)."""
        from graphrun.actors.tools.base import ToolError

        if self.grant is None:
            self.skills.forget(skill)
            return f"Skill '{skill}' grants tools ({', '.join(tools)}), which this node cannot run"
        try:
            self._granted_box()
        except ToolError as err:
            self.skills.forget(skill)
            self._granted = None
            return f"Loaded skill '{skill}' but failed to offer the tools it grants: {err}"
        return None

    def instructions(self) -> str:
        """What this visit's calls put into the system prompt so far (Loki's loaded
        skills, in the order loaded)."""
        return self.skills.instructions()

    def _notify(self, done: ToolResult) -> ToolResult:
        """Loki's escalation notice: a tool result after a spawned agent began waiting
        for this model's reply carries the pending questions (once per question)."""
        if not self.agents.children:
            return done
        pending = [e for e in self.agents.escalations() if e["escalation_id"] not in self._notified]
        if not pending:
            return done
        self._notified.update(e["escalation_id"] for e in pending)
        try:
            value = json.loads(done.output)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            value = {"output": done.output}
        value.setdefault("pending_escalations", pending)
        value["escalation_instruction"] = ESCALATION_INSTRUCTION
        return replace(done, output=json.dumps(value, ensure_ascii=False))

    def continuation(self, text: str) -> tuple[str, str, int] | None:
        """Whether the model, which ended its turn with ``text``, is prompted again:
        ``(reason, prompt, count)``. First Loki's guardrail (spawned agents still
        running: sent back up to three times, then they are cancelled), then its
        ``auto_continue`` (todos still open, at most ``max_auto_continues`` times, in
        a run that is not itself a spawned agent's)."""
        from graphrun.runtime.nodes.builtins.agents import GUARDRAIL_MAX

        running = self.agents.running()
        if running:
            if self.agents.guardrail >= GUARDRAIL_MAX:
                import sys

                cancelled = self.agents.cancel_running()
                print(
                    f"warning: node '{self.agents.node_id}': the model ended its turn "
                    f"{GUARDRAIL_MAX + 1} times with agents still running; cancelled "
                    f"{', '.join(cancelled)}",
                    file=sys.stderr,
                )
                self.agents.reclaimed()
            else:
                self.agents.guardrail += 1
                prompt = self.agents.guardrail_prompt(running)
                return "pending_agents", prompt, self.agents.guardrail
        else:
            self.agents.reclaimed()
        settings = self.settings
        todos = self.todos.list
        if (
            not settings.todo
            or self.continued >= settings.max_auto_continues
            or not any(not t["done"] for t in todos.todos)
            or self.ports.store.run(self.ports.run_id).parent_run_id
        ):
            return None
        from graphrun.runtime.graph.builtins import CONTINUATION_PROMPT

        self.continued += 1
        prompt = f"{settings.continuation_prompt or CONTINUATION_PROMPT}\n\n{todos.render()}"
        return "todos", prompt, self.continued

    def close(self) -> None:
        self.agents.close()
