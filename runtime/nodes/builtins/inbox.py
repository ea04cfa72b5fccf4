"""``agent__send_message`` / ``agent__check_inbox``: messages between agents.

An agent leaves a message for an agent it spawned, or for one its own parent
spawned next to it (a sibling), by id. The message is the sender's recorded call
(``ToolCalled`` in the sender's log): nothing else is written. ``check_inbox``
reads the calls addressed to this agent from its parent's log and its siblings'
logs, in the order they were made, and hands over those it has not handed over
before (its own recorded ``check_inbox`` results say how many); what it returns
is recorded in its own log, so a replay serves the same messages.
"""

from __future__ import annotations

import json
from typing import Any

from graphrun.eventstore.events import ChildRunFinished, ChildRunStarted, ToolCalled

SEND = "agent__send_message"
CHECK = "agent__check_inbox"


class Inbox:
    """The teammate functions of one visit."""

    def __init__(self, ports: Any, ctx: Any, node_id: str, supervisor: Any) -> None:
        self.ports = ports
        self.ctx = ctx
        self.node_id = node_id
        self.supervisor = supervisor
        self._me: tuple[str | None, str | None] | None = None

    def _self(self) -> tuple[str | None, str | None]:
        """This run's agent id (as its parent's model knows it) and its parent run."""
        if self._me is None:
            from graphrun.runtime.nodes.builtins.agents import agent_id

            store = self.ports.store
            parent = store.run(self.ports.run_id).parent_run_id
            mine = None
            if parent:
                started = next(
                    (
                        e
                        for e in store.read(parent)
                        if isinstance(e, ChildRunStarted) and e.child_run_id == self.ports.run_id
                    ),
                    None,
                )
                if started is not None:
                    mine = agent_id(started.agent, started.child_run_id)
            self._me = (mine, parent)
        return self._me

    def _siblings(self, parent: str) -> dict[str, str]:
        """The parent's spawned agents still running: agent id -> run id."""
        from graphrun.runtime.nodes.builtins.agents import agent_id

        ended = set()
        started: dict[str, str] = {}
        for event in self.ports.store.read(parent):
            if isinstance(event, ChildRunStarted):
                started[agent_id(event.agent, event.child_run_id)] = event.child_run_id
            elif isinstance(event, ChildRunFinished):
                ended.add(event.child_run_id)
        return {k: v for k, v in started.items() if v not in ended}

    def call(self, action: str, args: dict[str, Any], cancel: Any) -> dict[str, Any]:
        if action == "send_message":
            return self._send(args)
        if action == "check_inbox":
            return self._check()
        return {"status": "error", "message": f"unknown function 'agent__{action}'"}

    def _send(self, args: dict[str, Any]) -> dict[str, Any]:
        target = str(args.get("id") or "")
        message = args.get("message")
        if not target or not isinstance(message, str):
            return {"status": "error", "message": "'id' and 'message' are required"}
        store = self.ports.store
        child = self.supervisor.children.get(target)
        known = child is not None and not child.collected and not child.finished(store)
        if not known:
            me, parent = self._self()
            known = parent is not None and target != me and target in self._siblings(parent)
        if not known:
            return {
                "status": "error",
                "message": f"No agent found with id '{target}'. Agent may not exist or may "
                "have already completed.",
            }
        return {"status": "ok", "message": f"Message delivered to agent '{target}'"}

    def _check(self) -> dict[str, Any]:
        me, parent = self._self()
        if me is None or parent is None:
            return {"messages": [], "count": 0}
        store = self.ports.store
        sent: list[tuple[float, str, int, dict[str, Any]]] = []
        runs = {parent: "parent", **{run: aid for aid, run in self._siblings(parent).items()}}
        for run_id, sender in runs.items():
            if run_id == self.ports.run_id or not store.has_run(run_id):
                continue
            for event in store.read(run_id):
                if not isinstance(event, ToolCalled) or event.name != SEND or event.is_error:
                    continue
                try:
                    args = json.loads(event.arguments or "{}")
                except ValueError:
                    continue
                if isinstance(args, dict) and args.get("id") == me:
                    payload = {"type": "text", "content": str(args.get("message") or "")}
                    sent.append((event.ts, run_id, event.seq, {"from": sender, "payload": payload}))
        sent.sort(key=lambda m: m[:3])
        handed = 0
        for event in store.read(self.ports.run_id):
            if isinstance(event, ToolCalled) and event.name == CHECK and not event.is_error:
                try:
                    handed += int(json.loads(event.result).get("count") or 0)
                except (ValueError, AttributeError, TypeError):
                    continue
        fresh = [m[3] for m in sent[handed:]]
        return {"messages": fresh, "count": len(fresh)}
