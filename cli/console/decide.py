"""Answering from the console: the statement a person signs, and recording it.

:func:`prepare` checks that the run still waits at the question the page showed
and that the person may answer it (the policy of the graph that governs the run),
then builds the decision statement with ``runtime.engine.answers.prepare_statement``
exactly as ``graphrun approve --sign`` does, and the WebAuthn challenge bound to
it. :func:`record` hands the signed (or token- or proxy-authenticated) answer to
``submit_answer``, which refuses it before anything is written if the run no
longer waits there, the person may not answer, or the signature does not verify.
:func:`continue_run` then continues the run as ``graphrun approve`` does: queued
for a worker on PostgreSQL, driven in this process (in a thread) on SQLite.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphrun.eventstore.events import ApprovalSigned, HumanInputReceived, HumanInputRequested
from graphrun.eventstore.fold import fold
from graphrun.runtime.decisions import DOMAIN, SignedDecision, shown_text
from graphrun.runtime.decisions.webauthn import b64url, challenge_for
from graphrun.runtime.errors import AnswerError

__all__ = [
    "Prepared",
    "continue_run",
    "prepare",
    "record",
    "require_listed",
    "shown_for",
    "signers_file",
]


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


def prepare(
    store: Any,
    run_id: str,
    *,
    node: str,
    visit: int,
    answer: str,
    other: bool,
    principal: str,
) -> Prepared:
    """The statement ``principal`` would sign to give ``answer`` at ``node``/``visit``.

    Raises:
        AnswerError: The run does not wait at that question (any more).
        AnswerRefused: ``principal`` may not answer it, or already signed it.
        PolicyError: The run's recorded graph and the graph on disk disagree.
        InvalidAnswer: ``answer`` is not one of the options (or fails validation).
    """
    from graphrun.actors.human.actor import AnswerRefused, check_approver
    from graphrun.runtime.decisions.policy import governing_policy
    from graphrun.runtime.engine.answers import prepare_statement

    events = store.read(run_id)
    state = fold(events)
    request = None if state.terminal else state.waiting
    if request is None or request.node_id != node or request.visit != visit:
        raise AnswerError(
            f"run {run_id} no longer waits at '{node}' (visit {visit}); nothing was recorded",
            hint="reload the page: it was answered meanwhile, or the run moved on",
        )
    policy = governing_policy(events, node)
    check_approver(policy.approvers, principal, node)
    if principal in signed_by(events, request):
        raise AnswerRefused(f"{principal!r} already signed node '{node}'; a signer counts once")
    waiting, statement = prepare_statement(
        store,
        run_id,
        answer,
        kind=request.kind,
        principal=principal,
        node=node,
        other=other,
        shown=shown_for(request),
    )
    from graphrun.runtime.decisions import parse_statement

    recorded = parse_statement(statement).answer
    return Prepared(waiting, request, recorded, other, principal, statement)


def signers_file(store: Any, run_id: str, given: Path | None) -> Path | None:
    """The allowed_signers file the run's answers are checked against when it is
    continued or audited: ``given`` (``serve --signers``), else next to its graph,
    else in its config directory (as ``graphrun approve`` and workers find it)."""
    from graphrun.runtime.decisions.sshsig import find_signers
    from graphrun.runtime.engine.driver import recorded_config
    from graphrun.runtime.graph.config import config_dir as default_config_dir

    first = store.read(run_id, upto=1)
    agent_dir = getattr(first[0], "agent_dir", "") if first else ""
    config = recorded_config(store, run_id)
    return find_signers(
        given,
        graph_dir=agent_dir or None,
        config_dir=config.get("config_dir") or default_config_dir(),
    )


def require_listed(store: Any, prepared: Prepared, key_line: str, signers: Path | None) -> None:
    """Where the run's graph requires signed answers, refuse (before anything is
    recorded) a passkey the run's allowed_signers file does not list: the run could
    not continue with it, and ``audit --verify`` could not verify it.

    Raises:
        AnswerRefused: The passkey is not listed for the principal.
    """
    from graphrun.actors.human.actor import AnswerRefused
    from graphrun.runtime.decisions.policy import governing_policy
    from graphrun.runtime.decisions.webauthn import principal_keys

    events = store.read(prepared.run_id)
    if not governing_policy(events, prepared.request.node_id).signed:
        return
    listed = principal_keys(signers, prepared.principal) if signers is not None else []
    if key_line.split()[1] not in {k.split()[1] for k in listed}:
        where = str(signers) if signers is not None else "an allowed_signers file (none found)"
        raise AnswerRefused(
            f"node '{prepared.request.node_id}' requires signed answers checked against "
            f"{where}, which does not list {prepared.principal}'s passkey; nothing was recorded",
            hint="add the line `graphrun serve --export-signers` prints for "
            f"{prepared.principal} to that file",
        )


def signed_by(events: list[Any], request: HumanInputRequested) -> set[str]:
    """Who already signed ``request`` (the earlier signatures of a multi-signer approval)."""
    return {
        e.by
        for e in events
        if isinstance(e, ApprovalSigned)
        and e.seq > request.seq
        and (e.node_id, e.visit) == (request.node_id, request.visit)
    }


def record(
    store: Any,
    prepared: Prepared,
    *,
    signature: str,
    kind: str,
    identity: str,
    trust: Any,
) -> tuple[HumanInputReceived | ApprovalSigned, Any]:
    """Record the answer (``answer_run`` checks and appends it, or refuses); returns
    it and the answered run as it is now (a ``LoadedRun``: :func:`continue_run`
    continues it without reading its log again).

    A signature (``kind`` set) goes with the prepared statement and is verified
    against ``trust``; an answer without one is recorded with ``identity``
    ("token" or "proxy") as its identity class.
    """
    from graphrun.runtime.engine.answers import answer_run

    signed = None
    if kind:
        signed = SignedDecision(
            statement=prepared.statement, signature=signature, kind=kind, identity=identity
        )
    authenticated = None if kind else identity
    return answer_run(
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
        identity_class=authenticated or "claimed",
    )


def continue_run(
    store: Any,
    received: HumanInputReceived | ApprovalSigned,
    *,
    principal: str,
    signers: Path | None,
    on_error: Callable[[BaseException], None],
    loaded: Any = None,
) -> str:
    """Continue the run ``received`` answered, as ``graphrun approve`` does; returns
    ``"waiting for more signatures"``, ``"queued"`` (a worker continues it) or
    ``"continuing"`` (driven here). ``store`` holds the run's lease; it is closed.
    ``loaded``: the run as :func:`record` left it (not read again)."""
    if isinstance(received, ApprovalSigned):
        store.release_lease(received.run_id)
        store.close()
        return "waiting for more signatures"
    queued = getattr(store, "queued", None)
    if queued is not None and queued(received.run_id) is not None:
        store.release_lease(received.run_id)
        store.close()
        return "queued"

    def drive() -> None:
        from graphrun.cli.run import _drive, _options
        from graphrun.runtime.engine.driver import Driver, resume_ancestors

        try:
            options = _options(
                answers=(),
                as_user=principal,
                agents_dir=None,
                config_dir=None,
                llm_replay=None,
                store=store,
                quiet=True,
                continuing=loaded if loaded is not None else received.run_id,
            )
            options.interactive = False
            options.signers = signers
            driver = Driver(store, received.run_id, options, resumed_by=principal, loaded=loaded)
            outcome = _drive(driver)
            resume_ancestors(store, received.run_id, options, outcome)
        except BaseException as exc:
            on_error(exc)
        finally:
            store.close()

    threading.Thread(target=drive, name=f"run-{received.run_id}", daemon=True).start()
    return "continuing"
