"""graph.yaml as typed Structs: the graph, its settings and what every node has.

Unknown fields are errors (``forbid_unknown_fields``). Each node kind's Struct lives
in its own module under ``runtime/nodes/`` (a :class:`NodeBase` tagged on ``type``)
and registers itself with :func:`register_node_type`; what the code that iterates
over kinds needs to know of one, the kind declares on its Struct (the ClassVars and
hooks of :class:`NodeBase`). ``graph.schema.json`` is generated from these Structs
(:mod:`graphrun.runtime.graph.schema`) and a test keeps the committed copy in step.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, NamedTuple

import msgspec

from graphrun.runtime.graph.routing import join_rules, retry_rules, route_reads, route_rules


class Settings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``settings:`` of a graph."""

    max_loop_iterations: int = 100
    log_state_snapshots: bool = True
    validate_before_run: bool = True
    timeout: float | None = None
    # How many nodes of one super-step run at once (the others wait for a slot).
    max_concurrency: int = 8
    # Budgets over the run's own LLM calls: total tokens, and cost in USD (price table).
    max_tokens: int | None = None
    max_cost: float | None = None
    # What a run that reached its end through an unhandled failure (a node failed and no
    # ``fallback`` took it: it flowed into ``next``, Loki's rule) ends as:
    # ``completed_with_errors`` (its own status and exit code), ``continue`` (plain
    # ``completed``, Loki's behaviour) or ``fail`` (the first such failure fails the run).
    on_unhandled_failure: Literal["completed_with_errors", "continue", "fail"] = (
        "completed_with_errors"
    )
    # Whether human answers must be signed (a node may require it on its own).
    signed_decisions: Literal["required", "optional"] = "optional"
    # Who may cancel the run: anyone, or only the graph's approvers.
    cancel_by: Literal["anyone", "approvers"] = "anyone"


class Route(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One conditional edge of a ``routes:`` list: ``when`` it matches, go ``to``."""

    when: str
    to: str


class ErrorRoute(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One entry of ``on_error:``: a failure of ``kind`` (``TimeoutError``, ...) and
    whose ``"<kind>: <message>"`` ``match``es (a regular expression, searched) goes
    ``to``; ``default: true`` matches any failure."""

    to: str
    match: str | None = None
    kind: str | None = None
    default: bool = False


class RetryPolicy(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``retry:`` of an effectful node: how often, and after how long, a failed effect
    is tried again. Each attempt, its error and the delay are recorded."""

    max_attempts: int = 3
    backoff: Literal["exponential", "fixed"] = "exponential"
    initial: float = 1.0
    max: float = 60.0
    jitter: bool = True
    on: list[str] = []


class CachePolicy(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``cache:`` of an llm, script or tool node: an earlier run's recorded effect for
    the same request is served instead of performing it again."""

    key: list[str] = []
    ttl: float | None = None


class Guard(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``guard:`` of an llm, tool or agent node: conditions over the state before the
    effect (``input``) and over its result after it (``output``); a guard that does
    not hold routes to ``on_fail`` (else fails the node). Each is an expression, or a
    mapping: a JSON Schema (draft 2020-12) the state (``input``) or the node's result
    (``output``) must be valid against."""

    input: str | dict[str, Any] | None = None
    output: str | dict[str, Any] | None = None
    on_fail: str | None = None


class JoinPolicy(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``join:`` of a node whose ``next`` fans out: when the super-step it opens goes
    on. ``all`` waits for every branch, ``any`` for the first, ``count`` for ``count``
    of them; the branches still running then are cancelled. ``timeout``: seconds after
    which the branches still running are cancelled and count as failed."""

    type: str = "all"
    count: int | None = None
    timeout: float | None = None

    def needed(self, branches: int) -> int:
        """How many branches must finish before the step goes on."""
        if self.type == "any":
            return 1
        if self.type == "count" and self.count is not None:
            return self.count
        return branches


class ItemBranch(NamedTuple):
    """What a node that runs a branch per item declares: the branch node, the key
    each item is put under, and the key the results are collected into."""

    node: str
    item: str
    collect_into: str


class NodeBase(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, tag_field="type"):
    """Fields every node has."""

    id: str | None = None
    description: str | None = None
    # One target, or a list: two or more entries fan out (they run together in the
    # next super-step); ``[]`` ends this branch without successors.
    next: str | list[str] | None = None
    # How the super-step that a list ``next`` opens is joined (default: every branch).
    join: JoinPolicy | None = None
    state_updates: dict[str, Any] = {}
    # Conditions over the state when the node is about to run: a false ``if`` (or a
    # true ``unless``) skips it: it routes to ``next`` without its effect or writes.
    if_: str | None = msgspec.field(default=None, name="if")
    unless: str | None = None

    @property
    def type(self) -> str:
        return str(type(self).__struct_config__.tag)

    # What a node kind declares about itself, for the code that iterates over kinds
    # (validator, schema, pictures, the decider): a kind defined in its own module
    # under runtime/nodes/ overrides these, and nothing else needs to name it.
    #: ``{field or None: description}`` for graph.schema.json.
    DESCRIPTIONS: ClassVar[dict[str | None, str]] = {}
    #: Routes through ``next`` (the validator warns when it is missing).
    NEEDS_NEXT: ClassVar[bool] = False
    #: May run as a map's branch (an item at a time, concurrently).
    MAP_BRANCH: ClassVar[bool] = True
    #: Why the validator refuses the kind as a map's branch (None: it does not).
    MAP_BRANCH_PROBLEM: ClassVar[str | None] = None
    #: Ends the run (a graph needs one, reachable).
    ENDS_RUN: ClassVar[bool] = False
    #: Starts child runs (the graph then can spawn agents).
    SPAWNS_AGENTS: ClassVar[bool] = False
    #: Waits for a person's answer (never an immediate target of a fan-out).
    HUMAN: ClassVar[bool] = False
    #: Calls a model (``model:``, else the graph's): preflight and validation check it.
    CALLS_MODEL: ClassVar[bool] = False
    #: A failure without ``fallback`` flows on to ``next`` (Loki's rule), unhandled.
    FAILURE_FLOWS_ON: ClassVar[bool] = False
    #: Its JSON result merges into the state, whatever keys it has.
    MERGES_ANY_KEY: ClassVar[bool] = False
    #: Its ``state_updates`` declare the keys its output sets (``meta: "{{meta}}"``
    #: is a write, not a read), and a parallel branch of it must declare them.
    UPDATES_DECLARE_WRITES: ClassVar[bool] = False
    #: The variable its ``state_updates`` see the node's own result as.
    SCOPED: ClassVar[str] = ""

    @property
    def targets(self) -> tuple[str, ...]:
        """The static successors: ``next`` as a tuple (empty when absent)."""
        return next_targets(self.next)

    def static_edges(self) -> list[tuple[str, str]]:
        """``(field, target)`` for every declared static edge: ``next``, the kind's
        own edges (:meth:`body_edges`), ``fallback``, then :meth:`route_edges`."""
        edges: list[tuple[str, str]] = []
        targets = self.targets
        if isinstance(self.next, list):
            edges.extend((f"next[{i}]", target) for i, target in enumerate(targets))
        elif targets:
            edges.append(("next", targets[0]))
        edges.extend(self.body_edges())
        fallback = getattr(self, "fallback", None)
        if fallback:
            edges.append(("fallback", fallback))
        edges.extend((field, target) for field, target, _label in self.route_edges())
        return edges

    def body_edges(self) -> list[tuple[str, str]]:
        """``(field, target)`` of the nodes the kind runs itself (a map's branch)."""
        return []

    def per_item(self) -> ItemBranch | None:
        """The branch the kind runs once per item of a list, if it does (a map)."""
        return None

    def strict_fields(self) -> list[tuple[str, object]]:
        """``(field, text)`` of the templates rendered strictly (a missing key fails
        the run there): the validator checks the keys they read."""
        return []

    def template_fields(self) -> list[object]:
        """Every template the node renders against the snapshot, ``state_updates``
        aside (a parallel branch must not read what a sibling writes)."""
        return [value for _field, value in self.strict_fields()]

    def result_keys(self) -> set[str]:
        """State keys the node's result writes beyond ``state_updates`` (the
        top-level properties of an ``output_schema``)."""
        schema = getattr(self, "output_schema", None)
        props = schema.get("properties") if isinstance(schema, dict) else None
        return {str(key) for key in props} if isinstance(props, dict) else set()

    def route_edges(self) -> list[tuple[str, str, str]]:
        """``(field path, target, label)`` of the node's routes beyond ``next`` and
        ``fallback``: a ``routes:`` list and ``on_error:`` (edges, reachability, cycles
        and pictures include them). A kind with routes of its own overrides it."""
        edges: list[tuple[str, str, str]] = []
        routes = getattr(self, "routes", None)
        if isinstance(routes, list):
            edges += [(f"routes[{i}].to", r.to, r.when) for i, r in enumerate(routes)]
        guard = getattr(self, "guard", None)
        if guard is not None and guard.on_fail:
            edges.append(("guard.on_fail", guard.on_fail, "guard failed"))
        for i, err in enumerate(getattr(self, "on_error", None) or ()):
            label = "on_error"
            if err.kind:
                label += f" {err.kind}"
            if err.match is not None:
                label += f" /{err.match}/"
            edges.append((f"on_error[{i}].to", err.to, label))
        return edges

    def reads(self) -> set[str]:
        """The state keys the kind's own fields read (templates, expressions)."""
        return route_reads(self)

    def rules(self, node_id: str, check: Any) -> list[Any]:
        """The kind's own validation rules: ``Diagnostic``s made with ``check.diag``."""
        return (
            route_rules(self, node_id, check)
            + retry_rules(self, node_id, check)
            + join_rules(self, node_id, check)
        )


#: Reducers a graph may declare for a state key (``reducers: {key: name}``).
REDUCER_NAMES = ("append", "extend", "concat", "sum", "max", "min", "merge", "overwrite")
Reducer = Literal["append", "extend", "concat", "sum", "max", "min", "merge", "overwrite"]


class Variable(msgspec.Struct, kw_only=True):
    """One of an agent's ``variables`` (Loki's shape)."""

    name: str
    description: str = ""
    default: str | None = None


#: The node kinds by ``type``, in the order they are listed (errors, the schema):
#: filled by :func:`register_node_type` as ``graphrun.runtime.nodes`` imports them.
NODE_TYPES: dict[str, type[NodeBase]] = {}


def register_node_type(cls: type[NodeBase]) -> type[NodeBase]:
    """Make a node kind's Struct known to the loader and the schema (its module under
    runtime/nodes/ calls this when the kind registry imports it)."""
    tag = str(cls.__struct_config__.tag)
    known = NODE_TYPES.get(tag)
    if known is not None and known is not cls:
        raise ValueError(f"node type '{tag}' is already {known.__name__}")
    NODE_TYPES[tag] = cls
    return cls


def next_targets(value: str | list[str] | None) -> tuple[str, ...]:
    """``next`` as a tuple of targets."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    return tuple(value)


class Graph(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A whole graph.yaml."""

    name: str
    version: str
    start: str
    nodes: dict[str, NodeBase]
    description: str | None = None
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    global_tools: list[str] = []
    mcp_servers: list[str] = []
    conversation_starters: list[str] = []
    settings: Settings = msgspec.field(default_factory=Settings)
    initial_state: dict[str, Any] = {}
    reducers: dict[str, Reducer] = {}
    variables: list[Variable] = []
    reasoning_effort: str | None = None
    # Loki's skills: skills_enabled/enabled_skills offer skill__* (runtime/nodes/builtins);
    # inject_skill_instructions/skill_instructions append a paragraph on them.
    skills_enabled: bool | None = None
    enabled_skills: list[str] | None = None
    inject_skill_instructions: bool | None = None
    skill_instructions: str | None = None

    @property
    def can_spawn_agents(self) -> bool:
        """Derived, never declared: true iff the graph has an agent node."""
        return any(type(n).SPAWNS_AGENTS for n in self.nodes.values())


def static_edges(node: NodeBase) -> list[tuple[str, str]]:
    """``(field, target)`` for every declared static edge of a node."""
    return node.static_edges()
