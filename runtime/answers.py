"""Answering a waiting run from outside it (``graphrun approve`` / ``answer``).

The answer is appended only while this process holds the run's lease and the run
still waits at the very request the person saw when the command started: two
people racing to approve get exactly one recorded answer, and the other is told
who answered first. Every refusal happens before anything is written, so a
refused answer leaves the log as it was.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from graphrun.actors.human import identity
from graphrun.actors.human_actor import check_approver
from graphrun.eventstore.errors import LeaseHeldError
from graphrun.eventstore.events import Event, HumanInputReceived, HumanInputRequested
from graphrun.eventstore.fold import RunState, fold
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.errors import AnswerError

__all__ = ["submit_answer"]

_VERB = {"approval": "approve", "input": "answer"}


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
    """Record a person's answer to the ``kind`` node the run waits at.

    On success the run's lease is left held by ``store`` so that the caller can
    resume the run before anyone else extends it.

    Args:
        store: The event store holding the run.
        run_id: The waiting run.
        text: The answer (an option, or free-form text; for an input node, ""
            takes the node's default).
        kind: ``"approval"`` or ``"input"``: which command is answering.
        as_user: The claimed identity (``--as``).
        node: The node to answer, when given (``--node``).
        channel: How the answer came (``"approve"`` / ``"answer"``).
        wait_for_lease: How long to wait for another process to let go of the run.

    Returns:
        The appended ``HumanInputReceived``, stamped.

    Raises:
        AnswerError: The run waits for nothing, has ended, waits elsewhere or
            for another kind of answer, or the node was already answered.
        AnswerRefused: ``as_user`` is not among the node's approvers.
        LeaseHeldError: Another process kept the run for longer than
            ``wait_for_lease`` seconds.
    """
    ident = identity(as_user)
    store.require_intact(run_id)  # never extend a log that does not verify
    waiting = _waiting_run(store, run_id, node)
    if waiting != run_id:
        store.require_intact(waiting)
    run_id = waiting
    events = store.read(run_id)
    request = _request(events, run_id, kind=kind, node=node)
    how = f"pass --as NAME with one of them to graphrun {_VERB[kind]}"
    check_approver(request.approvers, ident.by, request.node_id, how=how)
    deadline = time.monotonic() + wait_for_lease
    while True:
        try:
            store.acquire_lease(run_id)
            break
        except LeaseHeldError:
            # Whoever holds the run may be answering this very request.
            _still_waiting(store.read(run_id), request)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    try:
        _still_waiting(store.read(run_id), request)
        event = HumanInputReceived(
            node_id=request.node_id,
            visit=request.visit,
            answer=text,
            by=ident.by,
            os_user=ident.os_user,
            host=ident.host,
            channel=channel,
            question=request.question,
            options=list(request.options),
        )
        (stamped,) = store.append(run_id, [event], sync=True)
    except BaseException:
        store.release_lease(run_id)
        raise
    assert isinstance(stamped, HumanInputReceived)
    return stamped


def _waiting_run(store: SqliteStore, run_id: str, node: str | None) -> str:
    """The run to answer: ``run_id``, or the one descendant of it that waits."""
    from graphrun.runtime.transfer import run_tree

    state = fold(store.read(run_id))
    if state.waiting is not None or state.terminal:
        return run_id
    waiting: list[tuple[str, str]] = []
    for rid in run_tree(store, run_id)[1:]:
        row = store.run(rid)
        if row.waiting_node and (node is None or row.waiting_node == node):
            waiting.append((rid, row.waiting_node))
    if len(waiting) == 1:
        return waiting[0][0]
    if len(waiting) > 1:
        listed = ", ".join(f"'{n}' in run {rid}" for rid, n in waiting)
        raise AnswerError(
            f"several child runs of run {run_id} wait for an answer: {listed}",
            hint="name the run that waits, or the node with --node",
        )
    return run_id


def _request(
    events: Sequence[Event], run_id: str, *, kind: str, node: str | None
) -> HumanInputRequested:
    """The request this answer is for, or the error that says why there is none."""
    state = fold(events)
    waiting = None if state.terminal else state.waiting
    previous = _last_answer(events, node, kind)
    if waiting is not None and (node is None or node == waiting.node_id):
        if waiting.kind == kind:
            return waiting
        now = f"waits at {waiting.kind} node '{waiting.node_id}'"
        hint = f"use graphrun {_VERB[waiting.kind]} {run_id} ..."
        if previous is not None:
            raise AnswerError(_already(previous, run_id, f"the run now {now}"), hint=hint)
        raise AnswerError(
            f"run {run_id} {now}, which graphrun {_VERB[kind]} cannot answer", hint=hint
        )
    if node is not None:
        _check_node(state, run_id, node, kind)
    if waiting is not None:
        # ``node`` names another node than the one the run waits at.
        now = f"waits at {waiting.kind} node '{waiting.node_id}'"
        hint = f"use --node {waiting.node_id}"
        if previous is not None:
            raise AnswerError(_already(previous, run_id, f"the run now {now}"), hint=hint)
        raise AnswerError(f"run {run_id} {now}, not at '{node}'", hint=hint)
    raise AnswerError(_nothing_waits(state, run_id, previous))


def _still_waiting(events: Sequence[Event], request: HumanInputRequested) -> None:
    """Raise unless the run still waits at ``request`` (same event, not a later visit)."""
    state = fold(events)
    waiting = state.waiting
    if not state.terminal and waiting is not None and waiting.seq == request.seq:
        return
    raise AnswerError(_nothing_waits(state, request.run_id, _answer_to(events, request)))


def _check_node(state: RunState, run_id: str, node: str, kind: str) -> None:
    """Raise when ``node`` is not a ``kind`` node of the run's graph."""
    import difflib

    from graphrun.runtime.supervisor import graph_of

    nodes = graph_of(state).graph.nodes
    found = nodes.get(node)
    if found is None:
        near = difflib.get_close_matches(node, list(nodes), n=1, cutoff=0.6)
        raise AnswerError(
            f"run {run_id} (graph {state.graph_name}) has no node '{node}'",
            hint=f"did you mean '{near[0]}'?" if near else None,
        )
    if found.type != kind:
        article = "an" if found.type[0] in "aeiou" else "a"
        raise AnswerError(
            f"node '{node}' of run {run_id} is {article} {found.type} node, not {kind}",
            hint=f"use graphrun {_VERB[found.type]}" if found.type in _VERB else None,
        )


def _last_answer(events: Sequence[Event], node: str | None, kind: str) -> HumanInputReceived | None:
    """The latest answer to a ``kind`` node (to ``node``, when given)."""
    kinds = {(e.node_id, e.visit): e.kind for e in events if isinstance(e, HumanInputRequested)}
    for event in reversed(events):
        if not isinstance(event, HumanInputReceived):
            continue
        if kinds.get((event.node_id, event.visit)) != kind:
            continue
        if node is None or event.node_id == node:
            return event
    return None


def _answer_to(events: Sequence[Event], request: HumanInputRequested) -> HumanInputReceived | None:
    for event in events:
        if (
            isinstance(event, HumanInputReceived)
            and event.seq > request.seq
            and event.node_id == request.node_id
            and event.visit == request.visit
        ):
            return event
    return None


def _already(previous: HumanInputReceived, run_id: str, now: str) -> str:
    return (
        f"node '{previous.node_id}' of run {run_id} was already answered by {previous.by} "
        f"({previous.answer!r} via {previous.channel}, seq {previous.seq}); {now}"
    )


def _nothing_waits(state: RunState, run_id: str, previous: HumanInputReceived | None) -> str:
    if state.terminal:
        now = f"has {state.status}"
    elif state.waiting is not None:
        now = f"waits at {state.waiting.kind} node '{state.waiting.node_id}'"
    elif state.current is not None:
        now = f"is not waiting for an answer (it is at node '{state.current}')"
    else:
        now = "is not waiting for an answer"
    if previous is not None:
        return _already(previous, run_id, f"the run {now}")
    if state.terminal:
        return f"run {run_id} {now}: nothing waits for an answer"
    return f"run {run_id} {now}"
