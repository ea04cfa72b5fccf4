"""Answering a waiting run from outside it (``graphrun approve`` / ``answer``).

The answer is appended only while this process holds the run's lease and the run
still waits at the very request the person saw when the command started: two
people racing to approve get exactly one recorded answer, and the other is told
who answered first. Every refusal happens before anything is written, so a
refused answer leaves the log as it was.

An approval's answer must be one of its options (or the option's 1-based number,
as the terminal menu shows them) unless it is given as free-form text
(``--other``); an input's answer must satisfy the node's ``validation``. The same
rules hold for ``--answer NODE=VALUE`` on ``run``, ``resume`` and ``fork``
(:func:`check_flag_answers`), and ``resume --answer`` leaves out the answers the
log already holds (:func:`pending_answers`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from graphrun.actors.human.actor import check_approver
from graphrun.actors.human.prompt import identity
from graphrun.eventstore.errors import LeaseHeldError
from graphrun.eventstore.events import Event, HumanInputReceived, HumanInputRequested
from graphrun.eventstore.fold import RunState, fold
from graphrun.eventstore.store import Store
from graphrun.runtime.errors import AnswerError

__all__ = ["check_flag_answers", "pending_answers", "submit_answer"]

_VERB = {"approval": "approve", "input": "answer"}


def submit_answer(
    store: Store,
    run_id: str,
    text: str,
    *,
    kind: str,
    as_user: str | None,
    node: str | None = None,
    channel: str,
    other: bool = False,
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
        other: ``text`` is an approval's free-form answer (``--other``), not a choice.
        wait_for_lease: How long to wait for another process to let go of the run.

    Returns:
        The appended ``HumanInputReceived``, stamped.

    Raises:
        AnswerError: The run waits for nothing, has ended, waits elsewhere or
            for another kind of answer, or the node was already answered.
        AnswerRefused: ``as_user`` is not among the node's approvers.
        InvalidAnswer: ``text`` is not an option (nor its number) of the approval,
            or fails the input's ``validation``.
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
    text = _checked(events, request, text, other=other)
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
        event = ident.answered(request, text, channel)
        (stamped,) = store.append(run_id, [event], sync=True)
    except BaseException:
        store.release_lease(run_id)
        raise
    assert isinstance(stamped, HumanInputReceived)
    return stamped


def _checked(
    events: Sequence[Event], request: HumanInputRequested, text: str, *, other: bool
) -> str:
    """The answer as it will be recorded, or InvalidAnswer (nothing recorded)."""
    from graphrun.actors.human.prompt import check_free_form, check_input, pick_option

    if request.kind == "approval":
        if other:
            return check_free_form(text, request.options, request.node_id)
        return pick_option(text, request.options, request.node_id)
    node = _graph_nodes(events).get(request.node_id)
    validation = getattr(node, "validation", None)
    check_input(text, validation, has_default=request.default is not None, node_id=request.node_id)
    return text


def _graph_nodes(events: Sequence[Event]) -> dict[str, Any]:
    from graphrun.runtime.engine.driver import graph_of

    return dict(graph_of(fold(events)).graph.nodes)


def check_flag_answers(nodes: Mapping[str, Any], answers: Mapping[str, Sequence[str]]) -> None:
    """Check ``--answer`` / ``--other`` values against the graph before anything runs.

    An input node's answers must satisfy its ``validation``; an approval node's
    choices must name an option (or its number) when the options are not
    templated (templated options are checked when the node is reached, and a
    refused answer there leaves the run waiting). Nodes the graph does not have
    are left alone (they may belong to a child run).

    Raises:
        InvalidAnswer: The first answer that would be refused, with its flag.
    """
    from graphrun.actors.human.prompt import (
        FreeForm,
        InvalidAnswer,
        check_free_form,
        check_input,
        pick_option,
    )

    for node_id, given in answers.items():
        node = nodes.get(node_id)
        if node is None:
            continue
        kind = getattr(node, "type", None)
        for text in given:
            flag = "--other" if isinstance(text, FreeForm) else "--answer"
            try:
                if kind == "input":
                    has_default = getattr(node, "default", None) is not None
                    check_input(text, node.validation, has_default=has_default, node_id=node_id)
                elif kind == "approval":
                    options = list(node.options or [])
                    if any("{{" in option for option in options):
                        continue
                    if isinstance(text, FreeForm):
                        check_free_form(str(text), options, node_id)
                    elif flag == "--answer":
                        pick_option(text, options, node_id)
            except InvalidAnswer as exc:
                exc.message = f"{flag} {node_id}={text}: {exc.message}"
                exc.args = (exc.message,)
                raise


def pending_answers(events: Sequence[Event], answers: dict[str, list[str]]) -> dict[str, list[str]]:
    """The ``resume --answer`` values still to be used, per node.

    A list that starts with every answer the log already holds for a node (the
    flags the run was started with, given again) has those left out. A list that
    shares no first answer with the log is taken as the answers to come. Anything
    else is ambiguous and refused, as is a list made of recorded answers only while
    the run waits at that node: the message says which answer is still needed.

    Raises:
        UsageError: The list is ambiguous.
    """
    from graphrun.actors.human.prompt import FreeForm
    from graphrun.runtime.errors import UsageError

    state = fold(events)
    waiting = state.waiting
    recorded: dict[str, list[HumanInputReceived]] = {}
    for event in events:
        if isinstance(event, HumanInputReceived):
            recorded.setdefault(event.node_id, []).append(event)
    out: dict[str, list[str]] = {}
    for node_id, given in answers.items():
        held = recorded.get(node_id, [])
        same = 0
        for text, was in zip(given, held, strict=False):
            if not _same_answer(text, was, free=isinstance(text, FreeForm)):
                break
            same += 1
        waits_here = waiting is not None and waiting.node_id == node_id
        if not held or same == 0:
            out[node_id] = list(given)
            continue
        if same == len(held) and (len(given) > same or not waits_here):
            out[node_id] = list(given[same:])
            continue
        flags = " ".join(f"--answer {node_id}={a.answer}" for a in held)
        visits = len(held)
        if waits_here and same == len(held):
            why = f"all of them are for earlier visits; visit {visits + 1} still needs an answer"
        else:
            why = "some but not all of them match, so it is unclear which visit each is for"
        raise UsageError(
            f"--answer {node_id}=…: the log already holds {visits} answer(s) for node "
            f"'{node_id}' ({', '.join(repr(a.answer) for a in held)}); {why}",
            hint=f"pass the recorded answers, then the new ones: {flags} --answer {node_id}=VALUE",
        )
    return out


def _same_answer(given: str, recorded: HumanInputReceived, *, free: bool) -> bool:
    """Whether ``given`` is the answer ``recorded`` holds (an option may be given by
    its number or in another case)."""
    from graphrun.actors.human.prompt import InvalidAnswer, pick_option

    if given == recorded.answer:
        return True
    if free or not recorded.options:
        return False
    try:
        return pick_option(given, recorded.options, recorded.node_id) == recorded.answer
    except InvalidAnswer:
        return False


def _waiting_run(store: Store, run_id: str, node: str | None) -> str:
    """The run to answer: ``run_id``, or the one descendant of it that waits."""
    from graphrun.runtime.engine.lifecycle import run_tree

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

    from graphrun.runtime.engine.driver import graph_of

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
