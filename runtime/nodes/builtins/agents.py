"""``agent__*``: sub-agents as Loki runs them, each a child run with its own log.

``agent__spawn`` records ``ChildRunStarted`` (durable before the child exists),
starts the child run linked to the parent and drives it on its own thread; it
answers at once with the child's id (``agent_<name>_<8 chars of the run id>``).
``agent__collect`` waits for it and records ``ChildRunFinished`` with its output.
The children are attached to the parent's child registry, so cancelling,
interrupting or timing out the parent reaches them.

After a crash the resumed visit serves recorded calls from the log and
re-attaches to what it started: a spawn whose child was recorded is not started
again, a child that finished is collected from its log (not re-run), and one
that had not finished is resumed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from graphrun.actors.base import CancelToken
from graphrun.eventstore.events import ChildCancelled, ChildRunFinished, ChildRunStarted, ToolCalled
from graphrun.eventstore.fold import fold
from graphrun.eventstore.ids import new_run_id
from graphrun.runtime.errors import ChildWaiting, GraphrunError
from graphrun.runtime.nodes.rag import knowledge_of

_PENDING = "pending"


class _ChildWaiting(ChildWaiting):
    """A collected child waits for a person: so does the parent's visit."""

    suspends_tool_loop = True


def agent_id(agent: str, child_run_id: str) -> str:
    return f"agent_{agent}_{child_run_id[-8:].lower()}"


@dataclass
class _Child:
    id: str
    agent: str
    run_id: str
    token: CancelToken = field(default_factory=CancelToken)
    thread: threading.Thread | None = None
    outcome: Any = None  # the child's RunOutcome once driven to an end
    failure: str | None = None
    collected: bool = False
    started: float = field(default_factory=time.monotonic)

    def finished(self, store: Any) -> bool:
        if self.thread is not None:
            return not self.thread.is_alive()
        return store.has_run(self.run_id) and fold(store.read(self.run_id)).terminal


class Supervisor:
    """The agent functions of one visit."""

    def __init__(
        self, ports: Any, ctx: Any, node_id: str, settings: Any, prior: tuple[Any, ...]
    ) -> None:
        self.ports = ports
        self.ctx = ctx
        self.node_id = node_id
        self.settings = settings
        self.children: dict[str, _Child] = {}
        self._claimed: set[str] = set()  # child run ids a recorded spawn answer names
        visit = ctx.visit
        for event in prior:
            if getattr(event, "node_id", None) != node_id or getattr(event, "visit", 0) != visit:
                continue
            if isinstance(event, ChildRunStarted):
                cid = agent_id(event.agent, event.child_run_id)
                self.children[cid] = _Child(cid, event.agent, event.child_run_id)
            elif isinstance(event, ChildRunFinished):
                done = next(
                    (c for c in self.children.values() if c.run_id == event.child_run_id), None
                )
                if done is not None:
                    done.collected = True
            elif isinstance(event, ToolCalled) and event.name == "agent__spawn":
                for child in self.children.values():
                    if child.id in event.result:
                        self._claimed.add(child.run_id)

    # --- the functions --------------------------------------------------------

    def call(self, action: str, args: dict[str, Any], cancel: CancelToken) -> dict[str, Any]:
        if not self.settings.can_spawn_agents:
            return {"status": "error", "message": "this agent cannot spawn agents"}
        if action == "spawn":
            return self._spawn(args)
        if action == "list_available":
            return self._available()
        if action == "list_running":
            running = [c for c in self.children.values() if not c.collected]
            return {
                "active_count": sum(1 for c in running if not c.finished(self.ports.store)),
                "max_concurrent": self.settings.max_concurrent_agents,
                "agents": [
                    {
                        "id": c.id,
                        "agent": c.agent,
                        "status": "finished" if c.finished(self.ports.store) else "running",
                    }
                    for c in running
                ],
            }
        wanted = str(args.get("id") or "")
        if not wanted:
            return {"status": "error", "message": "'id' is required"}
        child = self.children.get(wanted)
        if child is None or child.collected:
            return {"status": "error", "message": f"No agent found with id '{wanted}'"}
        if action == "check":
            if not child.finished(self.ports.store):
                return {"status": _PENDING, "id": wanted, "message": "Agent is still running"}
            return self._collect(child, cancel)
        if action == "collect":
            return self._collect(child, cancel)
        if action == "cancel":
            return self._cancel(child)
        return {"status": "error", "message": f"unknown agent function 'agent__{action}'"}

    def _available(self) -> dict[str, Any]:
        agents_dir = self.ports.options.agents_dir
        entries: list[dict[str, str]] = []
        if agents_dir is not None and agents_dir.is_dir():
            for path in sorted(agents_dir.iterdir()):
                if not self._permitted(path.name):
                    continue
                description = _description(path)
                if description is None:
                    continue
                entry = {"name": path.name}
                if description:
                    entry["description"] = description
                entries.append(entry)
        return {"count": len(entries), "agents": entries}

    def _permitted(self, name: str) -> bool:
        allowed = self.settings.spawnable_agents
        return allowed is None or name in allowed

    def _depth(self) -> int:
        depth, run_id = 0, self.ports.run_id
        store = self.ports.store
        while True:
            parent = store.run(run_id).parent_run_id
            if not parent:
                return depth
            depth, run_id = depth + 1, parent

    def _spawn(self, args: dict[str, Any]) -> dict[str, Any]:
        name = str(args.get("agent") or "")
        prompt = args.get("prompt")
        if not name or not isinstance(prompt, str):
            return {"status": "error", "message": "'agent' and 'prompt' are required"}
        if not self._permitted(name):
            allowed = list(self.settings.spawnable_agents or ())
            return {
                "status": "error",
                "message": f"Agent '{name}' is not in this agent's `spawnable_agents` "
                f"whitelist. Allowed: {allowed}. Call `agent__list_available` to see what "
                "you can spawn.",
            }
        store = self.ports.store
        # Started before a crash, but the answer was never recorded: the same child.
        for child in self.children.values():
            if child.agent == name and child.run_id not in self._claimed:
                recorded = next(
                    (
                        e
                        for e in self.ctx.prior
                        if isinstance(e, ChildRunStarted) and e.child_run_id == child.run_id
                    ),
                    None,
                )
                if recorded is not None and recorded.prompt == prompt:
                    self._claimed.add(child.run_id)
                    return self._spawned(child, prompt)
        active = [c for c in self.children.values() if not c.finished(store) and not c.collected]
        if len(active) >= self.settings.max_concurrent_agents:
            return {
                "status": "error",
                "message": f"At capacity: {len(active)}/{self.settings.max_concurrent_agents} "
                "agents running. Wait for one to finish or cancel one.",
            }
        depth = self._depth() + 1
        if depth > self.settings.max_agent_depth:
            return {
                "status": "error",
                "message": f"Max agent depth exceeded ({depth}/{self.settings.max_agent_depth})",
            }
        try:
            self._resolve(name)
        except GraphrunError as exc:
            return {"status": "error", "message": f"cannot spawn '{name}': {exc}"}
        run_id = new_run_id()
        self.ctx.record(
            ChildRunStarted(
                node_id=self.node_id,
                visit=self.ctx.visit,
                child_run_id=run_id,
                agent=name,
                prompt=prompt,
            )
        )
        checkpoint = getattr(self.ctx, "checkpoint", None)
        if checkpoint is not None:
            checkpoint()  # durable before the child exists
        child = _Child(agent_id(name, run_id), name, run_id)
        self.children[child.id] = child
        self._claimed.add(run_id)
        return self._spawned(child, prompt)

    def _resolve(self, name: str) -> Any:
        from graphrun.runtime.agents import load_agent, resolve_agent_dir

        options = self.ports.options
        ref = resolve_agent_dir(name, options.agents_dir)
        return load_agent(ref.path, config_dir=options.config_dir)

    def _spawned(self, child: _Child, prompt: str) -> dict[str, Any]:
        self._start(child, prompt)
        return {
            "status": "ok",
            "id": child.id,
            "agent": child.agent,
            "message": f"Agent '{child.agent}' spawned as '{child.id}' and is running in the "
            "background. Collect it (agent__collect) or cancel it (agent__cancel) before you "
            "end your turn.",
        }

    def _start(self, child: _Child, prompt: str) -> None:
        """Drive ``child`` (begun now, or resumed) on its own thread, through the
        run's child launcher (the engine's: it registers the child with the parent)."""
        from graphrun.runtime.graph.loader import graph_of
        from graphrun.runtime.graph.variables import resolve as resolve_variables
        from graphrun.runtime.graph.variables import with_variables

        ports = self.ports
        store = ports.store
        options = ports.options
        if store.has_run(child.run_id):
            knowledge = knowledge_of(graph_of(fold(store.read(child.run_id, upto=1))), options)
        else:
            loaded = self._resolve(child.agent)
            variables = resolve_variables(loaded)
            loaded = with_variables(loaded, variables)
            knowledge = knowledge_of(loaded, options)
            ports.launcher.start(
                loaded,
                prompt=prompt,
                node_id=self.node_id,
                run_id=child.run_id,
                variables=variables,
            )
        unhook = self.ctx.cancel.on_cancel(
            lambda: child.token.cancel(self.ctx.cancel.reason or "cancelled")
        )

        def run() -> None:
            try:
                child.outcome = ports.launcher.drive(child.run_id, knowledge, child.token)
            except Exception as exc:  # the child's own failure, told to the parent's model
                child.failure = f"{type(exc).__name__}: {exc}"
            finally:
                unhook()

        child.thread = threading.Thread(target=run, name=f"agent-{child.id}", daemon=True)
        child.thread.start()

    def _collect(self, child: _Child, cancel: CancelToken) -> dict[str, Any]:
        store = self.ports.store
        if child.thread is None and not child.finished(store):
            # A child a crashed visit started and never saw end: resume it.
            prompt = next(
                (
                    e.prompt
                    for e in self.ctx.prior
                    if isinstance(e, ChildRunStarted) and e.child_run_id == child.run_id
                ),
                "",
            )
            self._start(child, prompt)
        if child.thread is not None:
            while child.thread.is_alive():
                if cancel.cancelled:
                    return {"status": "error", "message": f"interrupted: {cancel.reason}"}
                child.thread.join(0.1)
        status, output, error = self._ended(child)
        if status == "waiting":
            waiting = child.outcome.waiting if child.outcome is not None else None
            raise _ChildWaiting(
                f"child run {child.run_id} ({child.id}) waits for an answer", waiting
            )
        duration = round((time.monotonic() - child.started) * 1000, 3)
        self.ctx.record(
            ChildRunFinished(
                node_id=self.node_id,
                visit=self.ctx.visit,
                child_run_id=child.run_id,
                status=status,
                output=output,
                error=error,
                duration_ms=duration,
            )
        )
        child.collected = True
        exit_status = "Completed" if status == "completed" else f"Failed({error or status})"
        return {
            "status": "completed",
            "id": child.id,
            "agent": child.agent,
            "exit_status": exit_status,
            "output": output or "",
        }

    def _ended(self, child: _Child) -> tuple[str, str | None, str | None]:
        """The child's status, output and error (from its outcome, else its log)."""
        if child.failure is not None:
            return "failed", None, child.failure
        outcome = child.outcome
        if outcome is not None:
            return outcome.status, outcome.output, outcome.error
        state = fold(self.ports.store.read(child.run_id))
        if not state.terminal:
            return "waiting" if state.waiting is not None else state.status, None, None
        return state.status, getattr(state, "output", None), getattr(state, "error", None)

    def _cancel(self, child: _Child) -> dict[str, Any]:
        reason = f"cancelled by agent__cancel in node '{self.node_id}'"
        child.token.cancel(reason)
        if child.thread is None and not child.finished(self.ports.store):
            # Started by a visit before a crash: driven once more, its token already
            # cancelled, so the child's own log records the cancellation.
            self._start(child, "")
        if child.thread is not None:
            child.thread.join(5.0)
        self.ctx.record(
            ChildRunFinished(
                node_id=self.node_id,
                visit=self.ctx.visit,
                child_run_id=child.run_id,
                status="cancelled",
                error=reason,
            ),
            ChildCancelled(child_run_id=child.run_id, reason=reason, node_id=self.node_id),
        )
        child.collected = True
        return {"status": "ok", "message": f"Cancelled agent '{child.agent}'."}

    def close(self) -> None:
        """Children never collected are cancelled when the visit ends (Loki abandons them)."""
        for child in self.children.values():
            if child.thread is not None and child.thread.is_alive():
                child.token.cancel(f"not collected before node '{self.node_id}' ended")
                child.thread.join(5.0)


def _description(path: Any) -> str | None:
    """An agent folder's description ("" when it has none); None when not an agent."""
    import yaml

    for name in ("config.yaml", "graph.yaml"):
        file = path / name
        if file.is_file():
            try:
                data = yaml.safe_load(file.read_text(encoding="utf-8"))
            except (OSError, yaml.YAMLError):
                return ""
            value = data.get("description") if isinstance(data, dict) else None
            return str(value) if value else ""
    return None
