"""Effect sources: where the one run loop gets an effect's outcome from.

The :class:`~graphrun.runtime.engine.driver.Driver` asks its source before it performs
an effect (``RunOptions.effect_source``): ``take(step, visit, ctx)`` returns a
:class:`Served` outcome, or None to perform the effect for real. Live runs have no
source. ``graphrun replay`` and ``graphrun test`` drive the same loop with a
:class:`RecordedSource`, which serves every effect from the recorded log (and
re-runs a changed script, or retrieval, offline when asked); ``replay --graph
--live`` and ``test --update`` use :class:`~graphrun.runtime.replay.regression.
RecordedEffects`, which serves what is unchanged and lets the rest run live.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from graphrun.actors.messages import HumanTask, RagTask, ScriptTask
from graphrun.eventstore import codec
from graphrun.eventstore.events import (
    EFFECT_TYPES,
    RESULT_TYPES,
    ApprovalSigned,
    BranchesJoined,
    CacheChecked,
    ChildCancelled,
    Event,
    HeadSigned,
    HumanInputRequested,
    NodeEntered,
    NodeFailed,
    NodeRetrying,
    RunCancelled,
    RunInterrupted,
    RunResumed,
    RunStarted,
    ScriptFinished,
    StepStarted,
    TimeoutFired,
)
from graphrun.eventstore.fold import RunState
from graphrun.eventstore.store import Lease
from graphrun.runtime.errors import WaitingForHuman

Slot = tuple[str, int, str]  # (node id, visit, branch)


class LogEnds(Exception):
    """The recorded log has nothing more to serve: the replay stops here.

    Deliberately not a ``GraphrunError``: it leaves the driver's loop untouched
    instead of being recorded as the node's failure."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass(frozen=True)
class Served:
    """An effect's outcome taken from a recording instead of performed."""

    events: list[Event]
    error: str | None = None  # the effect failed with this (the log's NodeFailed)


def slot_of(event: Event) -> Slot:
    return (getattr(event, "node_id", "") or "", getattr(event, "visit", 0), event.branch)


def _clean(event: Event) -> Event:
    return msgspec.structs.replace(event, run_id="", seq=0, ts=0.0)


@dataclass
class RecordedSource:
    """Serves each effect from a recorded log, by (node id, visit, branch).

    ``check(step, outcome, state)`` (given by the replay) compares the request the
    decider makes now with the recorded one; what it finds is kept in
    :attr:`problems` and the recorded outcome is served anyway, so one replay finds
    every divergence. ``rerun(step, outcome)`` says whether to perform an effect for
    real instead (a changed script; retrieval against today's knowledge base).
    """

    events: Sequence[Event]
    check: Callable[[Any, list[Event], RunState], Any] | None = None
    rerun: Callable[[Any, list[Event]], str | None] | None = None
    on_effect: Callable[[Any, list[Event]], None] | None = None
    slots: dict[Slot, list[Event]] = field(default_factory=dict)
    failures: dict[Slot, str] = field(default_factory=dict)
    problems: list[Any] = field(default_factory=list)
    # (node label, why) of each effect performed for real instead of served.
    reran: list[tuple[Any, str]] = field(default_factory=list)
    served: int = 0
    # How many of the log's events the replay may produce before it stops: the
    # log's own length, or where a supervisor policy ended the run (a timeout, a
    # cancel), which a replay cannot reproduce.
    limit: int = 0
    boundaries: list[int] = field(default_factory=list)
    # The effect events of each attempt of a visit that was tried again (``retry:``).
    attempts: dict[Slot, list[list[Event]]] = field(default_factory=dict)
    attempt_taken: dict[Slot, int] = field(default_factory=dict)
    # The recorded join of each super-step that settled one (``join:``), by step.
    joins: dict[int, BranchesJoined] = field(default_factory=dict)

    def __post_init__(self) -> None:
        comparable = 0
        stop: int | None = None
        # The running super-step's visit of each branch, and what the branches a
        # join left out failed with (a failure the effect itself raised is recorded
        # only there; a log written before joins kept it serves an empty error).
        entered: dict[str, Slot] = {}
        left_out: dict[Slot, str] = {}
        for event in self.events[1:]:
            if isinstance(event, StepStarted):
                entered = {}
            elif isinstance(event, NodeEntered) and event.branch:
                entered[event.branch] = slot_of(event)
            if isinstance(event, BranchesJoined):
                self.joins.setdefault(event.step, event)
                for branch in event.failed:
                    if branch in entered:
                        left_out.setdefault(entered[branch], event.errors.get(branch, ""))
            if isinstance(event, NodeRetrying):
                slot = slot_of(event)
                tried = self.attempts.setdefault(slot, [list(self.slots.get(slot, []))])
                tried.append([])
            mid_effect = isinstance(event, HumanInputRequested) and slot_of(event) in self.slots
            if isinstance(event, EFFECT_TYPES) or mid_effect:
                # (A question an effect asked, an llm visit's ``user__*``, is part of it.)
                slot = slot_of(event)
                self.slots.setdefault(slot, []).append(event)
                if slot in self.attempts:
                    self.attempts[slot][-1].append(event)
            elif isinstance(event, NodeFailed):
                self.failures.setdefault(slot_of(event), event.error)
            if isinstance(event, TimeoutFired | RunCancelled) and stop is None:
                stop = comparable
            if not isinstance(event, IGNORED):
                comparable += 1
        for slot, error in left_out.items():
            self.failures.setdefault(slot, error)
        self.limit = 1 + (comparable if stop is None else stop)

    def joined(self, step: int) -> BranchesJoined | None:
        """How the recorded run settled super-step ``step``'s join (None: every
        branch ran to its end)."""
        return self.joins.get(step)

    def before_decide(self, state: RunState) -> None:
        """Called by the loop before each decision: stop where the log stops."""
        self.boundaries.append(state.last_seq)
        if state.last_seq >= self.limit:
            raise LogEnds("the end of the log")

    def take(self, step: Any, visit: int, ctx: Any) -> Served | None:
        task = step.task
        slot = (step.node_id, visit, getattr(step, "branch", ""))
        attempts = self.attempts.get(slot)
        if attempts is not None:
            # A visit tried again (``retry:``): each request takes the next attempt.
            index = self.attempt_taken.get(slot, 0)
            self.attempt_taken[slot] = index + 1
            outcome = attempts[min(index, len(attempts) - 1)]
        else:
            outcome = self.slots.get(slot, [])
        if self.check is not None and outcome:
            problem = self.check(step, outcome, ctx.state())
            if problem is not None:
                self.problems.append(problem)
        if self.rerun is not None and outcome:
            why = self.rerun(step, outcome)
            if why is not None:
                self.reran.append((step, why))
                return None
        if self.on_effect is not None and outcome:
            self.on_effect(step, outcome)
        done = any(isinstance(e, RESULT_TYPES) for e in outcome)
        if not done:
            error = self.failures.get(slot)
            if error is not None:
                self.served += len(outcome)
                return Served([_clean(e) for e in outcome], error=error)
            if isinstance(task, HumanTask):
                # The log waits for a person here (or ends before the answer).
                raise WaitingForHuman(f"run waits for an answer at node '{step.node_id}'")
            label = f"node '{step.node_id}' (visit {visit}" + (
                f", branch {slot[2]})" if slot[2] else ")"
            )
            if outcome:
                # What the effect recorded before the log stops is part of the run.
                ctx.record(*(_clean(e) for e in outcome))
                ctx.absorb()
                self.served += len(outcome)
                raise LogEnds(f"the log ends inside the effect of {label}")
            raise LogEnds(f"the log has no recorded effect for {label}")
        self.served += len(outcome)
        return Served([_clean(e) for e in outcome])


#: Facts of the supervisor, not of the decider: never compared, never reproduced.
IGNORED = (
    RunResumed,
    RunInterrupted,
    RunCancelled,
    ChildCancelled,
    TimeoutFired,
    ApprovalSigned,
    HeadSigned,
    CacheChecked,
)


class ScratchLog:
    """The replay's own log: events kept in memory as the driver stamped them.

    It holds what the run loop produces while replaying (never persisted, so no
    encoding and no hash chain), with the store calls the loop makes."""

    def __init__(self, first: RunStarted) -> None:
        self.events: list[Event] = [first]

    def has_run(self, run_id: str) -> bool:
        return bool(self.events) and run_id == self.events[0].run_id

    def read(
        self, run_id: str, *, after: int = 0, upto: int | None = None, light: bool = False
    ) -> list[Event]:
        if not self.has_run(run_id):  # a child run: not part of this replay
            return []
        return [e for e in self.events if e.seq > after and (upto is None or e.seq <= upto)]

    def append(self, run_id: str, events: Sequence[Event], *, sync: bool = False) -> list[Event]:
        self.events.extend(events)
        return list(events)

    def acquire_lease(self, run_id: str, *, seconds: float = 0.0) -> None:
        return None

    def renew_lease(self, run_id: str, *, seconds: float = 0.0) -> None:
        return None

    def release_lease(self, run_id: str) -> None:
        return None

    def lease(self, run_id: str) -> Lease | None:
        return None

    def require_intact(self, run_id: str) -> None:
        return None

    def cancel_requested(self, run_id: str) -> tuple[str, str] | None:
        return None

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)


def script_changed(step: Any, outcome: list[Event], agent_dir: Path | None) -> str | None:
    """Why a script must run again (its file is not the one recorded), or None."""
    task = step.task
    if not isinstance(task, ScriptTask) or agent_dir is None:
        return None
    done = next((e for e in outcome if isinstance(e, ScriptFinished)), None)
    if done is None or not done.script_hash or done.script != task.script:
        return None
    try:
        current = codec.content_hash((agent_dir / task.script).read_bytes())
    except OSError:
        return None  # a missing script is reported as a changed request
    if current == done.script_hash:
        return None
    return f"script {task.script} changed"


def rag_rerun(step: Any, outcome: list[Event]) -> str | None:
    if isinstance(step.task, RagTask):
        return "retrieval re-run against today's knowledge base"
    return None


__all__ = [
    "IGNORED",
    "LogEnds",
    "RecordedSource",
    "ScratchLog",
    "Served",
    "rag_rerun",
    "script_changed",
    "slot_of",
]
