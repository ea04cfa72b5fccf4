"""Workers: processes, on any number of machines, that drive queued runs.

``graphrun submit`` records a run's ``RunStarted`` and queues it in the same
transaction (:meth:`PostgresStore.queue_on_start`). A :class:`Worker` runs
``concurrency`` slots and a claimer:

1. the claimer claims the oldest queued runs, or running ones whose worker is
   gone (its lease expired, its advisory lock is free, or its process is dead on
   this host): ``FOR UPDATE SKIP LOCKED`` on the queue rows, the leases taken
   and the runs' logs read in the same statement
   (:meth:`PostgresStore.finish_claims`), as many as there are free slots and
   ``CLAIM_AHEAD`` more, so that a slot whose run ends finds the next one ready;
2. a slot drives a claimed run with the same
   :class:`~graphrun.runtime.engine.driver.Driver` that ``graphrun run`` and
   ``resume`` use, from the log the claim brought (verified and folded once): a
   taken-over run continues from its log (an effect whose result was recorded is
   never performed again);
3. the claimer hands it back, in the statement of its next claim: ``done`` when
   it ended, ``waiting`` when it waits for a person. ``approve`` / ``answer``
   then only append the answer, which queues the run again in the same
   transaction, for whichever worker is free.

A heartbeat thread renews the leases of every run the worker holds. A claim
also holds an advisory lock on the run, on a connection of the worker's own:
when a worker dies, on any host, PostgreSQL ends that connection and its runs
are claimable at once; a worker that hangs without dying loses its runs once
``lease_seconds`` pass.

While the database is away the worker says so once, and once when it is back
(the connection pool's own warnings are folded into those two lines); runs it
could not hand back meanwhile stay its own (their leases renewed) and are
handed back when the database returns.
:meth:`Worker.stop` (SIGTERM, Ctrl-C) stops claiming, lets the runs in flight
finish for up to ``grace`` seconds, and hands back the rest (and the runs claimed
ahead, never started) for other workers.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphrun.eventstore.errors import (
    GraphrunError,
    LeaseHeldError,
    StoreError,
    StoreUnreachableError,
)
from graphrun.eventstore.fold import fold

log = logging.getLogger("graphrun.worker")

#: A run whose drive broke (not the run failing: the worker could not drive it)
#: this many times is set aside as ``stuck`` instead of being claimed again.
MAX_ATTEMPTS = 5
#: Runs a worker claims beyond its free slots: a slot whose run ends finds the
#: next one claimed already (its claim's round trip and flush off the slot's way).
CLAIM_AHEAD = 1


@dataclass
class WorkerStats:
    """What a worker did, for its exit line and the tests."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    waiting: int = 0
    handed_back: int = 0
    taken_over: int = 0
    runs: list[str] = field(default_factory=list)


def needs_queue(store: Any) -> None:
    """Refuse a store that cannot queue runs (SQLite): workers share PostgreSQL."""
    if not hasattr(store, "claim"):
        from graphrun.runtime.errors import UsageError

        raise UsageError(
            f"{store.path} is an SQLite file: submitted runs and workers need a shared "
            "PostgreSQL database",
            hint="pass --db postgresql://… or set GRAPHRUN_DB",
        )


def submit_run(
    store: Any,
    loaded: Any,
    *,
    prompt: str,
    overrides: dict[str, Any],
    as_user: str | None,
    agents_dir: Path | None,
    config_dir: Path | None,
    config: dict[str, Any] | None = None,
) -> str:
    """Record a new run and queue it for workers; returns its id. ``config`` is
    recorded in its ``RunStarted`` (the variables it was submitted with)."""
    from graphrun.eventstore.ids import new_run_id
    from graphrun.runtime.engine.driver import start_run

    needs_queue(store)
    run_id = str(new_run_id())
    store.queue_on_start(
        run_id,
        {
            "as_user": as_user,
            "agents_dir": str(agents_dir) if agents_dir else None,
            "config_dir": str(config_dir) if config_dir else None,
        },
    )
    return start_run(
        store,
        loaded,
        prompt=prompt,
        overrides=overrides,
        started_by=as_user,
        run_id=run_id,
        config=config,
    )


def _options(settings: dict[str, Any]) -> Any:
    from graphrun.runtime.engine.driver import RunOptions

    def path(key: str) -> Path | None:
        value = settings.get(key)
        return Path(value) if value else None

    return RunOptions(
        answers={},
        as_user=settings.get("as_user"),
        interactive=False,
        agents_dir=path("agents_dir"),
        config_dir=path("config_dir"),
        listener=None,
    )


def drive_claimed(store: Any, claim: dict[str, Any], *, worker_name: str, loop: Any = None) -> Any:
    """Drive a claimed run to its end or to a wait; returns the outermost outcome.
    ``loop``: the worker's :class:`~graphrun.actors.loop.EffectLoop`, to await the
    run's effects on (its connections serve every run the worker drives)."""
    from graphrun.runtime.engine.driver import Driver, RunOutcome, drive, graph_of, resume_ancestors
    from graphrun.runtime.engine.runs import load_run

    run_id = claim["run_id"]
    options = _options(claim.get("settings") or {})
    target = claim.get("resume_run") or run_id
    # The run to drive, read (by the claim itself, when the store can) and verified
    # once: the driver takes it from here.
    run = _claimed_run(claim.get("log"), claim.get("snapshot"), target) or load_run(store, target)
    state = run.state
    if state.terminal and target == run_id:
        return RunOutcome(run_id, state.status, state.output, state.error)
    # The graph of the run that was queued (the root, when a child run goes on).
    root = run.state if target == run_id else fold(store.read(run_id, upto=1))
    loaded = graph_of(root)
    if any(n.type == "rag" for n in loaded.graph.nodes.values()):
        from graphrun.runtime.nodes.rag import prepare_knowledge_bases

        options.extra["knowledge_bases"] = prepare_knowledge_bases(
            loaded, interactive=False, config_dir=options.config_dir
        )
    from graphrun.runtime.engine.driver import for_run

    options = for_run(options, store, target, first=run.first)  # the variables it began with
    options.effect_loop = loop
    outcome = drive(Driver(store, target, options, resumed_by=worker_name, loaded=run))
    if target != run_id:
        # A person answered a child run: it went on first; now its parents.
        outcome = resume_ancestors(store, target, options, outcome)
    return outcome


def _claimed_run(rows: Any, kept: Any, run_id: str) -> Any:
    """The run a claim read the log of (``raw_rows`` form), verified and folded
    (from ``kept``, the run's snapshot row the claim read, when the log confirms
    it: see :func:`~graphrun.runtime.engine.runs.load_run`); ``None`` when the
    claim brought no log."""
    if not rows:
        return None
    from graphrun.eventstore import codec, snapshots
    from graphrun.eventstore.store import broken_log
    from graphrun.runtime.engine.runs import LoadedRun

    events: list[Any] = []
    hashes: dict[int, str] = {}
    problem = codec.verify_chain(rows, into=events, hashes=hashes)
    if problem is not None:
        raise broken_log(run_id, problem)
    state = snapshots.state_from(kept, run_id, events, hashes) if kept else None
    return LoadedRun(run_id, events, state if state is not None else fold(events), hashes)


def prepare_graph_types() -> None:
    """Build msgspec's converters for every graph type now, in one thread.

    msgspec builds a type's converter on its first use; two threads doing that at
    once for the same type can crash the process (msgspec 0.22: a segmentation
    fault in 8 threads loading one graph, about one start in four). Slots load
    graphs concurrently, so the worker prepares them before any slot starts."""
    import msgspec

    from graphrun.runtime.graph import model as graph

    for value in vars(graph).values():
        if isinstance(value, type) and issubclass(value, msgspec.Struct):
            with contextlib.suppress(msgspec.ValidationError, TypeError):
                msgspec.convert({}, value)


class Outage:
    """Whether the database is reachable, said once per change: one line when it
    goes away, one when it is back."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.why: str | None = None
        self._lock = threading.Lock()

    def down(self, why: str) -> None:
        with self._lock:
            if self.why is not None:
                return
            self.why = why
        self.say(f"▸ database unreachable ({why}); retrying until it is back")

    def up(self) -> None:
        with self._lock:
            if self.why is None:
                return
            self.why = None
        self.say("▸ database is back")


class Worker:
    """Claims queued runs from a PostgreSQL store and drives them.

    Args:
        store: a store with a run queue (:class:`PostgresStore`).
        concurrency: runs driven at once.
        lease_seconds: how long a claim lasts without a heartbeat.
        poll: seconds between looks at an empty queue.
        once: stop when nothing is left to claim and nothing is in flight.
        grace: after :meth:`stop`, seconds to let runs in flight finish.
        say: where progress lines go (one per claim and per end).
    """

    def __init__(
        self,
        store: Any,
        *,
        concurrency: int = 1,
        lease_seconds: float = 30.0,
        poll: float = 0.2,
        once: bool = False,
        grace: float = 30.0,
        say: Callable[[str], None] | None = None,
    ) -> None:
        needs_queue(store)
        if concurrency < 1:
            from graphrun.runtime.errors import UsageError

            raise UsageError(f"--concurrency must be at least 1, not {concurrency}")
        self.store = store
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.poll = poll
        self.once = once
        self.grace = grace
        self.say = say or (lambda line: log.info("%s", line))
        self.name = f"worker {store.owner}"
        self.stats = WorkerStats()
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        # Slots and the claimer wait on this for each other.
        self._wake = threading.Condition(self._lock)
        #: Runs claimed, not yet taken by a slot.
        self._ready: collections.deque[dict[str, Any]] = collections.deque()
        #: Runs the slots drive now.
        self._driving: set[str] = set()
        #: Runs driven (or given up) to hand back -> their queue state.
        self._returns: dict[str, str] = {}
        #: Set by run() once the slots are done: the claimer hands back the rest.
        self._closing = False
        #: The last claim found the queue empty while nothing was in flight.
        self._empty = False
        #: The last claim's error while claiming fails (None once one succeeds).
        self.failure: BaseException | None = None
        self.outage = Outage(self.say)
        # The loop every run this worker drives awaits its effects on, made by run().
        self.effects: Any = None
        trouble = getattr(store, "on_connection_trouble", None)
        if trouble is not None:
            trouble(self.outage.down)

    # -- control ------------------------------------------------------------------

    def stop(self, reason: str = "stopping") -> None:
        """Claim nothing more; runs in flight finish (see :meth:`run`)."""
        if not self._stopping.is_set():
            self.say(f"▸ {reason}: no new runs; waiting for {len(self._driving)} in flight")
        self._stopping.set()

    def run(self) -> WorkerStats:
        """Work until stopped (or, with ``once``, until the queue is drained)."""
        from graphrun.actors.loop import EffectLoop

        prepare_graph_types()
        self.effects = EffectLoop("graphrun-worker-effects")
        slots = [
            threading.Thread(target=self._slot, name=f"graphrun-slot-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        claimer = threading.Thread(target=self._claimer, name="graphrun-claims", daemon=True)
        beat = threading.Thread(target=self._heartbeat, name="graphrun-heartbeat", daemon=True)
        beat.start()
        claimer.start()
        for slot in slots:
            slot.start()
        while any(s.is_alive() for s in slots) and not self._stopping.is_set():
            time.sleep(0.05)
        with self._wake:
            self._wake.notify_all()  # slots waiting for a run see the stop
        deadline = time.monotonic() + self.grace
        for slot in slots:
            slot.join(max(0.0, deadline - time.monotonic()))
        # The claimer hands back what was driven and what was never started.
        with self._wake:
            self._closing = True
            self._wake.notify_all()
        claimer.join(max(5.0, deadline - time.monotonic()))
        with self._lock:
            left = sorted(self._driving)
            unreturned = sorted({*self._returns, *(c["run_id"] for c in self._ready)})
        for run_id in left:
            # Not finished within the grace time: another worker continues it
            # from its log (this process exits; its slot threads die with it).
            with contextlib.suppress(GraphrunError):
                self.store.finish_claim(run_id, "queued")
            self.stats.handed_back += 1
            self.say(f"▸ run {run_id} handed back to the queue")
        if not left:
            # (A run still in flight keeps it: its effects go on until the process ends.)
            self.effects.stop()
        self._done.set()
        beat.join(5)
        for run_id in unreturned:
            self.say(
                f"▸ run {run_id}: could not hand back (database unreachable); its lease will expire"
            )
        if self.failure is not None and self.once:
            # --once that could not look at the queue did not do its job.
            raise StoreError(f"the worker could not claim runs: {self.failure}")
        return self.stats

    # -- the claimer ------------------------------------------------------------------

    def _claimer(self) -> None:
        """Hand back the runs the slots are done with and claim runs for the slots
        that will be free, in one statement each time, ahead of the slots: a slot
        whose run ends finds the next one claimed, and never waits for a claim's
        round trip or its flush."""
        look_at = 0.0  # when to look at the queue again, after finding it empty
        retry_at = 0.0  # when to try again, after the database refused
        backoff = 0.0
        retried: set[str] = set()  # hand-backs the database refused before
        while True:
            with self._wake:
                while True:
                    now = time.monotonic()
                    closing = self._closing
                    returning = sorted(self._returns.items())
                    if closing:
                        returning += [(c["run_id"], "unstarted") for c in self._ready]
                    want = 0
                    if not (closing or self._stopping.is_set()):
                        want = (
                            self.concurrency + CLAIM_AHEAD - len(self._driving) - len(self._ready)
                        )
                    due = max(look_at if not returning else 0.0, retry_at)
                    if (returning or want > 0) and (now >= due or closing):
                        break
                    if closing:
                        return
                    self._wake.wait(max(0.001, due - now) if want > 0 or returning else None)
                idle = not self._driving and not self._ready
            try:
                claims = self.store.finish_claims(
                    returning, claim=max(0, want), seconds=self.lease_seconds
                )
            except StoreError as exc:
                # The database is away (or refuses): --once gives up, a long-running
                # worker tries again, less and less often, saying so once; runs it
                # could not hand back stay its own (their leases renewed).
                if closing:
                    return
                retried.update(run_id for run_id, _state in returning)
                if isinstance(exc, StoreUnreachableError):
                    self.outage.down(str(exc))
                elif str(exc) != str(self.failure):
                    self.say(f"▸ cannot claim: {exc}; trying again")
                self.failure = exc
                if self.once and want > 0:
                    self.stop(f"cannot claim: {exc}")
                backoff = min(5.0, max(1.0, backoff * 2))
                retry_at = time.monotonic() + backoff
                continue
            except Exception as exc:  # a bug: stop the worker, say why
                self.failure = exc
                self.stop(f"internal error: {type(exc).__name__}: {exc}")
                return
            self.failure = None
            self.outage.up()
            backoff = retry_at = 0.0
            with self._wake:
                for run_id, state in returning:
                    self._returns.pop(run_id, None)
                    if run_id in retried:
                        retried.discard(run_id)
                        self.say(f"▸ run {run_id} handed back ({state})")
                if closing:
                    self._ready.clear()
                self._ready.extend(claims)
                if want > 0:
                    self._empty = not claims and idle
                    look_at = 0.0 if claims else time.monotonic() + self.poll
                self._wake.notify_all()

    # -- the slots ------------------------------------------------------------------

    def _slot(self) -> None:
        while True:
            with self._wake:
                while not self._ready and not self._stopping.is_set():
                    if self.once and self._empty and not self._driving:
                        return
                    self._wake.wait(self.poll)
                if self._stopping.is_set():
                    return
                claim = self._ready.popleft()
                self._driving.add(claim["run_id"])
                self._wake.notify_all()  # the claimer claims the next one
            state = "queued"
            try:
                state = self._work(claim)
            finally:
                with self._wake:
                    self._driving.discard(claim["run_id"])
                    self._returns[claim["run_id"]] = state
                    self._wake.notify_all()

    def _work(self, claim: dict[str, Any]) -> str:
        """Drive a claimed run; returns the queue state to hand it back with."""
        run_id = claim["run_id"]
        stats = self.stats
        stats.claimed += 1
        stats.runs.append(run_id)
        how = "took over" if claim.get("taken_over") else "claimed"
        if claim.get("taken_over"):
            stats.taken_over += 1
        self.say(f"▸ {how} run {run_id} (attempt {claim.get('attempts', 1)})")
        started = time.monotonic()
        try:
            outcome = drive_claimed(self.store, claim, worker_name=self.name, loop=self.effects)
        except LeaseHeldError as exc:
            # Another worker took the run over (this one stalled past its lease):
            # it is that worker's now; its hand-back changes nothing of it.
            self.say(f"▸ run {run_id}: {exc}")
            return "queued"
        except StoreUnreachableError as exc:
            # The database went away mid-drive: the run is handed back (once the
            # database returns); its log says where it stopped.
            self.outage.down(str(exc))
            return "queued"
        except GraphrunError as exc:
            return self._broken(claim, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a bug: the run is handed back, the worker goes on
            log.debug("driving run %s raised", run_id, exc_info=True)
            return self._broken(claim, f"internal error: {type(exc).__name__}: {exc}")
        took = time.monotonic() - started
        if outcome.status == "waiting":
            stats.waiting += 1
            node = outcome.waiting.node_id if outcome.waiting is not None else "?"
            self.say(f"▸ run {run_id} waits at '{node}' ({took:.2f}s); released")
            return "waiting"
        if outcome.status in ("completed", "completed_with_errors"):
            stats.completed += 1
        else:
            stats.failed += 1
        self.say(f"▸ run {run_id} {outcome.status} ({took:.2f}s)")
        return "done"

    def _broken(self, claim: dict[str, Any], why: str) -> str:
        run_id = claim["run_id"]
        attempts = int(claim.get("attempts", 1))
        state = "queued" if attempts < MAX_ATTEMPTS else "stuck"
        self.say(f"▸ run {run_id}: could not be driven ({why}); {state}")
        return state

    def _heartbeat(self) -> None:
        every = max(0.05, self.lease_seconds / 3)
        while not self._done.wait(every):
            with self._lock:
                holding = bool(self._driving or self._ready or self._returns)
            try:
                lost = self.store.heartbeat(seconds=self.lease_seconds)
            except StoreUnreachableError as exc:
                self.outage.down(str(exc))
                continue
            except GraphrunError as exc:
                self.say(f"▸ heartbeat failed: {exc}")
                continue
            if holding:  # the beat reached the database (with nothing held, it does not)
                self.outage.up()
            for run_id in lost:
                with self._wake:
                    self._returns.pop(run_id, None)
                    self._ready = collections.deque(c for c in self._ready if c["run_id"] != run_id)
                    self._wake.notify_all()
                self.say(f"▸ run {run_id}: lease lost to another worker")


__all__ = [
    "CLAIM_AHEAD",
    "MAX_ATTEMPTS",
    "Outage",
    "Worker",
    "WorkerStats",
    "drive_claimed",
    "needs_queue",
    "submit_run",
]
