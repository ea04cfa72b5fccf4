"""Every event graphrun records, as one tagged union.

Events are facts in the past tense, frozen, and only ever gain optional fields
with defaults (old logs must keep decoding; new readers skip unknown fields).
Each carries the envelope ``run_id``, ``seq`` (1, 2, 3… per run, no gaps) and
``ts`` (the wall clock when it was recorded); the JSON tag field is ``type``.

Effect events (``ScriptFinished``, ``LlmCalled``, ``LlmResult``, ``ToolCalled``,
``RetrievalDone``, ``ChildRunFinished``, ``HumanInputReceived``) record the
outcome of something non-deterministic *before* the decider uses it; decision
events (``NodeEntered``, ``NodeCompleted``, ``NodeFailed``, ``Run*``) record what
the pure decider concluded, and are what replay compares.
"""

from __future__ import annotations

from typing import Any

import msgspec

#: Version of the event schema written by this code. Bump it (and add an
#: upcaster in ``codec.py``) only for a change that is not purely additive.
SCHEMA_VERSION = 1


class EventBase(
    msgspec.Struct,
    frozen=True,
    tag=True,
    tag_field="type",
    kw_only=True,
    omit_defaults=True,
    gc=False,
):
    """The envelope every event has.

    ``gc=False``: an event is immutable and built from decoded data, so it can never
    be part of a reference cycle; leaving events out of the cyclic collector keeps a
    long log from making every collection slower (``show`` and replay stay linear).
    """

    run_id: str = ""
    seq: int = 0
    ts: float = 0.0
    #: Which slot of a parallel super-step (the frontier node's id) or which map item
    #: (``"<map>[<i>]"``) an event belongs to; empty for a sequential step.
    branch: str = ""


# --- run lifecycle -----------------------------------------------------------


class RunStarted(EventBase, frozen=True, kw_only=True):
    """A run began. Holds everything needed to replay it without the files."""

    graph_name: str
    graph_source: str  # the full graph.yaml text
    graph_hash: str  # "sha256:<hex>" of graph_source
    graph_path: str = ""  # where graph.yaml was, for humans and `graphrun test`
    agent_dir: str = ""
    initial_state: dict[str, Any] = {}
    initial_prompt: str = ""
    parent_run_id: str | None = None
    parent_node_id: str | None = None
    started_by: str = ""  # OS user (or --as)
    host: str = ""
    forked_from: str | None = None  # run id this run was forked from
    forked_at: int | None = None  # seq of the source run the fork copies up to
    # The recorded run whose effects (and signed answers) this run reuses
    # (``replay --live``, ``test --update``); its signatures stay that run's.
    recorded_from: str | None = None
    graphrun_version: str = ""
    # Extra files the run depends on (scripts, tools), name -> "sha256:<hex>".
    files: dict[str, str] = {}
    # The configuration the run began with (config dir, agents dir, Loki dir, models
    # and base URLs as resolved; never keys), reused by every later command.
    config: dict[str, Any] = {}


class RunResumed(EventBase, frozen=True, kw_only=True):
    """A process took over a run that was interrupted or waiting."""

    by: str = ""
    host: str = ""
    pid: int = 0
    reason: str = ""  # "resume", "answer", "approve", ...


class GraphUpgraded(EventBase, frozen=True, kw_only=True):
    """The run continues on a new graph (``graphrun upgrade``): its recorded history was
    replayed against the new graph and reproduced. From here on the run's graph is
    ``graph_source``. A failed run comes back to life: ``retry_node`` (the node that
    failed) is entered again."""

    old_hash: str
    new_hash: str
    graph_source: str
    graph_path: str = ""
    agent_dir: str = ""
    files: dict[str, str] = {}
    by: str = ""
    host: str = ""
    #: The status the run had when it was upgraded (waiting, interrupted, failed).
    was: str = ""
    retry_node: str | None = None
    #: The first seq this upgrade supersedes (a failed run's failed visit and its
    #: failure, which the new graph never made); 0: none.
    superseded: int = 0


class RunCompleted(EventBase, frozen=True, kw_only=True):
    """The run reached an end node; ``output`` is the final result."""

    node_id: str
    output: str
    duration_ms: float = 0.0
    #: The failures no ``fallback`` handled on the way (``{"node", "visit", "error"}``
    #: each): the run ends ``completed_with_errors``. Empty: plain ``completed``.
    unhandled_failures: list[dict[str, Any]] = []


class RunFailed(EventBase, frozen=True, kw_only=True):
    """The run cannot continue."""

    error: str
    node_id: str | None = None
    duration_ms: float = 0.0


class RunInterrupted(EventBase, frozen=True, kw_only=True):
    """The process driving the run was stopped (Ctrl-C, SIGTERM); ``resume`` continues it.

    Effects in flight were stopped and their process groups killed; they are
    performed again on resume, completed ones never are."""

    reason: str
    signal: str = ""  # "SIGINT", "SIGTERM"
    by: str = ""


class RunCancelled(EventBase, frozen=True, kw_only=True):
    """The run was cancelled (by its parent ending, a timeout, or a person)."""

    reason: str
    by: str = ""


# --- node steps (decisions) ----------------------------------------------------


class NodeEntered(EventBase, frozen=True, kw_only=True):
    """The decider routed into a node; ``visit`` counts entries of this node (1-based)."""

    node_id: str
    node_type: str
    visit: int


class NodeCompleted(EventBase, frozen=True, kw_only=True):
    """A node finished and routed on.

    ``updates`` are the state keys the node set (explicit ``state_updates`` and
    structured-output merges). ``merge_effect`` says the node's effect output (a
    script's JSON object, minus ``_next``) was merged into state first; it is not
    copied here, so the log records each value once.
    """

    node_id: str
    visit: int
    routed_to: str | None
    updates: dict[str, Any] = {}
    merge_effect: bool = False
    # A static fan-out: the targets of a ``next`` list of two or more entries (then
    # ``routed_to`` is None); they run together in the next super-step.
    fan_out: list[str] = []
    failed: bool = False  # tolerant failure: the node failed but routed on
    error: str | None = None
    duration_ms: float = 0.0
    # The failure's kind ("TimeoutError", "ScriptExit", ...), when ``failed``.
    error_kind: str = ""
    # Why the node was skipped (its ``if`` was false or its ``unless`` true): it routed
    # to ``next`` without its effect and without its writes. Empty: it ran.
    skipped: str = ""


class NodeFailed(EventBase, frozen=True, kw_only=True):
    """A node failed and the failure ends the run (no tolerant route)."""

    node_id: str
    visit: int
    error: str
    duration_ms: float = 0.0
    # The failure's kind ("TimeoutError", "HTTPError", "GuardFailed", ...).
    error_kind: str = ""


class StepStarted(EventBase, frozen=True, kw_only=True):
    """A parallel super-step began: every node of ``frontier`` runs concurrently
    against the state as it is now (the step's snapshot)."""

    step: int
    frontier: list[str]
    # The fan-out's join policy (``all`` when empty): ``{type, count, timeout}``.
    join: dict[str, Any] = {}


class BranchesJoined(EventBase, frozen=True, kw_only=True):
    """A super-step's join policy was settled before every branch finished: the
    ``counted`` branches are merged, the ``cancelled`` ones were stopped (their
    processes and child runs too) and are left out; ``reason`` says why
    (``join satisfied``, the join's timeout, or that it can no longer hold).
    ``failed``: the branches that failed before the join held (left out too: an
    ``any``/``count`` join goes on without them while it can still hold), and
    ``errors`` what each of them failed with (a failure the effect itself raised
    is recorded nowhere else)."""

    step: int
    counted: list[str] = []
    cancelled: list[str] = []
    reason: str = ""
    failed: list[str] = []
    errors: dict[str, str] = {}


class BranchesMerged(EventBase, frozen=True, kw_only=True):
    """A parallel super-step ended: what each branch wrote and what the merge made of it.

    ``writes`` maps each branch to the keys whose value it changed (against the
    step's snapshot); ``merged`` is the result of folding them in node-id order
    through the graph's reducers (the state keys this event sets); ``targets`` is
    the next frontier."""

    step: int
    writes: dict[str, dict[str, Any]] = {}
    merged: dict[str, Any] = {}
    reducers: dict[str, str] = {}
    targets: list[str] = []


# --- effects (recorded outcomes) -----------------------------------------------


class ScriptFinished(EventBase, frozen=True, kw_only=True):
    """A script node's process ended (or was killed)."""

    node_id: str
    visit: int
    script: str  # path relative to the agent directory
    script_hash: str = ""  # "sha256:<hex>" of the script file when it ran
    input_hash: str = ""  # "sha256:<hex>" of the GRAPH_STATE JSON it was given
    exit_code: int | None = None  # None when killed by timeout / cancellation
    output: dict[str, Any] | None = None  # stdout parsed, when it was a JSON object
    stdout: str = ""  # raw stdout, only when it was *not* a JSON object
    stderr: str = ""
    duration_ms: float = 0.0
    timed_out: bool = False
    error: str | None = None  # why the script counts as failed, if it does


class LlmCalled(EventBase, frozen=True, kw_only=True):
    """One HTTP call to an LLM provider (one attempt of one turn)."""

    node_id: str
    visit: int
    purpose: str = "main"  # "main", "extract" (structured-output extractor), "repair"
    iteration: int = 1  # turn of the tool-call loop
    attempt: int = 1
    model: str = ""  # provider:model as resolved
    url: str = ""
    request: dict[str, Any] = {}  # the JSON body as sent (never headers or keys)
    status: int | None = None  # HTTP status
    response: dict[str, Any] | None = None  # the JSON body received
    text: str | None = None  # assistant text of this response
    tool_calls: list[dict[str, Any]] = []  # [{id, name, arguments}]
    usage: dict[str, Any] = {}
    latency_ms: float = 0.0
    error: str | None = None
    transient: bool = False


class ToolCalled(EventBase, frozen=True, kw_only=True):
    """A tool the model asked for ran (or was refused)."""

    node_id: str
    visit: int
    iteration: int = 1
    call_id: str = ""
    name: str
    arguments: str = ""  # JSON text as the model sent it
    result: str = ""
    is_error: bool = False
    duration_ms: float = 0.0
    source: str = ""  # "tools.sh", "tools.py", "global", "mcp:<server>"
    # The text this call put into the system prompt of the following turns (Loki's
    # ``skill__load``: the skill's body; older logs carry it in ``result``).
    instructions: str | None = None
    # The tools this call offered from the following turn on (``skill__load``: the
    # skill's ``enabled_tools``).
    tools: list[str] = []


class LlmContinued(EventBase, frozen=True, kw_only=True):
    """An llm visit's model ended its turn and was prompted again (Loki's
    ``auto_continue`` while todos are open, ``reason="todos"``; its guardrail while
    spawned agents still run, ``reason="pending_agents"``). ``prompt`` is the user
    message sent; the next turn is ``iteration + 1``."""

    node_id: str
    visit: int
    iteration: int
    reason: str
    prompt: str
    count: int = 1  # the how-manieth continuation of this reason


class LlmResult(EventBase, frozen=True, kw_only=True):
    """What an llm node's calls amounted to: the final text, or why it failed.

    ``extracted`` is the structured-output extractor's text when the fast path
    (the main text parsed as JSON) did not succeed.
    """

    node_id: str
    visit: int
    text: str | None = None
    error: str | None = None
    extracted: str | None = None
    extract_error: str | None = None
    calls: int = 0


class RetrievalDone(EventBase, frozen=True, kw_only=True):
    """A rag node's retrieval ran; ``result`` is ``{"context": str, "sources": [...]}``."""

    node_id: str
    visit: int
    query: str
    top_k: int | None = None
    result: dict[str, Any] | None = None
    hits: list[dict[str, Any]] = []  # [{source, chunk, score}] for inspection
    error: str | None = None
    duration_ms: float = 0.0


class ChildRunStarted(EventBase, frozen=True, kw_only=True):
    """An agent node started a child run."""

    node_id: str
    visit: int
    child_run_id: str
    agent: str
    prompt: str = ""


class ChildRunFinished(EventBase, frozen=True, kw_only=True):
    """A child run ended; ``output`` is its final text."""

    node_id: str
    visit: int
    child_run_id: str
    status: str  # "completed", "completed_with_errors", "failed", "cancelled"
    output: str | None = None
    error: str | None = None
    duration_ms: float = 0.0


class HumanInputRequested(EventBase, frozen=True, kw_only=True):
    """An input or approval node is waiting for a person."""

    node_id: str
    visit: int
    kind: str  # "input" or "approval"
    question: str
    options: list[str] = []
    default: str | None = None
    approvers: list[str] = []  # as shown; who may answer is read from the graph
    signed: bool = False  # as shown: the graph requires a signed answer here


class ToolFinished(EventBase, frozen=True, kw_only=True):
    """A ``tool`` node's call ran: the tool, the arguments as sent (JSON text), its
    output (a JSON value when it printed one, else the text) or its error."""

    node_id: str
    visit: int
    tool: str
    arguments: str = ""
    output: Any = None
    error: str | None = None
    duration_ms: float = 0.0
    source: str = ""  # "tools.sh", "tools.py", "global", "mcp:<server>"


class CacheChecked(EventBase, frozen=True, kw_only=True):
    """A node with ``cache:`` looked its request up by ``key``. With ``from_run``, a
    hit: the effect events that follow are copies of that run's, recorded from its
    ``from_seq``; without, a miss: the effect is performed and later runs may reuse
    it."""

    node_id: str
    visit: int
    key: str
    from_run: str | None = None
    from_seq: int | None = None


class NodeRetrying(EventBase, frozen=True, kw_only=True):
    """A node's effect failed and is tried again (its ``retry`` policy): after
    ``delay`` seconds from this event's time, attempt ``attempt + 1`` begins. The
    delay is decided here, so a replay reproduces it without waiting and a run
    resumed after a crash waits only what is left of it."""

    node_id: str
    visit: int
    attempt: int  # the attempt that failed, from 1
    error: str
    delay: float


class HumanInputReceived(EventBase, frozen=True, kw_only=True):
    """A person answered. Who, from where, through what, and what they were shown."""

    node_id: str
    visit: int
    answer: str
    by: str  # claimed identity (--as) or the OS user
    os_user: str = ""
    host: str = ""
    channel: str = ""  # "tty", "flag", "approve", "answer", "parent"
    question: str = ""
    options: list[str] = []
    #: How ``by`` is known: "verified" (a signature), "token" (an authenticated
    #: session or API token), "proxy" (asserted by a trusted front) or "claimed"
    #: (a typed name or the OS user; also every answer recorded without this field).
    identity: str = ""
    #: The exact bytes of the signed decision statement (UTF-8 JSON, see
    #: ``runtime/decisions``), the signature over them and its kind ("sshsig",
    #: "webauthn", ...), and the signing key's id as seen when it was recorded.
    statement: str = ""
    signature: str = ""
    signature_kind: str = ""
    key: str = ""


class ApprovalSigned(EventBase, frozen=True, kw_only=True):
    """One signature of an approval that needs several distinct signers, recorded as
    it arrives; the signature that completes the count is the ``HumanInputReceived``.
    The run keeps waiting at the node."""

    node_id: str
    visit: int
    answer: str
    by: str
    os_user: str = ""
    host: str = ""
    channel: str = ""
    identity: str = ""
    statement: str = ""
    signature: str = ""
    signature_kind: str = ""
    key: str = ""


class HeadSigned(EventBase, frozen=True, kw_only=True):
    """A machine key signed the run's head (the hash of event ``head_seq``) when the
    run ended or began to wait: a later cut or recomputed tail no longer matches."""

    head_seq: int
    head: str
    statement: str  # the exact signed bytes (domain "graphrun-head@v1")
    signature: str
    signature_kind: str = "sshsig"
    principal: str = ""
    key: str = ""


# --- supervisor policies -------------------------------------------------------


class TimeoutFired(EventBase, frozen=True, kw_only=True):
    """A timeout expired: the run's ``settings.timeout`` or a node's own."""

    scope: str  # "run" or "node"
    timeout_s: float
    node_id: str | None = None


class VisitCapExceeded(EventBase, frozen=True, kw_only=True):
    """A node was about to be entered more than ``max_loop_iterations`` times."""

    node_id: str
    visits: int
    cap: int


class ChildCancelled(EventBase, frozen=True, kw_only=True):
    """The supervisor cancelled a still-running child run."""

    child_run_id: str
    reason: str
    node_id: str | None = None


Event = (
    RunStarted
    | RunResumed
    | RunCompleted
    | RunFailed
    | RunCancelled
    | RunInterrupted
    | BranchesJoined
    | StepStarted
    | BranchesMerged
    | NodeEntered
    | NodeCompleted
    | NodeFailed
    | ScriptFinished
    | LlmCalled
    | ToolCalled
    | LlmContinued
    | LlmResult
    | RetrievalDone
    | ChildRunStarted
    | ChildRunFinished
    | HumanInputRequested
    | HumanInputReceived
    | ApprovalSigned
    | HeadSigned
    | TimeoutFired
    | VisitCapExceeded
    | ChildCancelled
    | GraphUpgraded
    | NodeRetrying
    | ToolFinished
    | CacheChecked
)

EFFECT_TYPES: tuple[type, ...] = (
    ScriptFinished,
    ToolFinished,
    LlmCalled,
    ToolCalled,
    LlmContinued,
    LlmResult,
    RetrievalDone,
    ChildRunStarted,
    ChildRunFinished,
    HumanInputReceived,
)
#: Effect events that end an effect (its result); the others (an LLM turn, a tool's
#: result, a child run's start) are facts recorded on the way.
RESULT_TYPES: tuple[type, ...] = (
    ScriptFinished,
    ToolFinished,
    LlmResult,
    RetrievalDone,
    ChildRunFinished,
    HumanInputReceived,
)
DECISION_TYPES: tuple[type, ...] = (
    NodeEntered,
    NodeCompleted,
    NodeFailed,
    RunCompleted,
    RunFailed,
    HumanInputRequested,
    VisitCapExceeded,
    StepStarted,
    BranchesMerged,
    NodeRetrying,
)
TERMINAL_TYPES: tuple[type, ...] = (RunCompleted, RunFailed, RunCancelled)

__all__ = [
    "DECISION_TYPES",
    "EFFECT_TYPES",
    "RESULT_TYPES",
    "SCHEMA_VERSION",
    "TERMINAL_TYPES",
    "ApprovalSigned",
    "BranchesJoined",
    "BranchesMerged",
    "CacheChecked",
    "ChildCancelled",
    "ChildRunFinished",
    "ChildRunStarted",
    "Event",
    "EventBase",
    "HeadSigned",
    "HumanInputReceived",
    "HumanInputRequested",
    "LlmCalled",
    "LlmContinued",
    "LlmResult",
    "NodeCompleted",
    "NodeEntered",
    "NodeFailed",
    "NodeRetrying",
    "RetrievalDone",
    "RunCancelled",
    "RunCompleted",
    "RunFailed",
    "RunInterrupted",
    "RunResumed",
    "RunStarted",
    "ScriptFinished",
    "StepStarted",
    "TimeoutFired",
    "ToolCalled",
    "ToolFinished",
    "VisitCapExceeded",
]
