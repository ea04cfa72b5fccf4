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

import datetime
import time
from collections.abc import Mapping, Sequence
from typing import Any

from graphrun.actors.human.actor import AnswerRefused, check_approver
from graphrun.actors.human.prompt import identity
from graphrun.eventstore.errors import LeaseHeldError
from graphrun.eventstore.events import (
    ApprovalSigned,
    Event,
    HumanInputReceived,
    HumanInputRequested,
)
from graphrun.eventstore.fold import RunState, fold
from graphrun.eventstore.store import Store
from graphrun.runtime.decisions import (
    IDENTITIES,
    DecisionStatement,
    SignatureInvalid,
    SignedDecision,
    StatementError,
    Trust,
    build_statement,
    parse_statement,
    shown_hash,
    shown_text,
    statement_hash,
    verify_signature,
)
from graphrun.runtime.decisions.policy import Policy, governing_policy
from graphrun.runtime.engine.runs import LoadedRun, load_run, still_current
from graphrun.runtime.errors import AnswerError
from graphrun.runtime.graph.loader import graph_of

__all__ = [
    "answer_run",
    "check_flag_answers",
    "pending_answers",
    "prepare_statement",
    "submit_answer",
]

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
    signed: SignedDecision | None = None,
    trust: Trust | None = None,
    identity_class: str = "claimed",
    loaded: LoadedRun | None = None,
) -> HumanInputReceived | ApprovalSigned:
    """Record a person's answer to the ``kind`` node the run waits at.

    On success the run's lease is left held by ``store`` so that the caller can
    resume the run before anyone else extends it.

    Who may answer, and whether the answer must be signed, is read from the graph
    that governs the run (:func:`~graphrun.runtime.decisions.policy.governing_policy`),
    never from the recorded question. A signed answer (``signed``, made over
    :func:`prepare_statement`'s bytes) is verified against ``trust`` before anything
    is written; its principal is the answerer. An approval that needs several
    distinct signers records each earlier signature as ``ApprovalSigned`` (the run
    keeps waiting) and the one that completes the count as ``HumanInputReceived``.

    Args:
        store: The event store holding the run.
        run_id: The waiting run.
        text: The answer (an option, or free-form text; for an input node, ""
            takes the node's default). Ignored for a signed answer (the statement's).
        kind: ``"approval"`` or ``"input"``: which command is answering.
        as_user: The claimed identity (``--as``); with ``signed``, must be its principal.
        node: The node to answer, when given (``--node``).
        channel: How the answer came (``"approve"`` / ``"answer"``).
        other: ``text`` is an approval's free-form answer (``--other``), not a choice.
        wait_for_lease: How long to wait for another process to let go of the run.
        signed: The signed decision statement, its signature, kind and identity class.
        trust: What ``signed`` is verified against (the allowed_signers file).
        identity_class: For an unsigned answer, how ``as_user`` is known:
            ``"claimed"`` (typed), ``"token"`` (an authenticated session or API
            token) or ``"proxy"`` (asserted by a trusted front). Where the graph
            requires signed answers, none of these is enough.
        loaded: ``run_id`` as the caller opened it (:func:`load_run`), so that its
            log is not read again.

    Returns:
        The appended ``HumanInputReceived`` (or ``ApprovalSigned``), stamped.

    Raises:
        AnswerError: The run waits for nothing, has ended, waits elsewhere or
            for another kind of answer, or the node was already answered.
        AnswerRefused: Not an approver, unsigned where a signature is required,
            a signature that does not verify or is for another question, or a
            signer who already signed.
        PolicyError: The recorded graph and the graph on disk disagree.
        InvalidAnswer: ``text`` is not an option (nor its number) of the approval,
            or fails the input's ``validation``.
        LeaseHeldError: Another process kept the run for longer than
            ``wait_for_lease`` seconds.
    """
    return answer_run(
        store,
        run_id,
        text,
        kind=kind,
        as_user=as_user,
        node=node,
        channel=channel,
        other=other,
        wait_for_lease=wait_for_lease,
        signed=signed,
        trust=trust,
        identity_class=identity_class,
        loaded=loaded,
    )[0]


def answer_run(
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
    signed: SignedDecision | None = None,
    trust: Trust | None = None,
    identity_class: str = "claimed",
    loaded: LoadedRun | None = None,
) -> tuple[HumanInputReceived | ApprovalSigned, LoadedRun]:
    """:func:`submit_answer`, which also returns the run that was answered (a child
    run the given one waits on, maybe) as it is after the answer, to be continued
    without reading its log again (the lease is left held)."""
    ident = identity(as_user)
    # Never extend a log that does not verify: opening a run verifies it.
    run = _waiting_run(store, _opened(store, run_id, loaded), node)
    run_id = run.run_id
    events = run.events
    request = _request(run, kind=kind, node=node)
    policy = governing_policy(events, request.node_id)
    how = f"pass --as NAME with one of them to graphrun {_VERB[kind]}"
    cosigs = _cosignatures(events, request)
    if signed is None:
        if policy.signed:
            raise AnswerRefused(
                f"node '{request.node_id}' requires a signed answer; nothing was recorded",
                hint=f"graphrun {_VERB[kind]} {run_id} ... --sign KEY (a key in allowed_signers)",
            )
        if identity_class not in ("claimed", "token", "proxy"):
            raise AnswerRefused(f"an unsigned answer cannot be {identity_class!r}")
        check_approver(policy.approvers, ident.by, request.node_id, how=how)
        text = _checked(run, request, text, other=other)
        event: HumanInputReceived | ApprovalSigned = ident.answered(request, text, channel)
        if identity_class != "claimed":
            import msgspec

            event = msgspec.structs.replace(event, identity=identity_class)
    else:
        stmt, key = _verified(run, request, signed, trust, as_user)
        check_approver(policy.approvers, stmt.principal, request.node_id)
        if _checked(run, request, stmt.answer, other=stmt.other) != stmt.answer:
            raise AnswerRefused("the signed answer is not as graphrun records it")
        earlier = {e.by: e for e in cosigs}
        if stmt.principal in earlier:
            raise AnswerRefused(
                f"{stmt.principal!r} already signed node '{request.node_id}' "
                f"(seq {earlier[stmt.principal].seq}); a signer counts once",
                hint=_still_needed(policy, cosigs, stmt.answer),
            )
        agreeing = {e.by for e in cosigs if e.answer == stmt.answer} | {stmt.principal}
        fields: dict[str, Any] = {
            "node_id": request.node_id,
            "visit": request.visit,
            "answer": stmt.answer,
            "by": stmt.principal,
            "os_user": ident.os_user,
            "host": ident.host,
            "channel": channel,
            "identity": signed.identity,
            "statement": signed.statement.decode("utf-8"),
            "signature": signed.signature,
            "signature_kind": signed.kind,
            "key": key,
        }
        if len(agreeing) < policy.required:
            event = ApprovalSigned(**fields)
        else:
            event = HumanInputReceived(
                **fields, question=request.question, options=list(request.options)
            )
    deadline = time.monotonic() + wait_for_lease
    while True:
        try:
            store.acquire_lease(run_id)
            break
        except LeaseHeldError:
            # Whoever holds the run may be answering this very request.
            held = store.read(run_id)
            _still_waiting(held, fold(held), request)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    try:
        # Holding the lease: the log as read, unless another process extended it.
        now = still_current(store, run)
        _still_waiting(now.events, now.state, request)
        if _cosignatures(now.events, request) != cosigs:
            raise AnswerRefused(
                f"another signature for node '{request.node_id}' arrived meanwhile; "
                "nothing was recorded",
                hint="run the command again (it signs over the signatures now recorded)",
            )
        (stamped,) = store.append(run_id, [event], sync=True)
        head = store.run(run_id)
    except BaseException:
        store.release_lease(run_id)
        raise
    assert isinstance(stamped, HumanInputReceived | ApprovalSigned)
    digest = head.last_hash if head.last_seq == stamped.seq else None
    return stamped, now.extended([stamped], head_hash=digest)


def _opened(store: Store, run_id: str, loaded: LoadedRun | None) -> LoadedRun:
    """``loaded`` when it is ``run_id``'s, else the run opened now."""
    if loaded is not None and loaded.run_id == run_id:
        return loaded
    return load_run(store, run_id)


def prepare_statement(
    store: Store,
    run_id: str,
    text: str,
    *,
    kind: str,
    principal: str,
    node: str | None = None,
    other: bool = False,
    shown: str | None = None,
    loaded: LoadedRun | None = None,
) -> tuple[str, bytes]:
    """The decision statement to sign for answering ``run_id`` with ``text`` as
    ``principal``: ``(the run that waits, canonical statement bytes)``.

    The answer is checked first (an option, its number, free-form with ``other``,
    an input's validation) and recorded in the statement as graphrun will record
    it. ``shown`` is what the person was shown (default: the question block as
    graphrun prints it); its hash is signed. Earlier signatures of the same request
    (a multi-signer approval) are listed in ``cosigned``.

    Raises:
        AnswerError, InvalidAnswer: As :func:`submit_answer`, before anything is signed.
    """
    run = _waiting_run(store, _opened(store, run_id, loaded), node)
    waiting, events = run.run_id, run.events
    request = _request(run, kind=kind, node=node)
    answer = _checked(run, request, text, other=other)
    if shown is None:
        shown = shown_text(request.question, request.options, request.default)
    stmt = DecisionStatement(
        run_id=waiting,
        node_id=request.node_id,
        visit=request.visit,
        branch=request.branch,
        kind=request.kind,
        question=request.question,
        options=list(request.options),
        answer=answer,
        other=other,
        asked_seq=request.seq,
        asked_head=_hash_at(run, request.seq),
        shown=shown_hash(shown),
        principal=principal,
        signed_at=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        cosigned=[statement_hash(e.statement) for e in _cosignatures(events, request)],
    )
    return waiting, build_statement(stmt)


def _hash_at(run: LoadedRun, seq: int) -> str:
    digest = run.hashes.get(seq)
    if digest is None:
        raise AnswerError(f"run {run.run_id} has no event {seq}")
    return digest


def _cosignatures(events: Sequence[Event], request: HumanInputRequested) -> list[ApprovalSigned]:
    """The signatures already recorded for ``request`` (a multi-signer approval)."""
    # Events are in seq order from seq 1: the ones after the request follow its index.
    after = events[request.seq :] if events and events[0].seq == 1 else events
    return [
        e
        for e in after
        if isinstance(e, ApprovalSigned)
        and e.seq > request.seq
        and (e.node_id, e.visit) == (request.node_id, request.visit)
    ]


def _still_needed(policy: Policy, cosigs: Sequence[ApprovalSigned], answer: str) -> str:
    have = {e.by for e in cosigs if e.answer == answer}
    rest = [p for p in policy.approvers if p not in have]
    need = max(policy.required - len(have), 0)
    return f"{need} more signature(s) needed, from: {', '.join(rest)}"


def _verified(
    run: LoadedRun,
    request: HumanInputRequested,
    signed: SignedDecision,
    trust: Trust | None,
    as_user: str | None,
) -> tuple[DecisionStatement, str]:
    """The signed statement, checked against the question the run waits at and
    verified; returns it and the signing key's id."""
    try:
        stmt = parse_statement(signed.statement)
    except StatementError as exc:
        raise AnswerRefused(f"the signed statement is refused: {exc.message}") from None
    run_id = request.run_id
    expected = {
        "run": (stmt.run_id, run_id),
        "node": (stmt.node_id, request.node_id),
        "visit": (stmt.visit, request.visit),
        "branch": (stmt.branch, request.branch),
        "kind": (stmt.kind, request.kind),
        "question": (stmt.question, request.question),
        "options": (list(stmt.options), list(request.options)),
        "question seq": (stmt.asked_seq, request.seq),
        "log head": (stmt.asked_head, _hash_at(run, request.seq)),
        "co-signatures": (
            list(stmt.cosigned),
            [statement_hash(e.statement) for e in _cosignatures(run.events, request)],
        ),
    }
    wrong = [name for name, (have, want) in expected.items() if have != want]
    if wrong:
        raise AnswerRefused(
            f"the signed statement does not match the question run {run_id} waits at "
            f"({', '.join(wrong)} differ); nothing was recorded"
        )
    if signed.identity not in IDENTITIES:
        raise AnswerRefused(f"unknown identity class {signed.identity!r}")
    if as_user is not None and as_user != stmt.principal:
        raise AnswerRefused(
            f"--as {as_user!r} does not match the signer {stmt.principal!r}; nothing was recorded"
        )
    try:
        key = verify_signature(
            signed.statement, signed.signature, signed.kind, stmt.principal, trust or Trust()
        )
    except SignatureInvalid as exc:
        raise AnswerRefused(f"{exc.message}; nothing was recorded", hint=exc.hint) from None
    return stmt, key


def _checked(run: LoadedRun, request: HumanInputRequested, text: str, *, other: bool) -> str:
    """The answer as it will be recorded, or InvalidAnswer (nothing recorded)."""
    from graphrun.actors.human.prompt import check_free_form, check_input, pick_option

    if request.kind == "approval":
        if other:
            return check_free_form(text, request.options, request.node_id)
        return pick_option(text, request.options, request.node_id)
    node = graph_of(run.state).graph.nodes.get(request.node_id)
    validation = getattr(node, "validation", None)
    check_input(text, validation, has_default=request.default is not None, node_id=request.node_id)
    return text


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


def pending_answers(
    events: Sequence[Event], answers: dict[str, list[str]], *, state: RunState | None = None
) -> dict[str, list[str]]:
    """The ``resume --answer`` values still to be used, per node.

    A list that starts with every answer the log already holds for a node (the
    flags the run was started with, given again) has those left out. A list that
    shares no first answer with the log is taken as the answers to come. Anything
    else is ambiguous and refused, as is a list made of recorded answers only while
    the run waits at that node: the message says which answer is still needed.

    ``state``: the fold of ``events``, when the caller has it.

    Raises:
        UsageError: The list is ambiguous.
    """
    from graphrun.actors.human.prompt import FreeForm
    from graphrun.runtime.errors import UsageError

    if state is None:
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


def _waiting_run(store: Store, run: LoadedRun, node: str | None) -> LoadedRun:
    """The run to answer: ``run``, or the one descendant of it that waits (opened)."""
    from graphrun.runtime.engine.lifecycle import run_tree

    state, run_id = run.state, run.run_id
    if state.waiting is not None or state.terminal:
        return run
    waiting: list[tuple[str, str]] = []
    for rid in run_tree(store, run_id)[1:]:
        row = store.run(rid)
        if row.waiting_node and (node is None or row.waiting_node == node):
            waiting.append((rid, row.waiting_node))
    if len(waiting) == 1:
        return load_run(store, waiting[0][0])
    if len(waiting) > 1:
        listed = ", ".join(f"'{n}' in run {rid}" for rid, n in waiting)
        raise AnswerError(
            f"several child runs of run {run_id} wait for an answer: {listed}",
            hint="name the run that waits, or the node with --node",
        )
    return run


def _request(run: LoadedRun, *, kind: str, node: str | None) -> HumanInputRequested:
    """The request this answer is for, or the error that says why there is none."""
    events, state, run_id = run.events, run.state, run.run_id
    waiting = None if state.terminal else state.waiting
    if waiting is not None and (node is None or node == waiting.node_id) and waiting.kind == kind:
        return waiting
    # No answer can be taken: the last one given says why (a walk of the log, for
    # the refusal only).
    previous = _last_answer(events, node, kind)
    if waiting is not None and (node is None or node == waiting.node_id):
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


def _still_waiting(events: Sequence[Event], state: RunState, request: HumanInputRequested) -> None:
    """Raise unless the run (``events`` and their fold) still waits at ``request``
    (same event, not a later visit)."""
    waiting = state.waiting
    if not state.terminal and waiting is not None and waiting.seq == request.seq:
        return
    raise AnswerError(_nothing_waits(state, request.run_id, _answer_to(events, request)))


def _check_node(state: RunState, run_id: str, node: str, kind: str) -> None:
    """Raise when ``node`` is not a ``kind`` node of the run's graph."""
    import difflib

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
