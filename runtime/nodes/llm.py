"""``llm`` nodes: one model call per visit (retries, a bounded tool loop), its text or
structured output into the state."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

from graphrun.eventstore.errors import GraphrunError
from graphrun.eventstore.events import LlmResult
from graphrun.eventstore.fold import RunState
from graphrun.runtime.graph.builtins import node_skill_instructions, node_tools
from graphrun.runtime.graph.check import node_path
from graphrun.runtime.graph.expressions import ExpressionError
from graphrun.runtime.graph.model import (
    CachePolicy,
    ErrorRoute,
    Graph,
    Guard,
    NodeBase,
    RetryPolicy,
    Route,
)
from graphrun.runtime.graph.routing import error_route, pick_route
from graphrun.runtime.graph.templates import render, render_updates
from graphrun.runtime.nodes.error_kinds import kind_of_result
from graphrun.runtime.nodes.kind import NodeKind
from graphrun.runtime.nodes.plan import ERROR_KEY, Append, Perform, Step, completed, fail, last

if TYPE_CHECKING:
    from graphrun.eventstore.events import Event
    from graphrun.runtime.nodes.ports import RunPorts


class LlmNode(NodeBase, tag="llm", kw_only=True):
    routes: list[Route] = msgspec.field(default_factory=list)
    on_error: list[ErrorRoute] = msgspec.field(default_factory=list)
    retry: RetryPolicy | None = None
    guard: Guard | None = None
    cache: CachePolicy | None = None
    prompt: str
    instructions: str | None = None
    tools: list[str] | None = None
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_attempts: int = 1
    max_iterations: int = 10
    fallback: str | None = None
    output_schema: dict[str, Any] | None = None
    timeout: float | None = None
    reasoning_effort: str | None = None
    # Loki's skills: skills_enabled/enabled_skills offer skill__* (runtime/nodes/builtins);
    # inject_skill_instructions/skill_instructions append a paragraph on them.
    skills_enabled: bool | None = None
    enabled_skills: list[str] | None = None
    inject_skill_instructions: bool | None = None
    skill_instructions: str | None = None

    DESCRIPTIONS: ClassVar[dict[str | None, str]] = {
        None: "One LLM call with an optional bounded tool loop, in a fresh context.",
        "prompt": "The user message; templated, strict (required).",
        "instructions": "The system prompt; templated, strict.",
        "tools": "The tools this node may call, and only these: global tools, agent "
        "tools, MCP functions or mcp:<server>. Unset or []: none.",
        "model": "provider:model for this node (default: the graph's model).",
        "temperature": "Sampling temperature (default: the graph's; unset: not sent).",
        "top_p": "Sampling top-p (default: the graph's; unset: not sent).",
        "reasoning_effort": "Reasoning effort for models that take one.",
        "max_attempts": "Attempts on transient errors (timeouts, rate limits, 429, 5xx, "
        "refused connections); default 1.",
        "max_iterations": "Cap on tool-loop turns (default 10).",
        "fallback": "Where to route when the call fails; without it the run continues "
        'to next with {{output}} = "LLM node failed: ...".',
        "timeout": "Wall-clock cap on the node in seconds (unset: none).",
        "output_schema": "A JSON Schema: a hint is added to the prompt, the reply is "
        "parsed (or extracted) as JSON, an object's keys merge into state.",
        "state_updates": "Map of state key -> template; {{output}} is the reply text (or "
        "the parsed value with output_schema).",
        "skills_enabled": "Loki's skills: offers the node skill__list, skill__load, "
        "skill__unload (default: the graph's).",
        "enabled_skills": "Loki's skills: the skills skill__load may load (default: the graph's).",
        "inject_skill_instructions": "Loki's skills: append the skills paragraph to the "
        "instructions (default: the graph's, else true).",
        "skill_instructions": "Loki's skills: the paragraph appended (default: the graph's, "
        "else Loki's own).",
    }
    NEEDS_NEXT: ClassVar[bool] = True
    CALLS_MODEL: ClassVar[bool] = True
    FAILURE_FLOWS_ON: ClassVar[bool] = True
    SCOPED: ClassVar[str] = "output"

    def strict_fields(self) -> list[tuple[str, object]]:
        return [("prompt", self.prompt), ("instructions", self.instructions)]

    def rules(self, node_id: str, check: Any) -> list[Any]:
        out = super().rules(node_id, check)
        if check.deep:
            out += self._tool_rules(node_id, check)
        return out

    def _tool_rules(self, nid: str, c: Any) -> list[Any]:
        """Each ``tools:`` entry must name a known tool or ``mcp:<server>``."""
        from graphrun.actors.tools.builtin_specs import known
        from graphrun.actors.tools.toolbox import validate_whitelist

        own = [name for name in self.tools or () if not known(name)]  # Loki's built-ins
        if not own:
            return []
        try:
            problems = validate_whitelist(
                c.loaded.agent_dir,
                own,
                global_tools=c.graph.global_tools,
                mcp_servers=c.graph.mcp_servers,
                config_dir=c.config_dir,
            )
        except GraphrunError as exc:
            problems = [str(exc)]
        return [
            c.diag(
                "error", "unknown-tool", f"llm node '{nid}': {p}", node_path(nid, "tools"), node=nid
            )
            for p in problems
        ]


@functools.cache
def _effect_names() -> tuple[Any, Any]:
    """``LlmTask`` and ``schema_hint``, imported once on first use: the llm effect's
    modules are not imported by whatever imports the decider (``validate``, ``show``),
    and a map's thousand items do not each run an import statement."""
    from graphrun.actors.llm.call import LlmTask
    from graphrun.actors.llm.structured import schema_hint

    return LlmTask, schema_hint


@functools.cache
def _run_names() -> tuple[Any, Any]:
    """``perform_llm_async`` and ``blocking``, imported once on first use (an import
    statement in :meth:`LlmActor.run` would cost every call of a map ~1 µs)."""
    from graphrun.actors.llm.call import perform_llm_async
    from graphrun.actors.loop import blocking

    return perform_llm_async, blocking


def llm_task(graph: Graph, node: LlmNode, node_id: str, visit: int, s: dict[str, Any]) -> Any:
    """The rendered request of an llm node (schema hint placed as the spec says)."""
    LlmTask, schema_hint = _effect_names()
    system = (
        render(node.instructions, s, strict=True, field=f"{node_id}.instructions")
        if node.instructions is not None
        else None
    )
    skills_hint = node_skill_instructions(graph, node)  # Loki's inject_skill_instructions
    if skills_hint is not None:
        system = f"{system.rstrip()}\n\n{skills_hint}" if system else skills_hint
    prompt = render(node.prompt, s, strict=True, field=f"{node_id}.prompt")
    if node.output_schema is not None:
        hint = schema_hint(node.output_schema)
        if system is not None:
            system = f"{system.rstrip()}\n\n{hint}"
        else:
            prompt = f"{prompt.rstrip()}\n\n{hint}"
    return LlmTask(
        node_id=node_id,
        visit=visit,
        model=node.model or graph.model or "",
        system=system,
        prompt=prompt,
        temperature=node.temperature if node.temperature is not None else graph.temperature,
        top_p=node.top_p if node.top_p is not None else graph.top_p,
        # Graph-level values are defaults for llm nodes (decision D5).
        reasoning_effort=(
            node.reasoning_effort if node.reasoning_effort is not None else graph.reasoning_effort
        ),
        tools=node_tools(graph, node),  # Loki's skills settings add skill__*
        max_attempts=node.max_attempts,
        max_iterations=node.max_iterations,
        timeout=node.timeout,
        output_schema=node.output_schema,
    )


def structured_value(
    schema: dict[str, Any], text: str | None, extracted: str | None, extract_error: str | None
) -> tuple[Any, str | None]:
    """The structured output of a node: the fast path, else the extractor's text."""
    from graphrun.actors.llm.structured import parse_json_output

    value, error = parse_json_output(text or "", schema)
    if error is None:
        return value, None
    if extracted is not None:
        value, error2 = parse_json_output(extracted, schema)
        if error2 is None:
            return value, None
        return None, f"structured output extraction failed: {error2}"
    return None, extract_error or f"structured output extraction failed: {error}"


def request(graph: Graph, node: LlmNode, node_id: str, state: RunState) -> Step:
    return Perform(node_id, "llm", llm_task(graph, node, node_id, state.current_visit, state.state))


def complete(graph: Graph, node: LlmNode, node_id: str, state: RunState, done: LlmResult) -> Step:
    s = state.state
    visit = state.current_visit
    error = done.error
    output: Any = done.text or ""
    merged: dict[str, Any] = {}
    if error is None and node.output_schema is not None:
        output, error = structured_value(
            node.output_schema, done.text, done.extracted, done.extract_error
        )
        if error is None and isinstance(output, dict):
            merged = dict(output)
    if error is None:
        updates = merged
        if node.state_updates:  # (a map's thousand items mostly have none)
            updates = {
                **merged,
                **render_updates(node.state_updates, {**s, **merged}, {"output": output}),
            }
        try:
            routed = pick_route(node, {**s, **updates}, node.next) if node.routes else node.next
        except ExpressionError as exc:
            return fail(node_id, visit, str(exc), "ExpressionError")
        if routed is None:
            return fail(node_id, visit, "llm node has no next to route to")
        return Append((completed(node_id, visit, routed, updates=updates),))
    message = f"LLM node failed: {error}"
    kind = kind_of_result(done, state.effects)
    routed = error_route(node, message, kind) or node.fallback or node.next
    if routed is None:
        return fail(node_id, visit, message, kind)
    failure = {ERROR_KEY: {"node": node_id, "message": message}}
    updates = {
        **failure,
        **render_updates(node.state_updates, {**s, **failure}, {"output": message}),
    }
    return Append(
        (
            completed(
                node_id, visit, routed, updates=updates, failed=True, error=message, error_kind=kind
            ),
        )
    )


def primary(node: LlmNode, effects: tuple[Event, ...], done: Any) -> Any:
    """A map item's result (D3): the reply's text, or its structured value."""
    if done.failed:
        return done.error
    result = last(effects, LlmResult)
    if node.output_schema is not None and result is not None:
        value, _ = structured_value(
            node.output_schema, result.text, result.extracted, result.extract_error
        )
        return value
    return (result.text if result is not None else None) or ""


class LlmActor:
    """The ``llm`` node actor: one call (with retries and a bounded tool loop) per visit."""

    node_type = "llm"

    def __init__(self, ports: RunPorts) -> None:
        from graphrun.actors.llm.client import ClientFactory
        from graphrun.actors.llm.config import load_llm_config

        options = ports.options
        config = load_llm_config(options.config_dir)
        if options.llm_replay is not None:
            self.clients = ClientFactory.replay(options.llm_replay, config)
        else:
            self.clients = ClientFactory(config, loop=ports.loop)
        self.graph = ports.graph
        self.config_dir = options.config_dir
        self.agent_dir = ports.agent_dir
        self.variables = options.variables  # the run's, given to its tools
        self.ports = ports
        self._toolboxes: dict[tuple[str, ...], Any] = {}

    def toolbox(self, whitelist: tuple[str, ...]) -> Any:
        if not whitelist:
            return None
        box = self._toolboxes.get(whitelist)
        if box is None:
            from graphrun.actors.tools.toolbox import load_toolbox

            box = self._toolboxes[whitelist] = load_toolbox(
                self.agent_dir,
                list(whitelist),
                global_tools=list(self.graph.global_tools),
                mcp_servers=list(self.graph.mcp_servers),
                config_dir=self.config_dir,
                variables=self.variables,
                loop=self.ports.loop,  # MCP sessions live on the run's loop
            )
        return box

    def granted(self, names: tuple[str, ...]) -> Any:
        """The toolbox of the tools loaded skills grant: global tools by name, as in
        Loki (``<config_dir>/functions/tools/<name>.sh`` or ``.py``), whether or not
        the graph lists them, any tool of the graph's own, and ``mcp:<server>`` for
        an MCP server of ``mcp.json`` (offered as the node's other MCP tools are).

        Raises:
            ToolError: a granted name is no tool here.
        """
        import re
        from pathlib import Path

        from graphrun.actors.tools.toolbox import load_toolbox

        files = list(self.graph.global_tools)
        tools_dir = Path(self.config_dir) / "functions" / "tools" if self.config_dir else None
        for name in names:
            if tools_dir is None or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
                continue
            for file_name in (f"{name}.sh", f"{name}.py"):
                if file_name not in files and (tools_dir / file_name).is_file():
                    files.append(file_name)
                    break
        servers = list(self.graph.mcp_servers)
        servers += [n[4:] for n in names if n.startswith("mcp:") and n[4:] not in servers]
        return load_toolbox(
            self.agent_dir,
            list(names),
            global_tools=files,
            mcp_servers=servers,
            config_dir=self.config_dir,
            variables=self.variables,
            loop=self.ports.loop,
        )

    def close(self) -> None:
        """Release the HTTP connection pools when the actor stops."""
        self.clients.close()

    def inline(self, task: Any) -> bool:
        """Whether a visit is served from the recording on the driver's thread, as a
        recorded effect is: every response comes from the recording and there are no
        tools to run (no I/O, no wait)."""
        return self.clients.replaying and not task.tools

    def perform(self, task: Any, ctx: Any) -> Any:
        """A visit served from the recording, in place (see :meth:`inline`)."""
        from graphrun.actors.llm.call import perform_llm

        return perform_llm(task, ctx, client_factory=self.clients)

    async def run(self, task: Any, ctx: Any) -> Any:
        """One visit, awaited on the run's loop: each request is awaited there (a
        step's many calls hold no thread while their models answer); its tools and
        commits block, so they go to the run's executor."""
        # Errors raised here (a replay miss, a tool that cannot load) fail the run; the
        # supervisor prefixes the node id, so they carry none of their own.
        perform_llm_async, blocking = _run_names()
        if not task.tools:
            return await perform_llm_async(task, ctx, client_factory=self.clients)
        box, own = await blocking(ctx, self._toolbox_of, task, ctx)
        try:
            return await perform_llm_async(task, ctx, client_factory=self.clients, toolbox=box)
        finally:
            if own:
                await blocking(ctx, box.close)

    def _toolbox_of(self, task: Any, ctx: Any) -> tuple[Any, bool]:
        """The tools of a visit (loading them can start processes: it blocks): the
        node's own, and Loki's built-in functions when it names any; and whether the
        box is the visit's own, closed when it ends (the node's are kept)."""
        from graphrun.actors.tools.builtin_specs import is_builtin
        from graphrun.runtime.nodes.builtins import BuiltinToolbox

        builtins = [name for name in task.tools if is_builtin(name)]
        if not builtins:
            return self.toolbox(task.tools), False
        own = self.toolbox(tuple(name for name in task.tools if not is_builtin(name)))
        box = BuiltinToolbox(
            own,
            builtins,
            ports=self.ports,
            ctx=ctx,
            node_id=task.node_id,
            clients=self.clients,
            grant=self.granted,
        )
        return box, True


def effect(ports: RunPorts) -> tuple[type, tuple[Any, ...]]:
    return LlmActor, (ports,)


KIND = NodeKind(
    type="llm",
    struct=LlmNode,
    result=LlmResult,
    request=request,
    complete=complete,
    primary=primary,
    effect=effect,
)
