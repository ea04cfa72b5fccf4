"""Decision statements: the exact bytes a person's answer is signed over, and their checks.

A human answer (an approval's choice, an ``--other`` text, an input) may carry a
signature over a canonical *decision statement*. The statement binds the answer to
one run at one point: run id, node, visit and branch, the question and options
exactly as recorded, the answer, the hash of the log head when the question was
asked (the ``HumanInputRequested`` event's chain hash), a hash of what the person
was shown, the signer's principal and the time, under the domain tag
:data:`DOMAIN`. Its bytes are stored in ``HumanInputReceived.statement`` (and in
``ApprovalSigned.statement`` for each earlier signature of a multi-signer
approval) and are what is verified later, never a re-encoding.

Public API (stable; other faces add signature kinds, they do not change it):

* :class:`DecisionStatement` — the statement's fields; :func:`build_statement`
  returns its canonical bytes, :func:`parse_statement` reads stored bytes back
  (refusing anything that is not exactly a canonical statement),
  :func:`statement_hash` is ``"sha256:<hex>"`` of the bytes (what a later
  co-signature lists in ``cosigned``).
* :func:`shown_hash` — the hash of the rendered text shown to the person;
  :func:`shown_text` renders the question block the CLI shows.
* :class:`Trust` — what verification may consult: an OpenSSH ``allowed_signers``
  file for ``"sshsig"``, and ``extra[kind]`` for any other kind (e.g. the console's
  registered passkeys). Nothing on the network, no agent.
* :class:`SignatureKind` — a protocol: ``name`` and
  ``verify(statement, signature, principal, trust) -> key id`` raising
  :class:`SignatureInvalid` with the reason. :func:`register_kind` adds one,
  :func:`signature_kind` looks one up, :func:`verify_signature` dispatches.
  ``"sshsig"`` (OpenSSH's SSHSIG, namespace :data:`DOMAIN`) is built in
  (:mod:`graphrun.runtime.decisions.sshsig`).
* :func:`make_trust` — the :class:`Trust` every command verifies with: the signers
  file, plus what each registered kind loads for itself (a kind may define
  ``load_trust(signers: Path | None) -> Any``; the result is ``extra[kind.name]``).
* :class:`SignedDecision` — a statement, its signature, the kind and the identity
  class, as handed to ``runtime.engine.answers.submit_answer(signed=...)``.
* Recording (``graphrun.runtime.engine.answers``): ``prepare_statement(store, run_id,
  text, *, kind, principal, node=None, other=False, shown=None) -> (run id, bytes)``
  builds the statement for the question the run waits at (the answer checked
  first); ``submit_answer(..., signed=SignedDecision(...), trust=make_trust(...))``
  verifies it against the question and the governing graph and appends it (or
  refuses, appending nothing); an unsigned answer from an authenticated session
  passes ``identity_class="token"`` (or ``"proxy"``) instead of ``signed``.
* Checking a log: :func:`graphrun.runtime.decisions.verify.check_run` (per decision:
  verified / claimed / token / proxy / broken), used by ``audit --verify``.
* :data:`IDENTITIES` — how an answer's identity is known: ``"verified"`` (a
  signature), ``"token"`` (an authenticated session or API token), ``"proxy"``
  (asserted by a trusted front), ``"claimed"`` (a typed name; every old answer).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from graphrun.eventstore.errors import GraphrunError
from graphrun.runtime.decisions.signing import DOMAIN, SignatureInvalid, SignatureKind, Trust
from graphrun.runtime.decisions.sshsig import SSHSIG
from graphrun.runtime.decisions.webauthn import WEBAUTHN

__all__ = [
    "DOMAIN",
    "IDENTITIES",
    "DecisionStatement",
    "SignatureInvalid",
    "SignatureKind",
    "SignedDecision",
    "StatementError",
    "Trust",
    "build_statement",
    "make_trust",
    "parse_statement",
    "register_kind",
    "shown_hash",
    "shown_text",
    "signature_kind",
    "statement_hash",
    "verify_signature",
]

IDENTITIES = ("verified", "token", "proxy", "claimed")


class StatementError(GraphrunError):
    """Stored statement bytes are not a canonical decision statement."""


class DecisionStatement(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a signer states. Every field is signed; see the module docstring."""

    domain: str = DOMAIN
    run_id: str
    node_id: str
    visit: int
    branch: str = ""
    kind: str  # "approval" or "input"
    question: str
    options: list[str] = []
    answer: str
    other: bool = False  # a free-form answer to an approval (--other)
    asked_seq: int  # seq of the HumanInputRequested this answers
    asked_head: str  # that event's chain hash: the log head when the question was asked
    shown: str  # "sha256:<hex>" of what the person was shown
    principal: str
    signed_at: str  # RFC 3339, UTC
    #: Statement hashes of the earlier signatures of the same request (a multi-signer
    #: approval): deleting one of them breaks this statement.
    cosigned: list[str] = []


_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(DecisionStatement)


def build_statement(statement: DecisionStatement) -> bytes:
    """The canonical bytes of ``statement``: JSON, keys sorted, UTF-8, every field present."""
    return _encoder.encode(msgspec.structs.asdict(statement))


def parse_statement(data: bytes | str) -> DecisionStatement:
    """Read stored statement bytes; refuse anything that is not exactly canonical.

    Raises:
        StatementError: Not JSON of a statement, another domain, or not the
            canonical encoding of what it says.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    try:
        stmt = _decoder.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise StatementError(f"the statement is not a decision statement: {exc}") from None
    if stmt.domain != DOMAIN:
        raise StatementError(f"the statement's domain is {stmt.domain!r}, not {DOMAIN!r}")
    if build_statement(stmt) != raw:
        raise StatementError("the statement is not in canonical form")
    return stmt


def statement_hash(data: bytes | str) -> str:
    """``"sha256:<hex>"`` of statement bytes."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def shown_text(question: str, options: list[str] | tuple[str, ...], default: str | None) -> str:
    """The question block as graphrun shows it before an answer is given."""
    lines = [question]
    lines += [f"  {i}. {option}" for i, option in enumerate(options, 1)]
    if default is not None:
        lines.append(f"  (default: {default})")
    return "\n".join(lines) + "\n"


def shown_hash(text: str | bytes) -> str:
    """``"sha256:<hex>"`` of the rendered text a person was shown."""
    return statement_hash(text)


#: The signature kinds by name; the built-in ones first.
_KINDS: dict[str, SignatureKind] = {SSHSIG.name: SSHSIG, WEBAUTHN.name: WEBAUTHN}


def register_kind(kind: SignatureKind) -> None:
    """Make ``kind`` available to :func:`verify_signature` under ``kind.name``."""
    _KINDS[kind.name] = kind


def signature_kind(name: str) -> SignatureKind:
    """The registered kind called ``name``.

    Raises:
        SignatureInvalid: No such kind is known to this graphrun.
    """
    found = _KINDS.get(name)
    if found is None:
        known = ", ".join(sorted(_KINDS))
        raise SignatureInvalid(f"unknown signature kind {name!r} (known: {known})")
    return found


def verify_signature(
    statement: bytes, signature: str, kind: str, principal: str, trust: Trust
) -> str:
    """Verify ``signature`` (of ``kind``) over the exact ``statement`` bytes as
    ``principal``; returns the signing key's id.

    Raises:
        SignatureInvalid: Which check failed.
    """
    return signature_kind(kind).verify(statement, signature, principal, trust)


def make_trust(signers: Path | None) -> Trust:
    """A :class:`Trust` over the ``signers`` file, with each registered kind's own
    material (its optional ``load_trust(signers)``) under ``extra[kind.name]``."""
    extra: dict[str, Any] = {}
    for name, kind in _KINDS.items():
        load = getattr(kind, "load_trust", None)
        if load is not None:
            extra[name] = load(signers)
    return Trust(signers=signers, extra=extra)


@dataclass(frozen=True)
class SignedDecision:
    """A signed answer as handed to ``submit_answer``.

    Attributes:
        statement: The canonical statement bytes (:func:`build_statement`).
        signature: The signature, as its kind writes it (SSHSIG: the armored text).
        kind: The signature kind (``"sshsig"``, ``"webauthn"``, …).
        identity: One of :data:`IDENTITIES`; ``"verified"`` for a signature.
    """

    statement: bytes
    signature: str
    kind: str
    identity: str = "verified"
