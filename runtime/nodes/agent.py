"""``agent`` nodes: a child run per visit, with its own log linked to the parent.

The child (a graph agent, or an LLM-loop agent run as a graph) gets the node's
rendered prompt as its ``{{initial_prompt}}``. ``ChildRunStarted`` is committed
before the child starts, so a parent resumed after a crash re-attaches to the same
child (and resumes it) instead of starting another. The node's ``timeout``
(default 300 s) cancels the child and fails the graph; any way the parent ends
cancels children still running (the supervisor's policy).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

from graphrun.actors.base import CancelToken
from graphrun.actors.messages import AgentTask
from graphrun.actors.paths import outside_hint, outside_problem, real_path
from graphrun.eventstore.events import (
    ChildCancelled,
    ChildRunFinished,
    ChildRunStarted,
    LlmResult,
)
from graphrun.eventstore.fold import RunState, fold
from graphrun.eventstore.ids import new_run_id
from graphrun.runtime.agents import is_agent_path
from graphrun.runtime.errors import ChildWaiting, GraphrunError
from graphrun.runtime.graph.check import did_you_mean, node_path
from graphrun.runtime.graph.expressions import ExpressionError
from graphrun.runtime.graph.loader import graph_of
from graphrun.runtime.graph.model import ErrorRoute, Graph, Guard, NodeBase, RetryPolicy, Route
from graphrun.runtime.graph.routing import error_route, pick_route
from graphrun.runtime.graph.templates import render, render_updates
from graphrun.runtime.nodes.error_kinds import kind_of_result
from graphrun.runtime.nodes.kind import NodeKind
from graphrun.runtime.nodes.plan import (
    Append,
    Perform,
    Step,
    completed,
    fail,
    last,
    tolerated,
)
from graphrun.runtime.nodes.rag import knowledge_of

if TYPE_CHECKING:
    from graphrun.eventstore.events import Event
    from graphrun.runtime.nodes.ports import RunPorts


class AgentNode(NodeBase, tag="agent", kw_only=True):
    routes: list[Route] = msgspec.field(default_factory=list)
    on_error: list[ErrorRoute] = msgspec.field(default_factory=list)
    retry: RetryPolicy | None = None
    guard: Guard | None = None
    agent: str
    prompt: str
    timeout: float = 300.0
    output_schema: dict[str, Any] | None = None

    DESCRIPTIONS: ClassVar[dict[str | None, str]] = {
        None: "Spawns a child agent (graph or LLM loop) and waits for its final text.",
        "agent": "The child agent's name in the agents directory (required).",
        "prompt": "The child's prompt (its {{initial_prompt}}); templated, strict.",
        "timeout": "Wall-clock cap on the child run, in seconds (default 300); exceeding "
        "it fails the graph.",
        "next": "Where to go when the child finishes (required).",
        "state_updates": "Map of state key -> template; {{output}} is the child's final "
        "text (or its parsed value with output_schema).",
        "output_schema": "A JSON Schema: the child's final text is extracted to a value; "
        "an object's keys merge into state. No schema hint is sent to the child.",
    }
    NEEDS_NEXT: ClassVar[bool] = True
    SPAWNS_AGENTS: ClassVar[bool] = True
    SCOPED: ClassVar[str] = "output"

    def strict_fields(self) -> list[tuple[str, object]]:
        return [("prompt", self.prompt)]

    def rules(self, node_id: str, check: Any) -> list[Any]:
        return super().rules(node_id, check) + self._agent_rules(node_id, check)

    def _agent_rules(self, nid: str, c: Any) -> list[Any]:
        """The child agent exists: in the agents directory, or a path from the graph's
        folder that stays inside it."""
        where = node_path(nid, "agent")
        path_like = is_agent_path(self.agent)
        if path_like:  # a path from the graph's folder: the rule the run applies
            outside = outside_problem(c.loaded.agent_dir, self.agent, what=f"agent '{self.agent}'")
            if outside is not None:
                return [
                    c.diag(
                        "error",
                        "agent-outside",
                        outside,
                        where,
                        node=nid,
                        hint="name an agent in the agents directory, or " + outside_hint(),
                    )
                ]
        if c.agents_dir is None:
            return []
        adir = c.agents_dir / self.agent
        if path_like:
            adir = Path(real_path(c.loaded.agent_dir, self.agent))
        if not adir.is_dir():
            known = (
                sorted(p.name for p in c.agents_dir.iterdir() if p.is_dir())
                if c.agents_dir.is_dir()
                else []
            )
            return [
                c.diag(
                    "error",
                    "unknown-agent",
                    f"agent node '{nid}': no agent '{self.agent}' in {c.agents_dir}",
                    where,
                    node=nid,
                    hint=did_you_mean(self.agent, known) or "set --agents-dir",
                )
            ]
        if not (adir / "graph.yaml").exists() and not (adir / "config.yaml").exists():
            return [
                c.diag(
                    "error",
                    "agent-without-definition",
                    f"agent node '{nid}': {adir} has neither config.yaml nor graph.yaml",
                    where,
                    node=nid,
                )
            ]
        return []


class _Scope:
    """What stops a visit's child run: its token fires with the visit's, and at the
    node's ``timeout`` (a timer of the run's loop). Time a person is asked in the
    child (``person``: its driver's :class:`~graphrun.runtime.engine.driver.PersonTime`)
    does not count: the timeout moves on by it."""

    def __init__(self, task: Any, ctx: Any, loop: Any) -> None:
        self.token = CancelToken()
        self.person: Any = None
        self._loop = loop
        self._reason = _timed_out(task)
        self._credited = 0.0  # person time the timeout has already moved on by
        token = self.token
        self._unhook = ctx.cancel.on_cancel(lambda: token.cancel(ctx.cancel.reason or "cancelled"))
        self._timer = loop.call_later(task.timeout, self._expire)

    def _expire(self) -> None:
        person = self.person
        if person is not None:
            asked = person.total() - self._credited
            if asked > 0 or person.now:
                self._credited += asked
                self._timer = self._loop.call_later(max(asked, _ASKED_AGAIN), self._expire)
                return
        self.token.cancel(self._reason)

    def release(self) -> None:
        self._timer.cancel()
        self._unhook()


#: How soon a timeout that came while a person is asked looks again.
_ASKED_AGAIN = 0.5


class AgentActor:
    """The ``agent`` node actor."""

    node_type = "agent"

    def __init__(self, ports: RunPorts) -> None:
        self.ports = ports

    async def run(self, task: Any, ctx: Any) -> None:
        """One visit, awaited on the run's loop: starting the child (its graph loaded,
        ``ChildRunStarted`` committed) and recording how it ended block, so they go
        to the run's executor; the child itself is driven by a supervisor of its
        own while this awaits its outcome, holding no thread."""
        import asyncio

        from graphrun.actors.loop import blocking

        child_id, knowledge, started = await blocking(ctx, self._begin, task, ctx)
        scope = _Scope(task, ctx, asyncio.get_running_loop())
        token = scope.token
        try:
            launcher = self.ports.launcher
            child = await blocking(ctx, launcher.driver, child_id, knowledge, token)
            scope.person = getattr(child, "person", None)
            outcome = await launcher.drive_async(child, token)
        finally:
            scope.release()
        await blocking(ctx, self._conclude, task, ctx, child_id, outcome, token, started)

    def _begin(self, task: Any, ctx: Any) -> tuple[str, dict[str, Any] | None, float]:
        """The visit's child run, started (or, on a resume, the one it had started):
        its id, its knowledge bases and when the visit began."""
        from graphrun.runtime.agents import load_agent, resolve_agent_dir
        from graphrun.runtime.graph.variables import resolve as resolve_variables
        from graphrun.runtime.graph.variables import with_variables

        parent = self.ports
        store = parent.store
        options = parent.options
        started = time.monotonic()
        existing = next(
            (
                e
                for e in reversed(ctx.prior)
                if isinstance(e, ChildRunStarted) and e.visit == task.visit
            ),
            None,
        )
        if existing is not None and store.has_run(existing.child_run_id):
            # Resumed: re-attach to the child this visit already started.
            child_id = existing.child_run_id
            knowledge = knowledge_of(graph_of(fold(store.read(child_id, upto=1))), options)
            return child_id, knowledge, started
        ref = resolve_agent_dir(task.agent, options.agents_dir, graph_dir=parent.agent_dir)
        loaded = load_agent(ref.path, config_dir=options.config_dir)
        if loaded.graph.settings.validate_before_run:
            parent.launcher.check(loaded)
        # Its own variables: not the parent's presets, and no prompt (Loki).
        variables = resolve_variables(loaded)
        loaded = with_variables(loaded, variables)
        knowledge = knowledge_of(loaded, options)
        if existing is not None:  # recorded, but the process died before the child began
            child_id = existing.child_run_id
        else:
            child_id = new_run_id()
            # Durable before the child exists, so a resumed parent finds its child.
            ctx.record(
                ChildRunStarted(
                    node_id=task.node_id,
                    visit=task.visit,
                    child_run_id=child_id,
                    agent=task.agent,
                    prompt=task.prompt,
                )
            )
            checkpoint = getattr(ctx, "checkpoint", None)
            if checkpoint is not None:
                checkpoint()
        parent.launcher.start(
            loaded,
            prompt=task.prompt,
            node_id=task.node_id,
            run_id=child_id,
            variables=variables,
        )
        return child_id, knowledge, started

    def _conclude(
        self, task: Any, ctx: Any, child_id: str, outcome: Any, token: CancelToken, started: float
    ) -> None:
        """Record how the child ended (and extract its structured output)."""
        duration = round((time.monotonic() - started) * 1000, 3)
        if outcome.status == "waiting":
            raise ChildWaiting(
                f"child run {child_id} of node '{task.node_id}' waits for an answer",
                outcome.waiting,
            )
        error = outcome.error
        ended_with_parent = False
        if outcome.status == "cancelled":
            if token.reason == _timed_out(task):
                error = f"timed out after {task.timeout:g}s (the node's timeout)"
            else:
                error = token.reason or "cancelled"
                ended_with_parent = ctx.cancel.cancelled
        events: list[Any] = [
            ChildRunFinished(
                node_id=task.node_id,
                visit=task.visit,
                child_run_id=child_id,
                status=outcome.status,
                output=outcome.output,
                error=error,
                duration_ms=duration,
            )
        ]
        if ended_with_parent:
            # The parent is ending (cancelled, or its run timeout fired): say so in its log.
            events.append(
                ChildCancelled(child_run_id=child_id, reason=error or "", node_id=task.node_id)
            )
        ctx.record(*events)
        if outcome.status in _COMPLETED and task.output_schema is not None:
            self._extract(task, ctx, outcome.output or "", child_id)

    def _extract(self, task: Any, ctx: Any, text: str, child_id: str) -> None:
        """Structured output for agents: no schema hint, extraction afterwards."""
        from graphrun.actors.llm.structured import parse_json_output

        _value, problem = parse_json_output(text, task.output_schema)
        if problem is None:
            return
        from graphrun.actors.llm.call import extract_structured
        from graphrun.actors.llm.client import ClientFactory
        from graphrun.actors.llm.config import load_llm_config

        options = self.ports.options
        config = load_llm_config(options.config_dir)
        if options.llm_replay is not None:
            factory = ClientFactory.replay(options.llm_replay, config)
        else:
            factory = ClientFactory(config)
        # The extractor uses the child's model when the child ran an LLM, else the graph's.
        model = _child_model(self.ports.store, child_id) or self.ports.graph.model or ""
        if not model:
            raise GraphrunError(
                f"agent node '{task.node_id}': output_schema needs a model for extraction",
                hint="set model: at the top of graph.yaml",
            )
        try:
            extract_structured(
                text,
                task.output_schema,
                node_id=task.node_id,
                visit=task.visit,
                model=model,
                ctx=ctx,
                client_factory=factory,
            )
        finally:
            factory.close()


def _timed_out(task: Any) -> str:
    """The reason the child's token is cancelled with at the node's timeout."""
    return f"agent node '{task.node_id}' timed out after {task.timeout:g}s"


#: The statuses of a child run whose output the agent node takes.
_COMPLETED = ("completed", "completed_with_errors")


def _child_model(store: Any, child_id: str) -> str | None:
    try:
        graph = graph_of(fold(store.read(child_id, upto=1))).graph
    except GraphrunError:
        return None
    return graph.model


# --- the kind -----------------------------------------------------------------------


def request(graph: Graph, node: AgentNode, node_id: str, state: RunState) -> Step:
    prompt = render(node.prompt, state.state, strict=True, field=f"{node_id}.prompt")
    task = AgentTask(
        node_id, state.current_visit, node.agent, prompt, node.timeout, node.output_schema
    )
    return Perform(node_id, "agent", task)


def complete(
    graph: Graph, node: AgentNode, node_id: str, state: RunState, done: ChildRunFinished
) -> Step:
    from graphrun.runtime.nodes.llm import structured_value

    s = state.state
    visit = state.current_visit
    # A child that completed with unhandled failures still gave its output (its own
    # run shows the failures); the parent goes on, as with any completed child.
    if done.status not in _COMPLETED:
        why = done.error or done.status
        message = f"child agent '{node.agent}' run {done.child_run_id} {why}"
        kind = kind_of_result(done)
        target = error_route(node, message, kind)
        if target is not None:
            return tolerated(node_id, visit, node, state.state, target, message, kind)
        return fail(node_id, visit, message, kind)
    output: Any = done.output or ""
    merged: dict[str, Any] = {}
    if node.output_schema is not None:
        extraction = last(state.effects, LlmResult)
        output, error = structured_value(
            node.output_schema,
            done.output,
            extraction.extracted if extraction else None,
            extraction.extract_error if extraction else None,
        )
        if error is not None:
            # Agent nodes have no fallback: extraction failure is a graph error.
            return fail(node_id, visit, error, "OutputSchemaError")
        if isinstance(output, dict):
            merged = dict(output)
    updates = {**merged, **render_updates(node.state_updates, {**s, **merged}, {"output": output})}
    try:
        routed = pick_route(node, {**s, **updates}, node.next)
    except ExpressionError as exc:
        return fail(node_id, visit, str(exc), "ExpressionError")
    if routed is None:
        return fail(node_id, visit, "agent node has no next to route to")
    return Append((completed(node_id, visit, routed, updates=updates),))


def primary(node: AgentNode, effects: tuple[Event, ...], done: Any) -> Any:
    """A map item's result (D3): the child run's output."""
    finished = last(effects, ChildRunFinished)
    return (finished.output if finished is not None else None) or ""


def effect(ports: RunPorts) -> tuple[type, tuple[Any, ...]]:
    return AgentActor, (ports,)


KIND = NodeKind(
    type="agent",
    struct=AgentNode,
    result=ChildRunFinished,
    request=request,
    complete=complete,
    primary=primary,
    effect=effect,
)
