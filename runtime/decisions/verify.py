"""Checking every human decision of a run, and its signed heads, from stored bytes.

:func:`check_run` reads a run's events and their chain hashes (from a store, or
from an export file: no database needed) and says, per decision, how its identity
is known: ``verified`` (by which key), ``claimed``, ``token``, ``proxy``, or
``broken`` with the check that failed:

* the statement is not canonical, or is for another run, node, visit or branch
  (a signature moved), or was asked at another point of the log (an old signature
  replayed, or events before it deleted or edited and the chain recomputed);
* the answer, question, options or signer in the event differ from the statement
  (an edited answer);
* the signature does not verify for the principal in the signers file;
* the governing graph's approvers do not include the signer, a required signature
  is missing, a multi-signer approval lacks distinct signers, or a co-signature the
  statement lists is gone (a deleted approval).

Signed heads (``HeadSigned``) are checked the same way: the head they sign must be
the chain hash at their seq, and a run that has them must end with one (else its
tail was cut, or appended to without a signature).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from graphrun.eventstore.errors import GraphrunError
from graphrun.eventstore.events import (
    ApprovalSigned,
    Event,
    HeadSigned,
    HumanInputReceived,
    HumanInputRequested,
    RunStarted,
)
from graphrun.runtime.decisions import (
    SignatureInvalid,
    StatementError,
    Trust,
    parse_statement,
    statement_hash,
    verify_signature,
)
from graphrun.runtime.decisions.heads import parse_head_statement
from graphrun.runtime.decisions.policy import Policy, PolicyError, policy_of, recorded_graph

__all__ = ["DecisionCheck", "HeadCheck", "check_run", "require_answers_allowed"]

#: ``hashes_of(run_id)``: another run's chain hashes by seq, when it is at hand (a
#: fork's source), else None.
HashesOf = Callable[[str], Mapping[int, str] | None]


@dataclass
class DecisionCheck:
    """One recorded answer (or co-signature) and how its identity is known."""

    run_id: str
    seq: int
    node_id: str
    visit: int
    answer: str
    by: str
    identity: str  # verified | token | proxy | claimed | broken
    signature_kind: str = ""
    key: str = ""
    problem: str = ""
    cosignature: bool = False
    carried_from: str = ""  # a fork's copy of the source run's signed answer

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class HeadCheck:
    """A run's signed heads: how many verified, and the first problem."""

    run_id: str
    signed: int
    ok: bool
    key: str = ""
    problem: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_run(
    events: Sequence[Event],
    hashes: Mapping[int, str],
    trust: Trust,
    *,
    live: bool = False,
    hashes_of: HashesOf | None = None,
) -> tuple[list[DecisionCheck], HeadCheck | None]:
    """Check every answer and co-signature of one run, and its signed heads.

    Args:
        events: The run's events, in seq order, as read (verified) from the log.
        hashes: The chain hash of each seq.
        trust: The signers file (and other kinds' material).
        live: A process drives the run now (its tail may not be signed yet).
        hashes_of: Chain hashes of another run (a fork's source), when available.

    Returns:
        The decision checks in seq order, and the heads check (None when the run
        has no signed head).
    """
    first = events[0] if events else None
    try:
        graph = recorded_graph(events)
        bad_graph = ""
    except GraphrunError as exc:  # a run whose graph does not parse (any more)
        graph, bad_graph = None, f"the run's recorded graph cannot be read: {exc}"
    requests: dict[tuple[str, int, str], HumanInputRequested] = {}
    cosigs: dict[tuple[str, int, str], list[tuple[ApprovalSigned, DecisionCheck]]] = {}
    out: list[DecisionCheck] = []
    for event in events:
        if isinstance(event, HumanInputRequested):
            requests[(event.node_id, event.visit, event.branch)] = event
            continue
        if not isinstance(event, HumanInputReceived | ApprovalSigned):
            continue
        slot = _slot(event, requests)
        policy = policy_of(graph, event.node_id) if graph is not None else Policy(event.node_id)
        check = _check_one(event, requests.get(slot), hashes, trust, first, hashes_of)
        if bad_graph and check.identity != "broken":
            check.identity, check.problem = "broken", bad_graph
        _apply_policy(check, event, policy, cosigs.get(slot, []))
        if isinstance(event, ApprovalSigned):
            check.cosignature = True
            cosigs.setdefault(slot, []).append((event, check))
        out.append(check)
    return out, _check_heads(events, hashes, trust, live=live)


def _slot(
    event: HumanInputReceived | ApprovalSigned,
    requests: Mapping[tuple[str, int, str], HumanInputRequested],
) -> tuple[str, int, str]:
    """The question an answer is for: by node, visit and branch (an answer recorded
    without its branch takes the one question of that node and visit)."""
    node_id, visit, branch = event.node_id, event.visit, event.branch
    if (node_id, visit, branch) in requests:
        return (node_id, visit, branch)
    found = [k for k in requests if k[:2] == (node_id, visit)]
    return found[-1] if len(found) == 1 else (node_id, visit, branch)


def _check_one(
    event: HumanInputReceived | ApprovalSigned,
    request: HumanInputRequested | None,
    hashes: Mapping[int, str],
    trust: Trust,
    first: Event | None,
    hashes_of: HashesOf | None,
) -> DecisionCheck:
    check = DecisionCheck(
        run_id=event.run_id,
        seq=event.seq,
        node_id=event.node_id,
        visit=event.visit,
        answer=event.answer,
        by=event.by,
        identity=event.identity if event.identity in ("token", "proxy") else "claimed",
        signature_kind=event.signature_kind,
    )
    if not event.signature and not event.statement:
        if event.identity == "verified":
            check.identity, check.problem = "broken", "marked verified but carries no signature"
        return check
    check.identity = "broken"
    if not event.signature or not event.statement or not event.signature_kind:
        check.problem = "the statement or its signature is missing"
        return check
    try:
        stmt = parse_statement(event.statement)
    except StatementError as exc:
        check.problem = exc.message
        return check
    data = event.statement.encode("utf-8")
    run_hashes: Mapping[int, str] | None = hashes
    if stmt.run_id != event.run_id:
        forked = first if isinstance(first, RunStarted) else None
        carried = forked is not None and (
            (forked.forked_from == stmt.run_id and event.seq <= (forked.forked_at or 0))
            or forked.recorded_from == stmt.run_id
        )
        if not carried:
            check.problem = f"moved: the signed statement is for run {stmt.run_id}"
            return check
        check.carried_from = stmt.run_id
        run_hashes = hashes_of(stmt.run_id) if hashes_of is not None else None
    moved = [
        f"{name} {want!r}"
        for name, want, have in (
            ("node", stmt.node_id, event.node_id),
            ("visit", stmt.visit, event.visit),
            ("branch", stmt.branch, request.branch if request is not None else event.branch),
        )
        if want != have
    ]
    if moved:
        check.problem = f"moved: the signed statement is for {', '.join(moved)}"
        return check
    if stmt.answer != event.answer:
        check.problem = (
            f"edited answer: the log says {event.answer!r}, the signer answered {stmt.answer!r}"
        )
        return check
    if stmt.principal != event.by:
        check.problem = f"the log names {event.by!r}, the statement's signer is {stmt.principal!r}"
        return check
    if request is None:
        check.problem = f"no question was asked at node '{event.node_id}' visit {event.visit}"
        return check
    if (stmt.question, list(stmt.options), stmt.kind) != (
        request.question,
        list(request.options),
        request.kind,
    ):
        check.problem = "the question or options signed are not those the log asked"
        return check
    if run_hashes is not None:
        asked = run_hashes.get(stmt.asked_seq)
        if stmt.asked_seq != request.seq and not check.carried_from:
            check.problem = (
                "the log up to the question is not the one the signer saw: they were asked "
                f"at seq {stmt.asked_seq}, this log asks at seq {request.seq} (events before "
                "it were removed or inserted, and the chain recomputed)"
            )
            return check
        if asked != stmt.asked_head:
            check.problem = (
                f"the log up to the question (seq {stmt.asked_seq}) is not the one the signer "
                "saw: events before it were edited, removed or re-hashed"
            )
            return check
    try:
        check.key = verify_signature(
            data, event.signature, event.signature_kind, stmt.principal, trust
        )
    except SignatureInvalid as exc:
        check.problem = exc.message
        return check
    check.identity = "verified"
    return check


def _apply_policy(
    check: DecisionCheck,
    event: HumanInputReceived | ApprovalSigned,
    policy: Policy,
    earlier: list[tuple[ApprovalSigned, DecisionCheck]],
) -> None:
    """The governing graph's rules over one answer (after its own checks)."""
    if check.identity == "broken":
        return
    if not policy.allows(event.by):
        check.identity = "broken"
        check.problem = (
            f"{event.by!r} is not an approver of node '{event.node_id}' in the run's graph"
        )
        return
    if policy.signed and check.identity != "verified":
        check.problem = (
            f"node '{event.node_id}' requires a signed answer; this one is {check.identity}"
        )
        check.identity = "broken"
        return
    if event.statement:
        stmt = parse_statement(event.statement)
        present = {statement_hash(e.statement) for e, _ in earlier}
        gone = [h for h in stmt.cosigned if h not in present]
        if gone:
            check.identity = "broken"
            check.problem = (
                f"a co-signature this statement lists ({gone[0][:19]}…) is not in the log "
                "(a deleted approval)"
            )
            return
    if isinstance(event, HumanInputReceived) and policy.required > 1:
        signers = {
            e.by for e, c in earlier if c.identity == "verified" and e.answer == event.answer
        }
        signers.add(event.by)
        if len(signers) < policy.required:
            check.identity = "broken"
            check.problem = (
                f"node '{event.node_id}' needs {policy.required} distinct signers; "
                f"the log has {len(signers)} ({', '.join(sorted(signers))})"
            )


def _check_heads(
    events: Sequence[Event], hashes: Mapping[int, str], trust: Trust, *, live: bool
) -> HeadCheck | None:
    heads = [e for e in events if isinstance(e, HeadSigned)]
    if not heads:
        return None
    run_id = events[0].run_id
    first = events[0]
    sources = {
        getattr(first, "forked_from", None): getattr(first, "forked_at", None) or 0,
    }
    check = HeadCheck(run_id, len(heads), ok=False)
    for head in heads:
        where = f"signed head at seq {head.seq}"
        try:
            stmt = parse_head_statement(head.statement)
        except StatementError as exc:
            check.problem = f"{where}: {exc.message}"
            return check
        if stmt.run_id != run_id and stmt.run_id in sources and head.seq <= sources[stmt.run_id]:
            continue  # a fork's copy of its source's head: that run's, checked there
        if (stmt.run_id, stmt.head_seq, stmt.head) != (run_id, head.head_seq, head.head):
            check.problem = f"{where}: its statement is for another run or head"
            return check
        if head.head_seq != head.seq - 1 or hashes.get(head.head_seq) != head.head:
            check.problem = (
                f"{where}: the log up to seq {head.head_seq} is not the one signed "
                "(edited, removed or re-hashed events)"
            )
            return check
        try:
            check.key = verify_signature(
                head.statement.encode("utf-8"),
                head.signature,
                head.signature_kind,
                stmt.principal,
                trust,
            )
        except SignatureInvalid as exc:
            check.problem = f"{where}: {exc.message}"
            return check
    last = events[-1]
    if not live and not isinstance(last, HeadSigned):
        check.problem = (
            f"the log goes on to seq {last.seq} after its last signed head (seq "
            f"{heads[-1].seq}) without a signed head: its tail was cut or appended to"
        )
        return check
    check.ok = True
    return check


def require_answers_allowed(
    events: Sequence[Event], trust: Trust, *, disk: bool = True, hashes: Mapping[int, str]
) -> None:
    """Refuse to continue a run whose log holds an answer its governing graph does not
    allow: by someone who is not an approver (compared exactly), unsigned where a
    signature is required, or signed but not verifying.

    Raises:
        PolicyError: The first such answer (nothing is appended by the caller).
    """
    policies: dict[str, Policy] = {}
    requests: dict[tuple[str, int, str], HumanInputRequested] = {}
    first = events[0] if events else None
    human = (HumanInputRequested, HumanInputReceived, ApprovalSigned)
    for event in events:
        if not isinstance(event, human):  # one check for the many other events
            continue
        if isinstance(event, HumanInputRequested):
            requests[(event.node_id, event.visit, event.branch)] = event
            continue
        assert isinstance(event, HumanInputReceived | ApprovalSigned)
        node = event.node_id
        if node not in policies:
            from graphrun.runtime.decisions.policy import governing_policy

            policies[node] = governing_policy(events, node, disk=disk)
        policy = policies[node]
        where = f"run {event.run_id} seq {event.seq}"
        if not policy.allows(event.by):
            raise PolicyError(
                f"{where}: the recorded answer by {event.by!r} at node '{node}' is not "
                f"allowed by the run's graph ({policy.describe()}); nothing was appended",
                hint=f"`graphrun audit {event.run_id} --verify` lists every decision",
            )
        if not policy.signed:
            continue
        if trust.signers is None and event.signature_kind == "sshsig":
            raise PolicyError(
                f"{where}: node '{node}' requires signed answers and no allowed_signers file "
                "was found to check them",
                hint="put allowed_signers next to graph.yaml or in the config directory",
            )
        slot = _slot(event, requests)
        check = _check_one(event, requests.get(slot), hashes, trust, first, None)
        if check.identity != "verified":
            why = check.problem or "it is not signed"
            raise PolicyError(
                f"{where}: the recorded answer at node '{node}' does not verify ({why}); "
                "nothing was appended",
                hint=f"`graphrun audit {event.run_id} --verify` lists every decision",
            )
