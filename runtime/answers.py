"""Answering a waiting run from outside it (``graphrun approve`` / ``answer``).

The answer is appended only while this process holds the run's lease and the run
still waits at that node: two people racing to approve get exactly one recorded
answer, and the other is told who answered first.
"""

from __future__ import annotations

import time

from graphrun.actors.human import identity
from graphrun.actors.human_actor import check_approver
from graphrun.eventstore.errors import LeaseHeldError
from graphrun.eventstore.events import HumanInputReceived, HumanInputRequested
from graphrun.eventstore.fold import RunState, fold
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.errors import AnswerError


def _answered_by(store: SqliteStore, run_id: str, node: str | None) -> HumanInputReceived | None:
    events = store.read(run_id)
    for event in reversed(events):
        if isinstance(event, HumanInputReceived) and (node is None or event.node_id == node):
            return event
    return None


def _describe(state: RunState) -> str:
    if state.terminal:
        return f"has {state.status}"
    return "is not waiting for an answer"


def submit_answer(
    store: SqliteStore,
    run_id: str,
    text: str,
    *,
    kind: str,
    as_user: str | None,
    node: str | None = None,
    channel: str,
    wait_for_lease: float = 5.0,
) -> HumanInputReceived:
    """Record a person's answer to the node the run waits at; leaves the lease held."""
    deadline = time.monotonic() + wait_for_lease
    while True:
        try:
            store.acquire_lease(run_id)
            break
        except LeaseHeldError:
            previous = _answered_by(store, run_id, node)
            state = fold(store.read(run_id))
            if previous is not None and state.waiting is None:
                raise AnswerError(
                    f"node '{previous.node_id}' of run {run_id} was already answered by "
                    f"{previous.by} ({previous.answer!r})"
                ) from None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    try:
        state = fold(store.read(run_id))
        waiting: HumanInputRequested | None = state.waiting
        if waiting is None:
            previous = _answered_by(store, run_id, node)
            if (
                previous is not None
                and not state.terminal
                and previous.visit == state.current_visit
            ):
                raise AnswerError(
                    f"node '{previous.node_id}' of run {run_id} was already answered by "
                    f"{previous.by} ({previous.answer!r})"
                )
            raise AnswerError(f"run {run_id} {_describe(state)}: there is nothing to answer")
        if node is not None and node != waiting.node_id:
            raise AnswerError(
                f"run {run_id} waits at node '{waiting.node_id}', not '{node}'",
                hint=f"use --node {waiting.node_id}",
            )
        if waiting.kind != kind:
            verb = "approve" if waiting.kind == "approval" else "answer"
            raise AnswerError(
                f"node '{waiting.node_id}' is an {waiting.kind} node",
                hint=f"use graphrun {verb}",
            )
        ident = identity(as_user)
        check_approver(waiting.approvers, ident.by, waiting.node_id)
        event = HumanInputReceived(
            node_id=waiting.node_id,
            visit=waiting.visit,
            answer=text,
            by=ident.by,
            os_user=ident.os_user,
            host=ident.host,
            channel=channel,
            question=waiting.question,
            options=list(waiting.options),
        )
        (stamped,) = store.append(run_id, [event], sync=True)
        return stamped  # type: ignore[return-value]
    except BaseException:
        store.release_lease(run_id)
        raise
