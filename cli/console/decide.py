"""Answering from the console: the statement a person signs, and recording it.

:func:`prepare` builds the decision statement for an answer to the question a run
waits at (with :mod:`graphrun.runtime.decisions`, as the command line does) and
the WebAuthn challenge bound to it; :func:`record` hands the signed (or token- or
proxy-authenticated) answer to ``runtime.engine.answers.submit_answer``, which
refuses it before anything is written if the run no longer waits there, the
person may not answer, or the signature does not verify; :func:`continue_run`
then continues the run as ``graphrun approve`` does: queued for a worker on
PostgreSQL, driven in this process (in a thread of its own) on SQLite.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from graphrun.eventstore.events import HumanInputReceived, HumanInputRequested
from graphrun.eventstore.fold import fold
from graphrun.runtime.decisions import (
    DOMAIN,
    DecisionStatement,
    SignedDecision,
    build_statement,
    shown_hash,
    shown_text,
)
from graphrun.runtime.decisions.webauthn import b64url, challenge_for
from graphrun.runtime.errors import AnswerError

__all__ = ["Prepared", "continue_run", "prepare", "record", "shown_for"]


@dataclass(frozen=True)
class Prepared:
    """An answer waiting for its signature: the statement and its challenge."""

    run_id: str
    request: HumanInputRequested
    answer: str
    other: bool
    principal: str
    statement: bytes

    @property
    def challenge(self) -> str:
        return b64url(challenge_for(self.statement, DOMAIN))


def shown_for(request: HumanInputRequested) -> str:
    """The question block the person is shown (what the statement's ``shown`` hashes)."""
    return shown_text(request.question, list(request.options), request.default)


def _asked_head(store: Any, run_id: str, seq: int) -> str:
    for row_seq, _body, _prev, digest in store.raw_rows(run_id):
        if row_seq == seq:
            return str(digest)
    raise AnswerError(f"run {run_id} has no event {seq}")


def _checked_answer(request: HumanInputRequested, text: str, other: bool) -> str:
    from graphrun.actors.human.prompt import check_free_form, pick_option

    if request.kind != "approval":
        return text
    if other:
        return check_free_form(text, list(request.options), request.node_id)
    return pick_option(text, list(request.options), request.node_id)


def prepare(
    store: Any,
    run_id: str,
    *,
    node: str,
    visit: int,
    answer: str,
    other: bool,
    principal: str,
    now: float | None = None,
) -> Prepared:
    """The statement ``principal`` would sign to give ``answer`` at ``node``/``visit``.

    Raises:
        AnswerError: The run does not wait at that question (any more).
        AnswerRefused: ``principal`` is not among the node's approvers.
        InvalidAnswer: ``answer`` is not one of the options.
    """
    from graphrun.actors.human.actor import check_approver

    events = store.read(run_id)
    state = fold(events)
    request = None if state.terminal else state.waiting
    if request is None or request.node_id != node or request.visit != visit:
        raise AnswerError(
            f"run {run_id} no longer waits at '{node}' (visit {visit})",
            hint="reload the page: it was answered meanwhile, or the run moved on",
        )
    check_approver(request.approvers, principal, node)
    text = _checked_answer(request, answer, other)
    when = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    statement = DecisionStatement(
        run_id=run_id,
        node_id=request.node_id,
        visit=request.visit,
        branch=str(getattr(request, "branch", "") or ""),
        kind=request.kind,
        question=request.question,
        options=list(request.options),
        answer=text,
        other=other,
        asked_seq=request.seq,
        asked_head=_asked_head(store, run_id, request.seq),
        shown=shown_hash(shown_for(request)),
        principal=principal,
        signed_at=when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    )
    return Prepared(run_id, request, text, other, principal, build_statement(statement))


def record(
    store: Any,
    prepared: Prepared,
    *,
    signature: str,
    kind: str,
    identity: str,
    trust: Any,
) -> HumanInputReceived:
    """Record the answer (``submit_answer`` checks and appends it, or refuses)."""
    from graphrun.runtime.engine.answers import submit_answer

    signed = SignedDecision(
        statement=prepared.statement, signature=signature, kind=kind, identity=identity
    )
    return submit_answer(  # type: ignore[call-arg]
        store,
        prepared.run_id,
        prepared.answer,
        kind=prepared.request.kind,
        as_user=prepared.principal,
        node=prepared.request.node_id,
        channel="console",
        other=prepared.other,
        signed=signed,
        trust=trust,
    )


def continue_run(
    store: Any,
    received: HumanInputReceived,
    *,
    principal: str,
    on_error: Callable[[BaseException], None],
) -> str:
    """Continue the run ``received`` answered, as ``graphrun approve`` does; returns
    ``"queued"`` (a worker continues it) or ``"continuing"`` (driven here)."""
    queued = getattr(store, "queued", None)
    if queued is not None and queued(received.run_id) is not None:
        store.release_lease(received.run_id)
        store.close()
        return "queued"

    def drive() -> None:
        from graphrun.cli.run import _drive, _options
        from graphrun.runtime.engine.driver import Driver, recorded_config
        from graphrun.runtime.nodes.agent import resume_ancestors

        try:
            options = _options(
                answers=(),
                as_user=principal,
                agents_dir=None,
                config_dir=None,
                llm_replay=None,
                store=store,
                quiet=True,
                recorded=recorded_config(store, received.run_id),
            )
            options.interactive = False
            outcome = _drive(Driver(store, received.run_id, options, resumed_by=principal))
            resume_ancestors(store, received.run_id, options, outcome)
        except BaseException as exc:
            on_error(exc)
        finally:
            store.close()

    threading.Thread(target=drive, name=f"run-{received.run_id}", daemon=True).start()
    return "continuing"
