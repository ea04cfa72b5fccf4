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
from typing import TYPE_CHECKING, Any

from graphrun.actors.base import CancelToken
from graphrun.actors.messages import AgentTask
from graphrun.eventstore.events import (
    ChildCancelled,
    ChildRunFinished,
    ChildRunStarted,
    LlmResult,
)
from graphrun.eventstore.fold import TERMINAL, RunState, fold
from graphrun.eventstore.ids import new_run_id
from graphrun.runtime.engine.plan import Append, Perform, Step, completed, fail, last
from graphrun.runtime.errors import GraphrunError, WaitingForHuman
from graphrun.runtime.graph.model import AgentNode, Graph
from graphrun.runtime.graph.templates import render, render_updates
from graphrun.runtime.nodes.kind import NodeKind

if TYPE_CHECKING:
    from graphrun.eventstore.events import Event
    from graphrun.runtime.engine.ports import RunPorts


class ChildWaiting(WaitingForHuman):
    """A child run waits for a person; the parent waits with it."""

    def __init__(self, message: str, request: Any) -> None:
        super().__init__(message)
        self.request = request


class AgentActor:
    """The ``agent`` node actor."""

    node_type = "agent"

    def __init__(self, ports: RunPorts) -> None:
        self.ports = ports

    def perform(self, task: Any, ctx: Any) -> None:
        from graphrun.runtime.agents import load_agent, resolve_agent_dir
        from graphrun.runtime.engine.driver import Driver, check_graph, drive, graph_of, start_run
        from graphrun.runtime.graph.variables import for_run, with_variables
        from graphrun.runtime.graph.variables import resolve as resolve_variables

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
            knowledge = _knowledge(graph_of(fold(store.read(child_id, upto=1))), options)
        else:
            ref = resolve_agent_dir(task.agent, options.agents_dir, graph_dir=parent.agent_dir)
            loaded = load_agent(ref.path, config_dir=options.config_dir)
            if loaded.graph.settings.validate_before_run:
                check_graph(loaded, agents_dir=options.agents_dir, config_dir=options.config_dir)
            # Its own variables: not the parent's presets, and no prompt (Loki).
            variables = resolve_variables(loaded)
            loaded = with_variables(loaded, variables)
            knowledge = _knowledge(loaded, options)
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
            start_run(
                store,
                loaded,
                prompt=task.prompt,
                started_by=options.as_user,
                parent_run_id=parent.run_id,
                parent_node_id=task.node_id,
                run_id=child_id,
                config={"variables": variables},
            )
        token = CancelToken()
        unhook = ctx.cancel.on_cancel(lambda: token.cancel(ctx.cancel.reason or "cancelled"))
        # The child's own variables, as recorded when it began (never the parent's).
        child_options = for_run(_child_options(options, knowledge), store, child_id)
        child = Driver(store, child_id, child_options, cancel=token)
        parent.children.attach(child_id, token, child)
        timer_reason = f"agent node '{task.node_id}' timed out after {task.timeout:g}s"
        import threading

        timer = threading.Timer(task.timeout, token.cancel, args=(timer_reason,))
        timer.daemon = True
        timer.start()
        try:
            outcome = drive(child)
        finally:
            timer.cancel()
            unhook()
            parent.children.detach(child_id)
        duration = round((time.monotonic() - started) * 1000, 3)
        if outcome.status == "waiting":
            raise ChildWaiting(
                f"child run {child_id} of node '{task.node_id}' waits for an answer",
                outcome.waiting,
            )
        error = outcome.error
        ended_with_parent = False
        if outcome.status == "cancelled":
            if token.reason == timer_reason:
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


#: The statuses of a child run whose output the agent node takes.
_COMPLETED = ("completed", "completed_with_errors")


def _knowledge(loaded: Any, options: Any) -> dict[str, Any] | None:
    """The child's knowledge bases, when it has rag nodes (built once, never silently)."""
    if not any(n.type == "rag" for n in loaded.graph.nodes.values()):
        return None
    from graphrun.runtime.nodes.rag import prepare_knowledge_bases

    return prepare_knowledge_bases(loaded, interactive=False, config_dir=options.config_dir)


def _child_model(store: Any, child_id: str) -> str | None:
    from graphrun.runtime.engine.driver import graph_of

    try:
        graph = graph_of(fold(store.read(child_id, upto=1))).graph
    except GraphrunError:
        return None
    return graph.model


def _child_options(options: Any, knowledge: dict[str, Any] | None) -> Any:
    """Child runs share the parent's configuration, answers and identity, not its
    listener (their narration is indented) nor its knowledge bases."""
    import copy

    from graphrun.runtime.narrate import Narrator

    child = copy.copy(options)
    child.extra = dict(options.extra)
    if knowledge is not None:
        child.extra["knowledge_bases"] = knowledge
    if options.listener is not None:
        child.listener = _Indented(Narrator())
    child.effect_source = None
    return child


class _Indented:
    def __init__(self, narrator: Any) -> None:
        self.narrator = narrator
        original = narrator.line
        narrator.line = lambda text: original("  " + text)

    def __call__(self, events: Any, state: Any) -> None:
        self.narrator(events, state)


def resume_ancestors(store: Any, run_id: str, options: Any, outcome: Any) -> Any:
    """After a child run ends (e.g. once a person answered it), continue the parents
    that were waiting on it; returns the outermost outcome."""
    from graphrun.runtime.engine.driver import Driver, drive

    current = outcome
    row = store.run(run_id)
    while current.status in TERMINAL and row.parent_run_id:
        parent_id = row.parent_run_id
        if fold(store.read(parent_id)).terminal:
            break
        from graphrun.runtime.graph.variables import for_run

        current = drive(Driver(store, parent_id, for_run(options, store, parent_id)))
        row = store.run(parent_id)
    return current


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
        return fail(node_id, visit, f"child agent '{node.agent}' run {done.child_run_id} {why}")
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
            return fail(node_id, visit, error)
        if isinstance(output, dict):
            merged = dict(output)
    if node.next is None:
        return fail(node_id, visit, "agent node has no next to route to")
    updates = {**merged, **render_updates(node.state_updates, {**s, **merged}, {"output": output})}
    return Append((completed(node_id, visit, node.next, updates=updates),))


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
