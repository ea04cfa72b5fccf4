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

A spawned agent's ``user__*`` question does not reach a person: the child run
waits, and its question is an *escalation* the parent's model sees as
``pending_escalations`` (in ``agent__check``/``agent__collect`` and the next tool
result) and answers with ``agent__reply_escalation``, which records the answer in
the child's log (``HumanInputReceived``, channel ``agent``) and drives the child
on. A child's output of ``summarization_threshold`` characters or more is
summarised by a model call of its own (``LlmCalled``, purpose ``summarize``)
before ``agent__collect`` hands it over; the full output stays in
``ChildRunFinished``.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from graphrun.actors.base import CancelToken
from graphrun.eventstore.events import (
    ChildCancelled,
    ChildRunFinished,
    ChildRunStarted,
    HumanInputReceived,
    HumanInputRequested,
    LlmCalled,
    LlmContinued,
    ToolCalled,
)
from graphrun.eventstore.fold import fold
from graphrun.eventstore.ids import new_run_id
from graphrun.runtime.errors import ChildWaiting, GraphrunError
from graphrun.runtime.nodes.rag import knowledge_of

_PENDING = "pending"


#: Loki's guardrail: how many times a model that ends its turn with spawned agents
#: still running is sent back, before they are cancelled.
GUARDRAIL_MAX = 3

SUMMARY_SYSTEM = """You condense the output of a sub-agent for the agent that delegated
to it. Keep every file path, code snippet, error message, number and concrete
recommendation; drop filler and thinking aloud. Lead with the answer or conclusion
if there is one, use bullet points for several findings, and keep the summary well
under a third of the original length."""


class _ChildWaiting(ChildWaiting):
    """A collected child waits for a person: so does the parent's visit."""

    suspends_tool_loop = True


def agent_id(agent: str, child_run_id: str) -> str:
    return f"agent_{agent}_{child_run_id[-8:].lower()}"


def escalation_id(child_run_id: str, seq: int) -> str:
    """A child's question as the parent's model names it (its run and the seq of
    its ``HumanInputRequested``)."""
    return f"esc_{child_run_id[-8:].lower()}_{seq}"


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
        self.guardrail = 0  # times the model was sent back since an agent was reclaimed
        self.clients: Any = None  # the llm node's client factory (summaries)
        visit = ctx.visit
        self.summaries = len(
            {
                e.iteration
                for e in prior
                if isinstance(e, LlmCalled)
                and e.purpose == "summarize"
                and e.node_id == node_id
                and e.visit == visit
            }
        )
        for event in prior:
            if getattr(event, "node_id", None) != node_id or getattr(event, "visit", 0) != visit:
                continue
            if isinstance(event, LlmContinued) and event.reason == "pending_agents":
                self.guardrail = event.count
            elif isinstance(event, ToolCalled) and event.name in (
                "agent__collect",
                "agent__cancel",
            ):
                self.guardrail = 0
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
        if action == "reply_escalation":
            return self._reply(args)
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
            pending = self.escalations()
            if not child.finished(self.ports.store) or self._asking(child) is not None:
                answer: dict[str, Any] = {
                    "status": _PENDING,
                    "id": wanted,
                    "message": "Agent is still running",
                }
                if pending:
                    answer["message"] = (
                        "Agent is still running. Child agents have pending escalations that "
                        "need your reply via agent__reply_escalation."
                    )
                    answer["pending_escalations"] = pending
                return answer
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
        while True:
            if child.thread is not None and child.thread.is_alive():
                if cancel.cancelled:
                    return {"status": "error", "message": f"interrupted: {cancel.reason}"}
                child.thread.join(0.1)
            pending = self.escalations()
            if pending:
                return {
                    "status": _PENDING,
                    "id": child.id,
                    "message": f"Agent '{child.id}' is still running, but child agents have "
                    "pending escalations that need your reply. Reply via "
                    "agent__reply_escalation, then call agent__collect again.",
                    "pending_escalations": pending,
                }
            if child.thread is None or not child.thread.is_alive():
                break
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
        self.reclaimed()
        exit_status = "Completed" if status == "completed" else f"Failed({error or status})"
        answer = {
            "status": "completed",
            "id": child.id,
            "agent": child.agent,
            "exit_status": exit_status,
            "output": output or "",
        }
        if output and len(output) >= self.settings.summarization_threshold > 0:
            summary, problem = self._summarize(child.agent, output)
            if summary is not None:
                answer["output"] = summary
            else:
                answer["summary_error"] = problem or "no summary"
        return answer

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
        asking = self._asking(child) is not None
        child.token.cancel(reason)
        if asking or (child.thread is None and not child.finished(self.ports.store)):
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
        self.reclaimed()
        return {"status": "ok", "message": f"Cancelled agent '{child.agent}'."}

    # --- escalations: a spawned agent's question, answered by this model -------

    def _asking(self, child: _Child) -> Any:
        """The question ``child`` waits on, when it is one for this model: a
        ``user__*`` call of an llm node (an input or approval node of a graph agent
        waits for a person, as a child of an ``agent`` node does)."""
        if child.collected or (child.thread is not None and child.thread.is_alive()):
            return None
        store = self.ports.store
        if not store.has_run(child.run_id):
            return None
        state = fold(store.read(child.run_id))
        request = state.waiting
        if state.terminal or request is None:
            return None
        from graphrun.runtime.graph.loader import graph_of

        node = graph_of(state).graph.nodes.get(request.node_id)
        return request if getattr(node, "type", None) == "llm" else None

    def escalations(self) -> list[dict[str, Any]]:
        """The questions of this visit's children waiting for this model's reply."""
        pending = []
        for child in self.children.values():
            request = self._asking(child)
            if request is None:
                continue
            entry: dict[str, Any] = {
                "escalation_id": escalation_id(child.run_id, request.seq),
                "from_agent_id": child.id,
                "from_agent_name": child.agent,
                "question": f"[{request.kind}] {request.question}",
            }
            if request.options:
                entry["options"] = list(request.options)
            pending.append(entry)
        return pending

    def _reply(self, args: dict[str, Any]) -> dict[str, Any]:
        wanted = str(args.get("escalation_id") or "")
        reply = args.get("reply")
        if not wanted or not isinstance(reply, str):
            return {"status": "error", "message": "'escalation_id' and 'reply' are required"}
        for child in self.children.values():
            if child.collected or not wanted.startswith(escalation_id(child.run_id, 0)[:-1]):
                continue
            store = self.ports.store
            events = store.read(child.run_id) if store.has_run(child.run_id) else []
            request = next(
                (
                    e
                    for e in events
                    if isinstance(e, HumanInputRequested)
                    and escalation_id(child.run_id, e.seq) == wanted
                ),
                None,
            )
            if request is None:
                break
            answered = next(
                (
                    e
                    for e in events
                    if isinstance(e, HumanInputReceived)
                    and e.seq > request.seq
                    and e.node_id == request.node_id
                ),
                None,
            )
            if answered is None:
                if self._asking(child) is None:
                    break
                try:
                    self._answer(child, request, reply)
                except GraphrunError as exc:
                    return {"status": "error", "message": f"the reply was refused: {exc}"}
            if child.thread is None or not child.thread.is_alive():
                self._start(child, "")  # on with the answer
            return {
                "status": "ok",
                "message": f"Reply sent to agent '{child.agent}' for escalation '{wanted}'",
                "original_question": f"[{request.kind}] {request.question}",
            }
        return {
            "status": "error",
            "message": f"No pending escalation found with id '{wanted}'. It may have already "
            "been replied to.",
        }

    def _answer(self, child: _Child, request: HumanInputRequested, reply: str) -> None:
        """Record this model's ``reply`` in the child's log, as the answer to the
        ``user__*`` question it waits on (an llm node's: no approvers, no signatures)."""
        from graphrun.actors.human.prompt import identity

        store = self.ports.store
        event = identity(f"agent:{self.ports.graph.name}").answered(request, reply, "agent")
        with store.leased(child.run_id):
            waiting = fold(store.read(child.run_id)).waiting
            if waiting is None or waiting.seq != request.seq:
                raise GraphrunError(f"run {child.run_id} no longer waits for this question")
            store.append(child.run_id, [event], sync=True)

    # --- the guardrail: agents still running when the model ends its turn ------

    def running(self) -> list[str]:
        """The ids of spawned agents neither finished nor reclaimed (a child waiting
        for this model's reply counts as running, as in Loki)."""
        store = self.ports.store
        return [
            c.id
            for c in self.children.values()
            if not c.collected and (not c.finished(store) or self._asking(c) is not None)
        ]

    def reclaimed(self) -> None:
        """An agent was collected or cancelled: the guardrail starts counting again."""
        self.guardrail = 0

    def cancel_running(self) -> list[str]:
        """Cancel every agent still running (the guardrail gave up); their ids."""
        ids = self.running()
        for wanted in ids:
            self._cancel(self.children[wanted])
        return ids

    def guardrail_prompt(self, ids: list[str]) -> str:
        listed = "\n".join(f"- {i}" for i in ids)
        prompt = (
            f"[guardrail] You ended your turn while {len(ids)} agent(s) you spawned are still "
            f"running:\n{listed}\n\nThey are abandoned if your turn ends now. Reclaim each "
            "one first: agent__collect (waits for it and returns its output) or agent__cancel "
            "(discards it). They do not report back on their own."
        )
        pending = self.escalations()
        if pending:
            prompt += (
                "\n\nSome of them are blocked on a question for you: reply to each with "
                "agent__reply_escalation first:\n" + json.dumps(pending, ensure_ascii=False)
            )
        return prompt

    # --- summarising a long output --------------------------------------------

    def _summarize(self, agent: str, output: str) -> tuple[str | None, str | None]:
        """A model's summary of ``output`` (recorded as ``LlmCalled``, purpose
        ``summarize``), or why there is none."""
        clients = getattr(self, "clients", None)
        if clients is None:
            return None, "no model to summarise with"
        from graphrun.actors.llm.call import LlmTask, perform_side_call

        node = self.ports.graph.nodes.get(self.node_id)
        model = (
            self.settings.summarization_model
            or getattr(node, "model", None)
            or self.ports.graph.model
            or ""
        )
        task = LlmTask(
            node_id=self.node_id,
            visit=self.ctx.visit,
            model=model,
            system=SUMMARY_SYSTEM,
            prompt=f"Summarize the following sub-agent output from '{agent}':\n\n{output}",
        )
        self.summaries += 1
        return perform_side_call(
            task, self.ctx, client_factory=clients, purpose="summarize", iteration=self.summaries
        )

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
