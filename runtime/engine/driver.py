"""The run supervisor: fold, decide, perform, append — and the policies around it.

One :class:`Driver` drives one run in one process (it holds the run's lease). Its
loop asks the pure decider for the next step; decision events are buffered and
an effect is awaited on the run's event loop (:mod:`graphrun.actors.loop`). The
effect's events and the decisions that follow from them are committed together in
one transaction before the next effect starts, so nothing observable happens on
the strength of an unrecorded value; a crash before that commit re-performs the
effect on resume (at-least-once effects, exactly-once recorded results).

A super-step (a fan-out, a map's items) runs its effects concurrently within their
caps (:class:`_Slots`), each a task on the same loop; what an effect can only do
blocking goes to the run's bounded executor. Each effect's events are committed
as they happen and its result as it finishes; a slot it frees starts the next
effect at once, on the loop.

Policies: ``settings.timeout`` (cancels the in-flight node, records
``TimeoutFired``), the per-node visit cap (in the decider), cancellation (Ctrl-C,
a parent ending), and the one-writer lease.

:class:`RunSupervisor` is the pykka actor the CLI asks to drive a run.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import shutil
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any

import msgspec

from graphrun.actors import process
from graphrun.actors.base import CancelToken
from graphrun.actors.loop import EffectLoop, TaskOutcome, runner
from graphrun.eventstore.codec import content_hash
from graphrun.eventstore.errors import (
    CorruptStoreError,
    GraphrunError,
    StoreError,
    UnknownRunError,
)
from graphrun.eventstore.events import (
    RESULT_TYPES,
    ApprovalSigned,
    BranchesJoined,
    CacheChecked,
    ChildCancelled,
    Event,
    HumanInputReceived,
    HumanInputRequested,
    NodeFailed,
    NodeRetrying,
    RunCancelled,
    RunFailed,
    RunInterrupted,
    RunResumed,
    RunStarted,
    TimeoutFired,
)
from graphrun.eventstore.fold import TERMINAL, RunState, apply, fold
from graphrun.eventstore.ids import Clock, new_run_id
from graphrun.eventstore.store import Store
from graphrun.runtime.engine import decider
from graphrun.runtime.engine.lifecycle import cancel_run, whoami
from graphrun.runtime.engine.runs import LoadedRun, keep_snapshot, load_run, still_current
from graphrun.runtime.errors import GraphValidationError, WaitingForHuman
from graphrun.runtime.graph.loader import Diagnostic, LoadedGraph, graph_of
from graphrun.runtime.graph.model import Graph
from graphrun.runtime.nodes.cache import cache_key
from graphrun.runtime.nodes.cache import find as find_cached
from graphrun.runtime.nodes.ports import ChildRuns, RunOptions, RunPorts
from graphrun.runtime.nodes.retry import pending_retry, since_last_retry

_replace = msgspec.structs.replace
log = logging.getLogger("graphrun.run")

GRAPHRUN_VERSION = "0.1.0"
_LEASE_RENEW_EVERY = 10.0
#: How often a driver looks for a cancel request from another process (``graphrun
#: cancel``), between steps and while effects are in flight: one indexed read.
_CANCEL_POLL_EVERY = 0.25
#: The node types whose effect may ask a person on the terminal.
_ASKS_A_PERSON = ("approval", "input")
# The fewest threads a run's executor may use for blocking work (a store commit, a
# tool, an index, a person, starting a child run): a step may use as many as its
# effects.
_MIN_EXECUTOR = 4


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    status: str  # completed, failed, cancelled, waiting
    output: str | None = None
    error: str | None = None
    waiting: HumanInputRequested | None = None
    # Why an answer offered while driving was not taken (not an approver, an
    # interrupted prompt): the run still waits, and the command exits with its code.
    refused: GraphrunError | None = None
    # "SIGINT" / "SIGTERM" when the drive was interrupted (status "interrupted").
    signal: str | None = None
    # The failures no fallback handled (status "completed_with_errors").
    unhandled: tuple[dict[str, Any], ...] = ()
    # The failed branches an ``any``/``count`` join went on without.
    left_out: tuple[dict[str, Any], ...] = ()


# RESULT_TYPES (eventstore.events): an effect's result is committed together with the
# decisions that use it (one transaction), and dropped when an interrupt stopped the
# effect. Its other events are facts the effect makes durable (``ctx.checkpoint()``)
# before it acts on them.


class _Context:
    """The :class:`~graphrun.actors.base.EffectContext` a driver hands an effect."""

    __slots__ = (
        "_driver",
        "agent_dir",
        "branch",
        "cancel",
        "node_id",
        "options",
        "prior",
        "recorded",
        "run_id",
        "visit",
    )

    def __init__(
        self,
        driver: Driver,
        node_id: str,
        visit: int,
        *,
        branch: str = "",
        cancel: CancelToken | None = None,
        prior: tuple[Any, ...] = (),
    ) -> None:
        self.run_id = driver.run_id
        self.node_id = node_id
        self.visit = visit
        self.branch = branch
        self.agent_dir = driver.agent_dir
        self.cancel = cancel if cancel is not None else driver.node_cancel
        self.options = driver.options
        # The effect events this visit already has in the log (a resumed tool loop
        # serves its recorded turns and tool results instead of repeating them).
        self.prior = prior
        self._driver = driver
        self.recorded = 0

    def record(self, *events: Event) -> None:
        self.recorded += len(events)
        self._driver.record_effects(events, self.branch)

    def checkpoint(self) -> None:
        """Make what this effect recorded durable before it acts again."""
        self._driver.checkpoint(self.branch)

    def state(self) -> RunState:
        """The run's working state as the effect starts (an effect source compares
        the request the decider makes now with the recorded one against it)."""
        return self._driver.state

    def absorb(self) -> None:
        """Queue what was recorded so far for the next commit, now (a recording
        that ends inside this effect: what it holds is kept)."""
        self._driver.absorb_effects()

    @property
    def executor(self) -> Any:
        """The run's bounded executor, where the effect's blocking work goes."""
        return self._driver.executor()


def _stopped_cleanly(events: Sequence[Event]) -> bool:
    """Whether the process that last drove the run stopped with nothing in flight:
    its log ends at a wait for a person (answers may follow it) or at an interrupt
    (which stops its effects before it is recorded)."""
    for event in reversed(events):
        if isinstance(event, HumanInputReceived | ApprovalSigned):
            continue
        return isinstance(event, HumanInputRequested | RunInterrupted)
    return False


def _effect_error(exc: BaseException, token: CancelToken) -> BaseException:
    """How an effect's task ended, as the driver reads it: a task cancelled under it
    (its loop stopping) is the effect cancelled, a :class:`GraphrunError`."""
    import asyncio

    if isinstance(exc, asyncio.CancelledError):
        return GraphrunError(f"cancelled ({token.reason or 'the run ended'})")
    return exc


def store_lost(exc: BaseException) -> bool:
    """Whether an error raised under an effect is the store's (unreachable, full,
    locked, the lease gone), not the node's: the run stops resumable instead of
    recording a failure. A damaged or missing log that an effect reads (a child's)
    stays the node's failure."""
    return isinstance(exc, StoreError) and not isinstance(exc, CorruptStoreError | UnknownRunError)


def seed_state(
    loaded: LoadedGraph, prompt: str, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """initial_state, then --set overrides, then initial_prompt (always the caller's)."""
    state = dict(loaded.graph.initial_state)
    state.update(loaded.seed_state)
    state.update(overrides or {})
    state["initial_prompt"] = prompt
    return state


def check_graph(
    loaded: LoadedGraph, *, agents_dir: Path | None, config_dir: Path | None, deep: bool = True
) -> list[Diagnostic]:
    """Run the validator; raise on errors, return the warnings."""
    from graphrun.runtime.graph.validate import Check, validate

    found = validate(Check(loaded, agents_dir=agents_dir, config_dir=config_dir, deep=deep))
    errors = [d for d in found if d.severity == "error"]
    if errors:
        raise GraphValidationError(found, path=loaded.file)
    return found


def start_run(
    store: Store,
    loaded: LoadedGraph,
    *,
    prompt: str = "",
    overrides: dict[str, Any] | None = None,
    started_by: str | None = None,
    parent_run_id: str | None = None,
    parent_node_id: str | None = None,
    run_id: str | None = None,
    config: dict[str, Any] | None = None,
    recorded_from: str | None = None,
) -> str:
    """Record ``RunStarted`` for a new run and return its id (the graph is not run yet).

    ``config`` is the configuration the run begins with (see :func:`run_config`);
    ``recorded_from`` the recorded run whose effects it reuses."""
    run_id = run_id or new_run_id()
    files: dict[str, str] = {}
    for node in loaded.graph.nodes.values():
        script = getattr(node, "script", None)
        if script:
            with contextlib.suppress(OSError):
                files[script] = content_hash((loaded.agent_dir / script).read_bytes())
    event = RunStarted(
        graph_name=loaded.graph.name,
        graph_source=loaded.source,
        graph_hash=content_hash(loaded.source),
        graph_path=loaded.resolved[0],
        agent_dir=loaded.resolved[1],
        initial_state=seed_state(loaded, prompt, overrides),
        initial_prompt=prompt,
        parent_run_id=parent_run_id,
        parent_node_id=parent_node_id,
        started_by=whoami(started_by),
        host=socket.gethostname(),
        graphrun_version=GRAPHRUN_VERSION,
        files=files,
        config=config or {},
        recorded_from=recorded_from,
    )
    store.append(run_id, [event])
    return run_id


def run_config(loaded: LoadedGraph, options: RunOptions) -> dict[str, Any]:
    """What a run is recorded to begin with, so every later command (``resume``,
    ``approve``, ``answer``, ``fork``) continues it the same way: the config and
    agents directories and each llm node's model as resolved. Never a key."""
    config: dict[str, Any] = {}
    if options.config_dir is not None:
        config["config_dir"] = str(Path(options.config_dir).resolve())
    if options.agents_dir is not None:
        config["agents_dir"] = str(Path(options.agents_dir).resolve())
    if options.variables is not None:
        config["variables"] = dict(options.variables)
    graph = loaded.graph
    models = {
        node_id: getattr(node, "model", None) or graph.model or ""
        for node_id, node in graph.nodes.items()
        if node.type == "llm"
    }
    if models:
        config["models"] = models
        base_urls = {
            name: os.environ[name]
            for name in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL")
            if os.environ.get(name)
        }
        if base_urls:
            config["base_urls"] = base_urls
    return config


def recorded_config(store: Store, run_id: str, *, first: Event | None = None) -> dict[str, Any]:
    """The configuration a run began with (its root run's, for a child run).
    ``first``: the run's ``RunStarted``, when the caller has it (else it is read)."""
    if first is None:
        events = store.read(run_id, upto=1)
        first = events[0] if events else None
    if not isinstance(first, RunStarted):
        return {}
    own = dict(first.config)
    # A child run records its own variables only: the rest is its parent's.
    if set(own) <= {"variables"} and first.parent_run_id and store.has_run(first.parent_run_id):
        return {**recorded_config(store, first.parent_run_id), **own}
    return own


class PersonTime:
    """The time a person has been asked on the terminal in a run, or in a run it
    started: the run's timeouts do not count it, as they do not count a run that
    pauses for a person (exit 3, then ``graphrun approve``). A child run's adds up
    into its parent's. Any thread."""

    def __init__(self, monotonic: Callable[[], float], parent: PersonTime | None = None) -> None:
        self._monotonic = monotonic
        self._parent = parent
        self._lock = threading.Lock()
        self._asking = 0  # questions open now (a parallel step's child runs may ask two)
        self._since = 0.0
        self._total = 0.0

    @contextlib.contextmanager
    def asking(self) -> Iterator[None]:
        """A person is asked for the block's length."""
        self._begin()
        try:
            yield
        finally:
            self._end()

    def _begin(self) -> None:
        with self._lock:
            if not self._asking:
                self._since = self._monotonic()
            self._asking += 1
        if self._parent is not None:
            self._parent._begin()

    def _end(self) -> None:
        with self._lock:
            self._asking -= 1
            if not self._asking:
                self._total += self._monotonic() - self._since
        if self._parent is not None:
            self._parent._end()

    @property
    def now(self) -> bool:
        """Whether a person is being asked at this moment."""
        return self._asking > 0

    def total(self) -> float:
        """Seconds a person has been asked so far (the question open now included)."""
        with self._lock:
            open_for = self._monotonic() - self._since if self._asking else 0.0
            return self._total + open_for


class Deadline:
    """A run's ``settings.timeout`` from now, moved on by the time a person is asked
    (:class:`PersonTime`) until it passes."""

    __slots__ = ("_at", "_credited", "_monotonic", "_person")

    def __init__(self, timeout: float, person: PersonTime, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self._at = monotonic() + timeout
        self._person = person
        self._credited = person.total()

    def left(self) -> float:
        """Seconds left: none once it passed; unbounded while a person is asked (the
        clock stands still, however little was left when the question came)."""
        if self._person.now:
            return math.inf
        return self._at + (self._person.total() - self._credited) - self._monotonic()

    def passed(self) -> bool:
        return self.left() <= 0


class Driver:
    """Drives one run to its end, to a wait for a person, or to cancellation."""

    # Set when driving starts (from the log): the committed state, the working state
    # (committed + buffered events), the run's graph and its agent directory.
    durable: RunState
    state: RunState
    graph: Graph
    agent_dir: Path

    def __init__(
        self,
        store: Store,
        run_id: str,
        options: RunOptions | None = None,
        *,
        clock: Clock | None = None,
        cancel: CancelToken | None = None,
        resumed_by: str | None = None,
        loaded: LoadedRun | None = None,
    ) -> None:
        self.store = store
        self.run_id = run_id
        # The run as the command that continues it opened it (read and verified
        # once): driving takes it instead of reading the log again.
        self.loaded = loaded if loaded is not None and loaded.run_id == run_id else None
        self.options = options or RunOptions()
        self.clock = clock or Clock()
        self.cancel = cancel or CancelToken()
        self.node_cancel = CancelToken()
        self.resumed_by = resumed_by
        self._pending: list[Event] = []
        self._effects: list[Event] = []
        # Guards ``_effects`` alone, so that effects record while a commit holds
        # ``_pending_lock`` (taken after it, never before it).
        self._effects_lock = threading.Lock()
        self.timed_out: float | None = None
        # The time a person is asked on the terminal, here or in a child run: the
        # run's timeout does not count it (as it does not count a run's wait for one).
        # A child run's driver is given one that adds up into its parent's.
        self.person = PersonTime(self.clock.monotonic)
        self.refused: GraphrunError | None = None
        self._pending_lock = threading.Lock()
        self._effects_by_type: dict[str, Any] = {}
        # What awaits a visit of each node type's effect (made with the effect).
        self._runners_by_type: dict[str, Any] = {}
        self._tmp_dir: Path | None = None
        # Child runs started by this run's agent nodes (their tokens and drivers).
        self.children = ChildRuns(interrupted=lambda: self.interrupted)
        # Set by interrupt(): (signal name, reason); the run stops resumable.
        self.interrupted: tuple[str, str] | None = None
        # The cancel tokens of effects in flight (a super-step runs several at once).
        self._tokens: set[CancelToken] = set()
        # The loop the run's effects are awaited on (its own, made when first needed,
        # unless the options bring one: a worker's, a parent run's), and the bounded
        # executor their blocking work goes to.
        self._loop: EffectLoop | None = self.options.effect_loop
        self._owns_loop = self._loop is None
        self._executor: Any = None
        self._executor_size = 0
        self._loop_lock = threading.Lock()
        self._effect_lock = threading.Lock()
        # Who cancelled the run from another process (its cancel request), and when
        # to look for a request and renew the lease next (time.monotonic()).
        self.cancelled_by = ""
        self._poll_at = 0.0
        self._renew_at = time.monotonic() + _LEASE_RENEW_EVERY

    # -- buffering ----------------------------------------------------------------

    def _stamp(self, events: Sequence[Event]) -> list[Event]:
        """The events with their envelope (run id, next seqs, time); under the lock.

        Stamping here, not in the store, lets the working state be folded from
        the very events that get committed, so a commit needs no second fold."""
        seq = self.durable.last_seq + len(self._pending)
        now = self.clock.now()
        run_id = self.run_id
        stamped = []
        for event in events:
            seq += 1
            stamped.append(_replace(event, run_id=run_id, seq=seq, ts=event.ts or now))
        return stamped

    def buffer(self, events: tuple[Event, ...] | list[Event]) -> list[Event]:
        with self._pending_lock:
            stamped = self._stamp(events)
            self._pending.extend(stamped)
        return stamped

    def record_effects(self, events: tuple[Event, ...] | list[Event], branch: str = "") -> None:
        """Effect events from an effect (any thread), kept until the effect's next
        :meth:`checkpoint` or its end, whichever comes first: an effect checkpoints
        before anything it does next outside the process (an HTTP call, a tool, a
        child run), so every recorded fact is durable before it is acted on, and a
        one-call node commits once, with the decisions that use its result."""
        if branch:
            events = [e if e.branch == branch else _replace(e, branch=branch) for e in events]
        with self._effects_lock:
            self._effects.extend(events)

    def uncommitted(self) -> list[Event]:
        """The stamped events not committed yet (the budget policy counts them too)."""
        with self._pending_lock:
            return list(self._pending)

    def checkpoint(self, branch: str = "") -> None:
        """Commit now what an effect of ``branch`` recorded so far (any thread), except
        its results: those stay for the decisions that use them, since the decider
        takes a result as the effect's end (an agent node still extracts after its
        child's ``ChildRunFinished``)."""
        with self._effects_lock:
            # Nothing of this branch to commit (an llm node's first call): no wait for
            # a commit in progress.
            if not any(
                e.branch == branch and not isinstance(e, RESULT_TYPES) for e in self._effects
            ):
                return
        with self._pending_lock:
            with self._effects_lock:
                mine = [
                    e
                    for e in self._effects
                    if e.branch == branch and not isinstance(e, RESULT_TYPES)
                ]
                if not mine:
                    return
                taken = {id(e) for e in mine}
                self._effects = [e for e in self._effects if id(e) not in taken]
            stamped = self._stamp(mine)
            self._pending.extend(stamped)
            state = self.state
            for event in stamped:
                state = apply(state, event)
            self.state = state
            self._flush_locked()

    def absorb_effects(self) -> int:
        """Fold the effect events recorded so far and queue them for the next commit."""
        with self._pending_lock:
            with self._effects_lock:
                effects, self._effects = self._effects, []
            stamped = self._stamp(effects)
            self._pending.extend(stamped)
            state = self.state
            for event in stamped:
                state = apply(state, event)
            self.state = state
        return len(stamped)

    def discard_pending(self) -> None:
        """Drop what is not committed yet (a resume that only offered a refused answer)."""
        with self._pending_lock:
            self._pending.clear()
        self.state = self.durable

    def flush(self) -> None:
        with self._pending_lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        sync = any(isinstance(e, HumanInputReceived | HumanInputRequested) for e in pending)
        try:
            self.store.append(self.run_id, pending, sync=sync)
        except BaseException:
            # Nothing of these was committed: the working state goes back to the log's.
            self.state = self.durable
            raise
        # The working state was folded from exactly these events, in this order.
        self.durable = self.state
        if self.options.listener is not None:
            try:
                self.options.listener(pending, self.durable)
            except OSError:  # narration to a closed pipe never stops a run
                pass

    def _speculate(self, events: tuple[Event, ...]) -> None:
        """Buffer decision events and fold them into the working state."""
        state = self.state
        for event in self.buffer(events):
            state = apply(state, event)
        self.state = state

    # -- the loop ------------------------------------------------------------------

    def drive(self) -> RunOutcome:
        # Cancelling the run cancels whatever node is in flight. Unhooked when the
        # drive ends, which also frees the driver without the cyclic collector.
        unhook = self.cancel.on_cancel(self._cancel_node)
        try:
            return self._lease_and_drive()
        finally:
            unhook()

    def _require_answers_allowed(
        self, events: Sequence[Event], hashes: Mapping[int, str] | None = None
    ) -> None:
        from graphrun.eventstore.events import ApprovalSigned
        from graphrun.runtime.decisions import make_trust
        from graphrun.runtime.decisions.sshsig import find_signers
        from graphrun.runtime.decisions.verify import require_answers_allowed
        from graphrun.runtime.graph.config import config_dir as default_config_dir

        # From the end: a run continued after an answer finds it at once.
        if not any(isinstance(e, HumanInputReceived | ApprovalSigned) for e in reversed(events)):
            return
        first = events[0]
        config = getattr(first, "config", {}) or {}
        signers = find_signers(
            self.options.signers,
            graph_dir=getattr(first, "agent_dir", "") or None,
            config_dir=self.options.config_dir or config.get("config_dir") or default_config_dir(),
        )
        if hashes is None:
            hashes = {seq: digest for seq, _b, _p, digest in self.store.raw_rows(self.run_id)}
        require_answers_allowed(events, make_trust(signers), hashes=hashes)

    def _sign_head(self) -> None:
        """Sign the head the run is left at, when a head key is configured."""
        from graphrun.runtime.decisions.heads import sign_head

        try:
            sign_head(self.store, self.run_id)
        except GraphrunError as exc:
            log.warning("run %s: the head was not signed: %s", self.run_id, exc)

    def _cancel_node(self) -> None:
        self.node_cancel.cancel(self.cancel.reason or "cancelled")

    def _lease_and_drive(self) -> RunOutcome:
        self.store.acquire_lease(self.run_id)
        driven = False
        try:
            outcome = self._drive()
            driven = True
            keep_snapshot(self.store, self.run_id, outcome.status)  # for whoever continues it
            return outcome
        finally:
            if not driven:
                # Stopped by an error (the store's, a bug): nothing of this run
                # goes on running behind it.
                self.node_cancel.cancel("the run stopped")
                for token in list(self._tokens):
                    token.cancel("the run stopped")
            with contextlib.suppress(GraphrunError):
                self.flush()
            if driven:
                self._sign_head()
            self.store.release_lease(self.run_id)
            self._let_go()
            if self._owns_loop and self._loop is not None:
                self._loop.stop()  # (waits for the stop _let_go began)
            if self._tmp_dir is not None:
                shutil.rmtree(self._tmp_dir, ignore_errors=True)

    def _let_go(self) -> None:
        """Close what the run's effects hold (a pool, MCP sessions), shut its executor
        down and begin stopping its own loop, without waiting for the loop's thread.
        Called once nothing more is performed, and again (a no-op) as the drive ends."""
        effects, self._effects_by_type = list(self._effects_by_type.values()), {}
        for effect in effects:
            close = getattr(effect, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()
        if self._executor is not None:
            # Whatever still runs there is abandoned (a retrieval past its timeout):
            # the run has ended and records nothing more from it.
            # (Shut down twice is no harm; kept, nothing is submitted to it again.)
            self._executor.shutdown(wait=False, cancel_futures=True)
        if self._owns_loop and self._loop is not None:
            self._loop.begin_stop()

    @property
    def ports(self) -> RunPorts:
        """What this run's effects get (made when driving starts)."""
        return RunPorts(
            run_id=self.run_id,
            graph=self.graph,
            agent_dir=self.agent_dir,
            options=self.options,
            store=self.store,
            scratch=lambda: self.tmp_dir,
            children=self.children,
            launcher=_ChildDriving(self),
            loop=self.effect_loop,
        )

    @property
    def effect_loop(self) -> EffectLoop:
        """The loop this run's effects are awaited on (made on first use)."""
        with self._loop_lock:
            if self._loop is None:
                self._loop = EffectLoop(f"graphrun-loop-{self.run_id[:8]}")
            return self._loop

    def executor(self, size: int = 0) -> Any:
        """The run's bounded executor for blocking work, with room for ``size``
        threads at least (made anew between steps when a step needs more; threads
        start only as work comes)."""
        import concurrent.futures as cf

        size = max(size, _MIN_EXECUTOR, self.graph.settings.max_concurrency)
        with self._loop_lock:
            if self._executor is None or self._executor_size < size:
                if self._executor is not None:
                    self._executor.shutdown(wait=False)
                self._executor_size = size
                self._executor = cf.ThreadPoolExecutor(
                    max_workers=size, thread_name_prefix=f"graphrun-{self.run_id[:8]}"
                )
            return self._executor

    @property
    def tmp_dir(self) -> Path:
        """The run's scratch directory (large script states), made on first use."""
        if self._tmp_dir is None:
            self._tmp_dir = Path(tempfile.mkdtemp(prefix="graphrun-"))
        return self._tmp_dir

    def _opened(self) -> tuple[Sequence[Event], RunState, Mapping[int, str] | None, bool]:
        """The run's events, their fold, their chain hashes (when at hand) and whether
        they were verified: the run its command opened, while the log still ends
        there (this driver holds the lease now), else read here."""
        if self.loaded is not None:
            run = still_current(self.store, self.loaded)
            self.loaded = None  # what it holds is the driver's state from here on
            return run.events, run.state, run.hashes, True
        events = self.store.read(self.run_id)
        return events, fold(events), None, False

    def _drive(self) -> RunOutcome:
        events, self.durable, hashes, verified = self._opened()
        self.state = self.durable
        if self.state.terminal:
            return self._outcome()
        loaded = graph_of(self.state)
        self.graph = loaded.graph
        self.agent_dir = loaded.agent_dir
        resumed = any(not isinstance(e, RunStarted) for e in events)
        if resumed:
            # Never extend a log that does not verify (whoever resumes: a command,
            # a worker, an answer).
            if not verified:
                self.store.require_intact(self.run_id)
            # Nor one holding an answer the governing graph does not allow.
            self._require_answers_allowed(events, hashes)
            # A graphrun killed outright may have left a script or tool running on
            # this host (if its lifeline died with it): end it before the node is
            # performed again, never beside it. A log that ends at a wait for a
            # person (and its answers) or at an interrupt had nothing in flight.
            if not _stopped_cleanly(events):
                process.end_orphans()
            self._speculate(
                (
                    RunResumed(
                        by=whoami(self.resumed_by),
                        host=socket.gethostname(),
                        pid=os.getpid(),
                        reason="resume",
                    ),
                )
            )
            # Committed with the first step that follows: a resume that only offers
            # a refused answer leaves the log exactly as it was.
        elif self.options.listener is not None:
            self.options.listener(list(events), self.durable)
        timeout = self.graph.settings.timeout
        deadline = Deadline(timeout, self.person, self.clock.monotonic) if timeout else None
        # A recorded source stops the loop where its log stops (``LogEnds``).
        before_decide = getattr(self.options.effect_source, "before_decide", None)
        while True:
            # A policy that ended the run mid-effect (a timeout) must not fire again.
            if self.state.terminal:
                break
            if self.interrupted is not None:
                break
            if self._cancel_requested():
                reason = self.cancel.reason or "cancelled"
                self._speculate((RunCancelled(reason=reason, by=self.cancelled_by),))
                break
            if deadline is not None and deadline.passed():
                self._timeout(timeout, None)
                break
            if before_decide is not None:
                before_decide(self.state)
            step = decider.decide(self.graph, self.state)
            if isinstance(step, decider.Finished):
                break
            if self.state.terminal:
                break
            if isinstance(step, decider.Append):
                self._speculate(step.events)
                continue
            if isinstance(step, decider.PerformMany):
                self.flush()
                waiting = self._perform_many(step.tasks, deadline, timeout, step.join)
                if self.interrupted is not None:
                    break
                if waiting is not None:
                    self.flush()
                    return RunOutcome(self.run_id, "waiting", waiting=waiting)
                continue
            if not (step.node_type in _ASKS_A_PERSON and self._only_resumed()):
                self.flush()
            waiting = self._perform(step, deadline, timeout)
            if self.interrupted is not None:
                break
            if waiting is not None:
                refused = self.refused
                if refused is not None and self._only_resumed():
                    self.discard_pending()
                self.flush()
                return RunOutcome(self.run_id, "waiting", waiting=waiting, refused=refused)
        if self.interrupted is not None:
            self.absorb_effects()
            self._speculate(
                (RunInterrupted(reason=self.interrupted[1], signal=self.interrupted[0]),)
            )
            self.flush()
            return RunOutcome(
                self.run_id, "interrupted", error=self.interrupted[1], signal=self.interrupted[0]
            )
        self._end_children()
        # Nothing more is performed: the pools close while the last commit is written.
        self._let_go()
        self.flush()
        return self._outcome()

    def interrupt(self, signal_name: str, reason: str) -> None:
        """Stop the run so that ``resume`` continues it (Ctrl-C, SIGTERM): in-flight
        effects are cancelled (their process groups killed) and ``RunInterrupted``
        is recorded. Callable from any thread or a signal handler."""
        if self.interrupted is None:
            self.interrupted = (signal_name, reason)
        for child in list(self.children.drivers.values()):
            child.interrupt(signal_name, reason)
        for token in list(self._tokens):
            token.cancel(reason)
        self.node_cancel.cancel(reason)
        for token in list(self.children.tokens.values()):
            token.cancel(reason)

    def _only_resumed(self) -> bool:
        """Whether nothing but a ``RunResumed`` waits to be committed."""
        with self._pending_lock:
            return bool(self._pending) and all(isinstance(e, RunResumed) for e in self._pending)

    def _end_children(self) -> None:
        """A run that ends cancels every child run it started that is still running."""
        for child, status in list(self.state.children.items()):
            if status != "running":
                continue
            reason = f"parent run {self.run_id} ended ({self.state.status})"
            token = self.children.tokens.get(child)
            if token is not None:
                token.cancel(reason)
            else:
                with contextlib.suppress(GraphrunError):
                    if self.store.has_run(child) and not fold(self.store.read(child)).terminal:
                        cancel_run(self.store, child, reason=reason)
            self._speculate((ChildCancelled(child_run_id=child, reason=reason),))

    def _perform(
        self, step: decider.Perform, deadline: Deadline | None, timeout: float | None
    ) -> HumanInputRequested | None:
        node_id = step.node_id
        visit = self.state.current_visit
        self.node_cancel = CancelToken()
        if self.cancel.cancelled:
            self.node_cancel.cancel(self.cancel.reason or "cancelled")
        if self.interrupted is not None:
            self.node_cancel.cancel(self.interrupted[1])
        prior = since_last_retry(self.state.effects)
        ctx = _Context(self, node_id, visit, cancel=self.node_cancel, prior=prior)
        source = self.options.effect_source
        if source is not None:
            # A recorded outcome (replay, regression) instead of the effect; the log
            # ending here (``LogEnds``) stops the loop.
            try:
                served = source.take(step, visit, ctx)
            except WaitingForHuman:  # the recording waits for a person here
                self.absorb_effects()
                return self.state.waiting
            if served is not None:
                self.record_effects(served.events)
                self.absorb_effects()
                if served.error is not None:
                    self._effect_failed(node_id, visit, served.error)
                return None
        if not self._wait_out_retry(self.state.effects, self.node_cancel, deadline):
            return None  # cancelled, interrupted or out of time while waiting
        if source is None and self._served_from_cache(step, visit):
            return None
        future = None
        try:
            effect = self._effect(step.node_type)
            inline = getattr(effect, "inline", None)
            if inline is not None and inline(step.task):
                # An effect that does no I/O and cannot block (a replayed LLM call):
                # served here, like a recorded effect, without the actor hand-off.
                effect.perform(step.task, ctx)
            else:
                # A person asked on the terminal: the run's clock stops meanwhile (and
                # so do its ancestors').
                asking = step.node_type in _ASKS_A_PERSON
                future = self.effect_loop.start(self._runner(step.node_type)(step.task, ctx))
                with self.person.asking() if asking else contextlib.nullcontext():
                    self._wait(future, deadline, timeout, node_id)
                failed = future.exception() if future.done() else None
                if failed is not None and self.timed_out is None:
                    raise _effect_error(failed, self.node_cancel)
        except WaitingForHuman as exc:
            self.absorb_effects()
            cause = exc.__cause__
            self.refused = cause if isinstance(cause, GraphrunError) else None
            return getattr(exc, "request", None) or self.state.waiting
        except GraphrunError as exc:
            if store_lost(exc):
                self._stop_in_flight(exc, future)
                raise
            if self.interrupted is not None:
                self._discard_results(None)
                return None
            self.absorb_effects()
            if self.cancel.cancelled and self.node_cancel.cancelled:
                # Stopped because the run is being cancelled (a question withdrawn,
                # say): the loop records RunCancelled, not the node's failure.
                return None
            self._effect_failed(node_id, visit, str(exc))
            return None
        except Exception as exc:  # an actor bug must still end the run cleanly
            log.debug("effect of node %s raised", node_id, exc_info=True)
            if self.interrupted is not None:
                self._discard_results(None)
                return None
            self.absorb_effects()
            self._effect_failed(node_id, visit, f"internal error: {type(exc).__name__}: {exc}")
            return None
        if self.interrupted is not None:
            self._discard_results(None)
            return None
        produced = self.absorb_effects()
        if self.timed_out is None and not produced and not self.state.terminal:
            self._effect_failed(node_id, visit, f"{step.node_type} node produced no result")
        elif produced and not self.state.terminal:
            from graphrun.runtime.engine.usage import driver_budget_breach

            breach = driver_budget_breach(self)
            if breach is not None:
                self._effect_failed(node_id, visit, breach)
        return None

    # -- a super-step: several effects at once -----------------------------------

    def _perform_many(
        self,
        tasks: tuple[decider.Perform, ...],
        deadline: Deadline | None,
        timeout: float | None,
        join_policy: Any = None,
    ) -> HumanInputRequested | None:
        """Perform a step's effects concurrently, within their concurrency caps.

        Each effect's events are committed as they happen and its result the moment
        it finishes, so a crash loses at most the effects still in flight. Returns
        the request of a branch that waits for a person (the others finish first)."""
        caps = {"": max(1, self.graph.settings.max_concurrency)}
        for task in tasks:
            if task.group:
                caps[task.group] = max(1, task.cap)
        self.executor(sum(caps.values()))
        waiting: HumanInputRequested | None = None
        failures: list[tuple[str, decider.Perform, str]] = []
        queue = list(tasks)
        join = _Join(self, join_policy, tasks)
        if self.options.effect_source is not None:
            # Recorded outcomes (replay, regression) are served first, in step order;
            # what is left is performed for real.
            live = []
            recorded_join = getattr(self.options.effect_source, "joined", None)
            settled = recorded_join(self.state.step) if recorded_join is not None else None
            if settled is not None:
                # The recorded run cancelled these branches: they are not served.
                queue = [t for t in queue if t.branch not in settled.cancelled]
            served: list[str] = []
            for task in queue:
                outcome = self._serve(task)
                if outcome is None:
                    live.append(task)
                elif outcome[0] == "waiting" and waiting is None:
                    waiting = outcome[1]
                elif outcome[0] == "failed":
                    failures.append((task.branch, task, outcome[1]))
                    join.effect_failed(task.branch, outcome[1])
                else:
                    served.append(task.branch)
            if len(live) < len(queue):
                self.absorb_effects()
                self.flush()
                join.observe(served)
            queue = live
            if settled is not None:
                join.failed |= set(settled.failed)
                join.settle(settled.cancelled, settled.reason)
            elif recorded_join is not None:
                # The recorded run let every branch finish: so does its replay (a
                # branch re-run for a regression is not cut short).
                join.active = False
        for node_type in {task.node_type for task in queue}:
            # Made here, on the driver's thread: a slot freed on the run's loop
            # must not stall that loop building an effect (loading an index, say). One
            # that cannot be made fails each of its tasks as it starts (_Slots._start).
            with contextlib.suppress(Exception):
                self._effect(node_type)
        if queue and join.active and not join.settled and join.holds():
            # Resumed after enough branches had finished (a crash before the join
            # was recorded): the others are not started again.
            join.settle([t.branch for t in queue], "join satisfied")
            queue = []
        elif queue and join.counting and not join.settled and join.lost():
            join.settle([t.branch for t in queue], join.lost_reason())
            queue = []
        step = _Slots(self, caps, queue)
        join.start(self.clock.monotonic())
        step.fill()
        while step.outstanding():
            slice_ = _CANCEL_POLL_EVERY
            if deadline is not None and not step.timed_out:
                slice_ = max(0.0, min(slice_, deadline.left()))
            if join.deadline is not None and not join.settled:
                slice_ = max(0.0, min(slice_, join.deadline - self.clock.monotonic()))
            done = step.finished(slice_)
            ok: list[str] = []
            for task, token, ctx, future in done:
                kind, detail = self._settle(task, token, ctx, future)
                if token.cancelled and (
                    self.interrupted is not None or task.branch in join.cancelled
                ):
                    self._discard_results(task.branch)
                    continue
                if kind == "waiting" and waiting is None:
                    waiting = detail
                elif kind == "failed" and not token.cancelled:
                    failures.append((task.branch, task, detail))
                    join.effect_failed(task.branch, detail)
                elif kind == "ok" and not token.cancelled:
                    ok.append(task.branch)
            if done:
                # One commit for every effect that finished since the last wake-up.
                self.absorb_effects()
                self.flush()
                join.observe(ok)
                self._cancel_requested()
                if (
                    join.active
                    and not join.settled
                    and join.holds()
                    and (step.outstanding() or join.failed)
                ):
                    # Enough branches finished (a failed one is left out, recorded).
                    join.settle(step.cancel_rest("join satisfied"), "join satisfied")
                elif join.counting and not join.settled and join.lost():
                    # Too many failed for the join to hold: the step fails now.
                    reason = join.lost_reason()
                    join.settle(step.cancel_rest(reason), reason)
            elif (
                join.deadline is not None
                and not join.settled
                and self.clock.monotonic() >= join.deadline
            ):
                reason = join.timeout_reason()
                join.settle(step.cancel_rest(reason), reason)
            elif deadline is not None and not step.timed_out and deadline.passed():
                step.time_out(f"run timeout ({timeout:g}s)")
            else:
                self._while_in_flight()
        if step.timed_out:
            assert timeout is not None
            self._timeout(timeout, None)
            return None
        if self.interrupted is not None or self.cancel.cancelled:
            return None
        if join.settled and join.holds():
            # The branches that failed before the join held are left out of the step.
            failures = [f for f in failures if f[0] not in join.failed]
        if join.settled and not join.holds() and (join.failed or not failures):
            join.fail()
        elif failures:
            branch, task, error = sorted(failures, key=lambda f: f[0])[0]
            self._speculate(
                (
                    NodeFailed(node_id=task.node_id, visit=task.visit, error=error, branch=branch),
                    RunFailed(error=f"node '{task.node_id}': {error}", node_id=task.node_id),
                )
            )
        elif not self.state.terminal:
            from graphrun.runtime.engine.usage import driver_budget_breach

            breach = driver_budget_breach(self)
            if breach is not None:
                self._speculate((RunFailed(error=breach),))
        return waiting

    def _serve(self, task: decider.Perform) -> tuple[str, Any] | None:
        """A branch's recorded outcome from the effect source, on the driver's thread
        (no hand-off: serving does no I/O); None when it is to be performed."""
        source = self.options.effect_source
        if source is None:
            return None
        prior = self.state.branch_effects.get(task.branch, ())
        ctx = _Context(self, task.node_id, task.visit, branch=task.branch, prior=prior)
        try:
            served = source.take(task, task.visit, ctx)
        except WaitingForHuman as exc:
            return "waiting", getattr(exc, "request", None)
        if served is None:
            return None
        self.record_effects(served.events, task.branch)
        if served.error is not None:
            return "failed", served.error
        return "ok", None

    def _effect_of(self, task: decider.Perform, token: CancelToken) -> tuple[Any, _Context]:
        """One effect of a super-step as a coroutine to start on the run's loop, and
        its context."""
        if self.interrupted is not None:
            token.cancel(self.interrupted[1])
        effects = self.state.branch_effects.get(task.branch, ())
        prior = since_last_retry(effects)
        ctx = _Context(
            self, task.node_id, task.visit, branch=task.branch, cancel=token, prior=prior
        )
        run = self._runner(task.node_type)
        retry = pending_retry(effects) if self.options.effect_source is None else None
        if retry is not None:
            return self._after_delay(retry, token, run, task.task, ctx), ctx
        return run(task.task, ctx), ctx

    async def _after_delay(
        self, retry: NodeRetrying, token: CancelToken, run: Any, task: Any, ctx: _Context
    ) -> Any:
        """A branch's next attempt, once its retry delay has passed (or never, when
        the branch is cancelled meanwhile): the wait is an asyncio wait."""
        import asyncio

        left = retry.ts + retry.delay - self.clock.now()
        if left > 0:
            loop = asyncio.get_running_loop()
            woken = loop.create_future()

            def wake() -> None:
                if not woken.done():
                    woken.set_result(None)

            unhook = token.on_cancel(lambda: loop.call_soon_threadsafe(wake))
            try:
                await asyncio.wait([woken], timeout=left)
            finally:
                unhook()
            if token.cancelled:
                raise GraphrunError(token.reason or "cancelled")
        return await run(task, ctx)

    def _served_from_cache(self, step: decider.Perform, visit: int) -> bool:
        """A node with ``cache:``: serve an earlier run's recorded effect for the same
        request (a hit), or mark this one as performed here (a miss)."""
        policy = getattr(self.graph.nodes.get(step.node_id), "cache", None)
        if policy is None:
            return False
        key = cache_key(step.node_type, step.task, list(policy.key), self.state.state)
        found = find_cached(
            self.store,
            self.graph.name,
            key,
            ttl=policy.ttl,
            now=self.clock.now(),
            own_run=self.run_id,
        )
        if found is None:
            self.record_effects([CacheChecked(node_id=step.node_id, visit=visit, key=key)])
            return False
        marker, copied = found
        hit = CacheChecked(
            node_id=step.node_id,
            visit=visit,
            key=key,
            from_run=marker.run_id,
            from_seq=marker.seq,
        )
        self.record_effects([hit, *(_replace(e, visit=visit, branch="") for e in copied)])
        self.absorb_effects()
        return True

    def _wait_out_retry(
        self, effects: tuple[Any, ...], token: CancelToken, deadline: Deadline | None
    ) -> bool:
        """Wait what is left of a pending retry's delay (from its recorded time), in
        slices that watch for cancel requests and the run's timeout; a replay does
        not wait. Whether the attempt may start."""
        retry = pending_retry(effects)
        if retry is None or self.options.effect_source is not None:
            return True
        until = retry.ts + retry.delay
        while True:
            left = until - self.clock.now()
            if left <= 0:
                return True
            if token.wait(min(left, _CANCEL_POLL_EVERY)):
                return False
            self._while_in_flight()
            if self.cancel.cancelled or self.interrupted is not None:
                return False
            if deadline is not None and deadline.passed():
                return False

    def _settle(
        self, task: decider.Perform, token: CancelToken, ctx: _Context, future: Any
    ) -> tuple[str, Any]:
        """What a finished effect of a super-step came to: ``(kind, detail)``."""
        exc = future.exception()
        if exc is not None:
            exc = _effect_error(exc, token)
        if exc is None:
            if not ctx.recorded and not token.cancelled:
                return "failed", f"{task.node_type} node produced no result"
            return "ok", None
        if isinstance(exc, WaitingForHuman):
            return "waiting", getattr(exc, "request", None)
        if store_lost(exc):
            # The store refused the effect's checkpoint: not the node's failure.
            self._stop_in_flight(exc, None)
            raise exc
        if isinstance(exc, GraphrunError):
            return "failed", str(exc)
        # An effect bug must still end the run cleanly.
        log.debug("effect of node %s raised", task.node_id, exc_info=exc)
        return "failed", f"internal error: {type(exc).__name__}: {exc}"

    def _wait(
        self, future: TaskOutcome, deadline: Deadline | None, timeout: float | None, node_id: str
    ) -> None:
        """Wait for the node's effect in slices that watch for cancel requests, the
        lease and the run's timeout (which cancels the effect and fails the run)."""
        while True:
            slice_ = _CANCEL_POLL_EVERY
            if deadline is not None:
                slice_ = max(0.0, min(slice_, deadline.left()))
            if future.wait(slice_):
                return
            if deadline is not None and deadline.passed():
                self.node_cancel.cancel(f"run timeout ({timeout:g}s)")
                future.wait(30)
                assert timeout is not None
                self._timeout(timeout, node_id)
                return
            self._while_in_flight()

    def _cancel_requested(self) -> bool:
        """Whether the run is being cancelled: its token was (a parent ending), or
        ``graphrun cancel`` asked from another process (a cancel request in the
        store, looked for every ``_CANCEL_POLL_EVERY`` s). A request cancels the
        token, which stops the effects in flight (their process groups are
        killed); the loop then records ``RunCancelled`` by whoever asked."""
        if self.cancel.cancelled:
            return True
        now = time.monotonic()
        if now < self._poll_at:
            return False
        self._poll_at = now + _CANCEL_POLL_EVERY
        found = self.store.cancel_requested(self.run_id)
        if found is None:
            return False
        self.cancelled_by, reason = found
        log.info("run %s: cancel requested by %s (%s)", self.run_id, *found)
        self.cancel.cancel(reason)  # cancels the node in flight (see drive())
        for token in list(self._tokens):
            token.cancel(reason)
        return True

    def _while_in_flight(self) -> None:
        """Each slice an effect is still running: act on a cancel request, and renew
        the run's lease when it is due (not every slice)."""
        self._cancel_requested()
        now = time.monotonic()
        if now >= self._renew_at:
            self._renew_at = now + _LEASE_RENEW_EVERY
            self.store.renew_lease(self.run_id)

    def _timeout(self, timeout: float | None, node_id: str | None) -> None:
        self.timed_out = timeout or 0.0
        self.absorb_effects()
        self._speculate(
            (
                TimeoutFired(scope="run", timeout_s=timeout or 0.0, node_id=node_id),
                RunFailed(
                    error=f"run timed out after {timeout:g}s (settings.timeout)"
                    + (f" in node '{node_id}'" if node_id else ""),
                    node_id=node_id,
                ),
            )
        )

    def _stop_in_flight(self, exc: BaseException, future: Any) -> None:
        """The store went away (or the run's lease did) under an effect: whatever is
        still running is cancelled, and the run stops where its log says, resumable.
        It is not the node's failure: nothing is recorded for it."""
        reason = f"the event store failed: {exc}"
        self.node_cancel.cancel(reason)
        for token in list(self._tokens):
            token.cancel(reason)
        if future is not None:
            future.wait(30)
        with self._effects_lock:
            self._effects.clear()

    def _effect_failed(self, node_id: str, visit: int, error: str) -> None:
        self._speculate(
            (
                NodeFailed(node_id=node_id, visit=visit, error=error),
                RunFailed(error=f"node '{node_id}': {error}", node_id=node_id),
            )
        )

    def _effect(self, node_type: str) -> Any:
        """The object performing ``node_type``'s effects in this run (made on first use)."""
        effect = self._effects_by_type.get(node_type)
        if effect is None:
            with self._effect_lock:
                effect = self._effects_by_type.get(node_type)
                if effect is None:
                    from graphrun.runtime.engine.effects import actor_class

                    cls, args = actor_class(node_type, self.ports)
                    effect = self._effects_by_type[node_type] = cls(*args)
        return effect

    def _runner(self, node_type: str) -> Any:
        """What awaits one visit of ``node_type``'s effect (worked out once per run)."""
        run = self._runners_by_type.get(node_type)
        if run is None:
            run = self._runners_by_type[node_type] = runner(self._effect(node_type))
        return run

    def _discard_results(self, branch: str | None) -> None:
        """Forget the results of interrupted effects (of one branch, or all): an effect
        stopped by an interrupt did not complete, so resume performs it again. What
        it did complete before (an LLM turn, a tool's result) is kept and committed."""
        with self._effects_lock:
            self._effects = [
                e
                for e in self._effects
                if not (isinstance(e, RESULT_TYPES) and (branch is None or e.branch == branch))
            ]

    def _outcome(self) -> RunOutcome:
        s = self.state
        error = s.error
        if s.status == "cancelled" and self.cancelled_by:
            error = f"{error} (requested by {self.cancelled_by})"
        return RunOutcome(
            self.run_id,
            s.status,
            s.output,
            error,
            s.waiting,
            unhandled=s.unhandled,
            left_out=s.left_out,
        )


class _Join:
    """A super-step's join policy while its effects run: which branches finished,
    whether the policy holds, and the record of the branches it cancelled
    (:class:`BranchesJoined`), so that the decider merges only the counted ones and
    a replay or a resume settles the join the same way."""

    def __init__(self, driver: Driver, policy: Any, tasks: Sequence[decider.Perform]) -> None:
        self.driver = driver
        policy = dict(policy or {})
        self.type = str(policy.get("type") or "all")
        self.timeout: float | None = policy.get("timeout")
        running = {t.branch for t in tasks}
        self.branches = set(driver.state.branches) | running
        self.slots = dict(driver.state.branches)  # (they leave the state once settled)
        self.finished: set[str] = set()
        # Branches that failed before the join held (``any``/``count`` go on without
        # them while they can still hold), with their error and its kind.
        self.failed: set[str] = set()
        self.errors: dict[str, tuple[str, str]] = {}
        self.reason = ""
        count = policy.get("count")
        if self.type == "any":
            self.needed = 1
        elif self.type == "count" and count is not None:
            self.needed = int(count)
        else:
            self.needed = len(self.branches)
        self.active = bool(policy) and (self.type != "all" or self.timeout is not None)
        # An any/count join outlives a failed branch; `all` keeps failing the step.
        self.counting = self.active and self.type in ("any", "count")
        self.deadline: float | None = None
        self.settled = False
        self.cancelled: set[str] = set()
        # Branches of the step that finished before (a resume): they count, or failed.
        self.observe(sorted(self.branches - running))

    def observe(self, branches: Sequence[str]) -> None:
        """Note how branches whose effect is in stand (the decider says: completed,
        failed, or not yet: to be tried again, waiting for a person)."""
        driver = self.driver
        for bid in branches:
            status, error, kind = decider.branch_outcome(driver.graph, driver.state, bid)
            if status == "ok":
                self.finished.add(bid)
            elif status == "failed" and self.counting:
                self.failed.add(bid)
                self.errors[bid] = (error, kind)
            elif status == "failed":
                self.finished.add(bid)  # `all`: the merge fails the step, as before

    def _node_of(self, bid: str) -> str:
        slot = self.slots.get(bid)
        return slot.node_id if slot is not None else bid

    def _visit_of(self, bid: str) -> int:
        slot = self.slots.get(bid)
        return slot.visit if slot is not None else 0

    def error_of(self, branch: str) -> str:
        """What a failed branch failed with ("" when that is not known)."""
        return self.errors.get(branch, ("", ""))[0]

    def effect_failed(self, branch: str, error: str) -> None:
        """A branch's effect itself failed (no result to decide on)."""
        if self.counting:
            self.failed.add(branch)
            self.errors[branch] = (error, "")

    def lost(self) -> bool:
        """Too many branches failed for the join to hold with the others."""
        return len(self.branches) - len(self.failed) < self.needed

    def lost_reason(self) -> str:
        names = ", ".join(sorted(self.failed))
        return (
            f"join cannot hold: {len(self.failed)} of {len(self.branches)} branches failed "
            f"({names}), {self.needed} needed"
        )

    def start(self, now: float) -> None:
        if self.active and self.timeout is not None and self.driver.options.effect_source is None:
            # Measured from the step's start (a resume starts the wait again).
            self.deadline = now + self.timeout

    def holds(self) -> bool:
        return len(self.finished) >= self.needed

    def timeout_reason(self) -> str:
        return f"join timeout ({self.timeout:g}s)"

    def settle(self, cancelled: Sequence[str], reason: str) -> None:
        """Record which branches counted and which were cancelled."""
        self.settled = True
        self.reason = reason
        # A branch that neither counted nor failed is cancelled too (one to be tried
        # again after a failed attempt has no effect running to stop).
        self.cancelled = (set(cancelled) | (self.branches - self.finished)) - self.failed
        self.driver._speculate(
            (
                BranchesJoined(
                    step=self.driver.state.step,
                    counted=sorted(self.finished - self.failed),
                    cancelled=sorted(self.cancelled),
                    reason=reason,
                    failed=sorted(self.failed),
                    errors={b: e for b in sorted(self.failed) if (e := self.error_of(b))},
                ),
            )
        )
        self.driver.flush()

    def fail(self) -> None:
        """The timeout passed before the policy held, or too many branches failed for
        it to hold: the failed branches fail with their own error, the cancelled ones
        count as failed, and so does the step."""
        driver = self.driver
        state = driver.state
        failed: list[Event] = []
        if self.reason.startswith("join cannot hold"):
            for bid in sorted(self.failed):
                error, kind = self.errors.get(bid, ("failed", ""))
                failed.append(
                    NodeFailed(
                        node_id=self._node_of(bid),
                        visit=self._visit_of(bid),
                        error=error,
                        error_kind=kind,
                        branch=bid,
                    )
                )
            for bid in sorted(self.cancelled):
                failed.append(
                    NodeFailed(
                        node_id=self._node_of(bid),
                        visit=self._visit_of(bid),
                        error=f"cancelled: {self.reason}",
                        error_kind="Cancelled",
                        branch=bid,
                    )
                )
            failed.append(RunFailed(error=f"super-step {state.step}: {self.reason}"))
            driver._speculate(tuple(failed))
            return
        for bid in sorted(self.cancelled):
            slot = state.branches.get(bid)
            node_id = slot.node_id if slot is not None else bid
            visit = slot.visit if slot is not None else 0
            error = f"cancelled: {self.timeout_reason()}"
            failed.append(
                NodeFailed(
                    node_id=node_id, visit=visit, error=error, error_kind="TimeoutError", branch=bid
                )
            )
        names = ", ".join(sorted(self.cancelled)) or "none"
        failed.append(
            RunFailed(
                error=f"super-step {state.step}: {len(self.finished)} of {self.needed} "
                f"branches finished within the join timeout ({self.timeout:g}s); "
                f"cancelled: {names}"
            )
        )
        driver._speculate(tuple(failed))


class _Slots:
    """A super-step's effects in flight, within their groups' caps.

    A slot freed by a finishing effect starts the group's next effect at once, on the
    run's loop, as the effect before it finishes: the next call goes out
    without waiting for the driver's thread. The driver only takes what finished
    (:meth:`finished`), commits it, and decides what it came to. Nothing starts once
    the run is stopping (an interrupt, a cancel, the run's timeout)."""

    def __init__(self, driver: Driver, caps: dict[str, int], tasks: list[decider.Perform]) -> None:
        self.driver = driver
        self.caps = caps
        self.queues: dict[str, deque[decider.Perform]] = {group: deque() for group in caps}
        for task in tasks:
            self.queues[task.group].append(task)
        self.in_group = dict.fromkeys(caps, 0)
        self.running: dict[Any, tuple[decider.Perform, CancelToken, _Context]] = {}
        self.timed_out = False
        self.joined = False
        self._done: SimpleQueue[Any] = SimpleQueue()
        # Reentrant: an effect that is done as it starts runs its callback at once,
        # on the thread that is starting it.
        self._lock = threading.RLock()
        self._filling = False  # a fill in progress on the thread holding the lock

    def _stopping(self) -> bool:
        driver = self.driver
        return (
            self.timed_out
            or self.joined
            or driver.interrupted is not None
            or driver.cancel.cancelled
        )

    def cancel_rest(self, reason: str) -> list[str]:
        """Stop the step where it is (its join holds, or timed out): queued effects
        never start, running ones are cancelled (their process groups are killed,
        their child runs cancelled). The branches stopped, in node-id order."""
        with self._lock:
            self.joined = True
            stopped = [task.branch for queue in self.queues.values() for task in queue]
            for queue in self.queues.values():
                queue.clear()
            for task, token, _ctx in self.running.values():
                stopped.append(task.branch)
                token.cancel(reason)
        return sorted(set(stopped))

    def fill(self, group: str | None = None) -> None:
        """Start queued effects (of ``group``, or of every group) while their caps allow.

        The effects a fill starts are handed to the run's loop together (one wake-up
        of the loop for a map's first hundred calls, not one each)."""
        with self._lock:
            if self._filling:  # an effect that finished as it started: the fill goes on
                return
            self._filling = True
            try:
                while True:
                    starting: list[tuple[decider.Perform, CancelToken, _Context, Any]] = []
                    for name in (group,) if group is not None else tuple(self.queues):
                        queue = self.queues[name]
                        while queue and self.in_group[name] < self.caps[name]:
                            if self._stopping():
                                queue.clear()
                                break
                            starting.append(self._prepare(queue.popleft()))
                    if not starting:
                        break
                    # (An effect that failed as it started freed its slot: the fill
                    # goes round again.)
                    self._start(starting)
            finally:
                self._filling = False

    def _prepare(self, task: decider.Perform) -> tuple[decider.Perform, CancelToken, _Context, Any]:
        """``task``'s slot taken, its token, context and coroutine (or the error that
        made it: a bug, which fails the effect and lets the step go on)."""
        driver = self.driver
        self.in_group[task.group] += 1
        token = CancelToken()
        driver._tokens.add(token)
        try:
            coro, ctx = driver._effect_of(task, token)
        except Exception as exc:
            ctx = _Context(driver, task.node_id, task.visit, branch=task.branch, cancel=token)
            return task, token, ctx, exc
        return task, token, ctx, coro

    def _start(self, starting: list[tuple[decider.Perform, CancelToken, _Context, Any]]) -> None:
        coros = [coro for *_, coro in starting if not isinstance(coro, Exception)]
        try:
            outcomes = iter(self.driver.effect_loop.start_many(coros) if coros else ())
        except Exception as exc:  # a bug (the loop gone): each of them fails, the step goes on
            for coro in coros:
                coro.close()
            starting = [(task, token, ctx, exc) for task, token, ctx, _ in starting]
            outcomes = iter(())
        for task, token, ctx, coro in starting:
            if isinstance(coro, Exception):
                import concurrent.futures as cf

                future: Any = cf.Future()
                future.set_exception(coro)
            else:
                future = next(outcomes)
            self.running[future] = (task, token, ctx)
            # The slots themselves are the callback (:meth:`__call__`): no bound
            # method made per effect, and none kept that would tie them to themselves.
            future.add_done_callback(self)

    def __call__(self, future: Any) -> None:
        """An effect ended (any thread): its slot starts the next of its group, then
        the driver hears of it (whatever starting the next did: a callback's error
        would otherwise leave the driver waiting)."""
        try:
            with self._lock:
                task = self.running[future][0]
                self.in_group[task.group] -= 1
            self.fill(task.group)
        finally:
            self._done.put(future)

    def outstanding(self) -> bool:
        """Whether effects are in flight, or finished and not taken yet."""
        with self._lock:
            return bool(self.running)

    def finished(self, timeout: float) -> list[tuple[decider.Perform, CancelToken, _Context, Any]]:
        """The effects that finished, waiting up to ``timeout`` s for the first."""
        futures = []
        with contextlib.suppress(Empty):
            futures.append(self._done.get(timeout=timeout))
            while True:
                futures.append(self._done.get_nowait())
        taken = []
        with self._lock:
            for future in futures:
                task, token, ctx = self.running.pop(future)
                self.driver._tokens.discard(token)
                taken.append((task, token, ctx, future))
        return taken

    def time_out(self, reason: str) -> None:
        """The run's timeout: nothing more starts; what is in flight is cancelled."""
        with self._lock:
            self.timed_out = True
            tokens = [token for _, token, _ in self.running.values()]
        for token in tokens:
            token.cancel(reason)


def drive(driver: Driver) -> RunOutcome:
    """Drive a run inside a :class:`RunSupervisor` actor.

    Ctrl-C and SIGTERM *interrupt* the run (it stays resumable): in-flight effects are
    stopped, ``RunInterrupted`` is recorded and the outcome's status is
    ``"interrupted"``. The SIGTERM handler is installed only on the main thread, for
    the duration of the drive, and the previous one is put back."""
    import signal as signals

    previous: Any = None
    on_main = threading.current_thread() is threading.main_thread()
    if on_main:
        with contextlib.suppress(ValueError, OSError):
            previous = signals.signal(
                signals.SIGTERM,
                lambda *_: driver.interrupt("SIGTERM", "interrupted (SIGTERM)"),
            )
    ref = RunSupervisor.start(driver)
    try:
        future = ref.ask("drive", block=False)
        while True:
            try:
                return future.get(timeout=0.2)
            except KeyboardInterrupt:
                driver.interrupt("SIGINT", "interrupted (Ctrl-C)")
            except Exception as exc:
                import pykka

                if isinstance(exc, pykka.Timeout):
                    continue
                raise
    finally:
        if on_main and previous is not None:
            with contextlib.suppress(ValueError, OSError):
                signals.signal(signals.SIGTERM, previous)
        with contextlib.suppress(Exception):
            ref.stop(block=False)


def _make_supervisor() -> type:
    from graphrun.actors.base import light_actor

    class RunSupervisor(light_actor()):  # type: ignore[misc]
        """The actor that owns one run's loop."""

        def __init__(self, driver: Driver) -> None:
            super().__init__()
            self.driver = driver

        def on_receive(self, message: Any) -> Any:
            if message == "drive":
                return self.driver.drive()
            if isinstance(message, tuple) and message[0] == "drive":
                # Drive, then hand the outcome (or the error) to a callback: how a
                # run's loop awaits a child run without a thread waiting for it.
                told = message[1]
                try:
                    outcome = self.driver.drive()
                except Exception as exc:  # the awaiting effect raises it
                    told(None, exc)
                    return None
                except BaseException as exc:
                    told(None, exc)
                    raise
                told(outcome, None)
                return None
            raise TypeError(f"RunSupervisor got an unexpected message {message!r}")

    return RunSupervisor


RunSupervisor: Any = _make_supervisor()


def for_run(
    options: RunOptions, store: Store, run_id: str, *, first: Event | None = None
) -> RunOptions:
    """A copy of ``options`` carrying the variables ``run_id`` was started with
    (None for a run recorded before variables were: its scripts and tools then get
    the declared defaults). ``first``: the run's ``RunStarted``, when at hand."""
    values = recorded_config(store, run_id, first=first).get("variables")
    out = copy.copy(options)
    out.variables = dict(values) if isinstance(values, dict) else None
    return out


class _ChildDriving:
    """The :class:`~graphrun.runtime.nodes.ports.ChildLauncher` of one run: an agent
    node's child runs are started in the parent's store and driven by a driver of
    their own, registered with the parent so that ending the parent reaches them."""

    def __init__(self, parent: Driver) -> None:
        self.parent = parent

    def check(self, loaded: LoadedGraph) -> None:
        options = self.parent.options
        check_graph(loaded, agents_dir=options.agents_dir, config_dir=options.config_dir)

    def start(
        self, loaded: LoadedGraph, *, prompt: str, node_id: str, run_id: str, variables: Any
    ) -> None:
        start_run(
            self.parent.store,
            loaded,
            prompt=prompt,
            started_by=self.parent.options.as_user,
            parent_run_id=self.parent.run_id,
            parent_node_id=node_id,
            run_id=run_id,
            config={"variables": variables},
        )

    def driver(self, child_id: str, knowledge: dict[str, Any] | None, token: CancelToken) -> Driver:
        """The child's driver (it reads the child's recorded configuration: blocks)."""
        parent = self.parent
        # The child's own variables, as recorded when it began (never the parent's).
        options = for_run(_child_options(parent.options, knowledge), parent.store, child_id)
        options.effect_loop = parent.effect_loop  # its effects are awaited beside the parent's
        child = Driver(parent.store, child_id, options, cancel=token)
        # A person the child asks stops the parent's clocks too.
        child.person = PersonTime(child.clock.monotonic, parent=parent.person)
        return child

    def drive(
        self, child_id: str, knowledge: dict[str, Any] | None, token: CancelToken
    ) -> RunOutcome:
        child = self.driver(child_id, knowledge, token)
        self.parent.children.attach(child_id, token, child)
        try:
            return drive(child)
        finally:
            self.parent.children.detach(child_id)

    async def drive_async(self, child: Driver, token: CancelToken) -> RunOutcome:
        """Drive ``child`` (made by :meth:`driver`) in its own supervisor actor and
        await its outcome on the calling loop: no thread waits for it. The task
        being cancelled (the loop stopping) cancels the child too."""
        self.parent.children.attach(child.run_id, token, child)
        try:
            return await drive_awaited(child, token)
        finally:
            self.parent.children.detach(child.run_id)


async def drive_awaited(driver: Driver, token: CancelToken) -> RunOutcome:
    """``driver``'s run driven in a :class:`RunSupervisor` actor, its outcome awaited
    on the running loop (the actor calls back when the drive ends)."""
    import asyncio

    loop = asyncio.get_running_loop()
    done: asyncio.Future[RunOutcome] = loop.create_future()

    def land(outcome: RunOutcome | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(outcome)  # type: ignore[arg-type]

    def told(outcome: RunOutcome | None, error: BaseException | None) -> None:  # actor's thread
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(land, outcome, error)

    ref = RunSupervisor.start(driver)
    try:
        ref.tell(("drive", told))
        try:
            return await done
        except asyncio.CancelledError:
            # Not awaited any more: the child is cancelled rather than left running.
            token.cancel(token.reason or "the parent run stopped")
            raise
    finally:
        with contextlib.suppress(Exception):
            ref.stop(block=False)


def _child_options(options: RunOptions, knowledge: dict[str, Any] | None) -> RunOptions:
    """Child runs share the parent's configuration, answers and identity, not its
    listener (their narration is indented) nor its knowledge bases."""
    child = copy.copy(options)
    child.extra = dict(options.extra)
    if knowledge is not None:
        child.extra["knowledge_bases"] = knowledge
    if options.listener is not None:
        child.listener = options.child_listener() if options.child_listener else None
    child.effect_source = None
    return child


def resume_ancestors(store: Store, run_id: str, options: RunOptions, outcome: RunOutcome) -> Any:
    """After a child run ends (e.g. once a person answered it), continue the parents
    that were waiting on it; returns the outermost outcome."""
    current = outcome
    row = store.run(run_id)
    while current.status in TERMINAL and row.parent_run_id:
        parent_id = row.parent_run_id
        parent = load_run(store, parent_id)
        if parent.state.terminal:
            break
        parent_options = for_run(options, store, parent_id, first=parent.first)
        current = drive(Driver(store, parent_id, parent_options, loaded=parent))
        row = store.run(parent_id)
    return current


__all__ = [
    "Driver",
    "RunOptions",
    "RunOutcome",
    "RunSupervisor",
    "check_graph",
    "drive",
    "for_run",
    "graph_of",
    "recorded_config",
    "resume_ancestors",
    "run_config",
    "seed_state",
    "start_run",
]
