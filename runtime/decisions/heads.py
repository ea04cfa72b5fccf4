"""Signed heads: a machine key signs a run's head hash when the run ends or waits.

Configured by ``GRAPHRUN_HEAD_KEY`` (an SSH private key file, or a public key
whose private half is in the agent) and ``GRAPHRUN_HEAD_PRINCIPAL`` (the name the
key has in the allowed_signers file; default ``graphrun@<host>``). Every process
that drives runs (``run``, ``resume``, ``approve``, workers) signs the head it
leaves with a ``HeadSigned`` event; ``audit --verify`` checks that each signed
head is the chain hash at its seq and that the log ends with one.
"""

from __future__ import annotations

import datetime
import os
import socket

import msgspec

from graphrun.runtime.decisions import StatementError

__all__ = ["HEAD_DOMAIN", "HeadStatement", "head_key", "parse_head_statement", "sign_head"]

HEAD_DOMAIN = "graphrun-head@v1"


class HeadStatement(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    domain: str = HEAD_DOMAIN
    run_id: str
    head_seq: int
    head: str
    principal: str
    signed_at: str


_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(HeadStatement)


def parse_head_statement(data: str) -> HeadStatement:
    raw = data.encode("utf-8")
    try:
        stmt = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise StatementError(f"not a head statement: {exc}") from None
    if stmt.domain != HEAD_DOMAIN or _encoder.encode(msgspec.structs.asdict(stmt)) != raw:
        raise StatementError("not a canonical head statement")
    return stmt


def head_key() -> tuple[str, str] | None:
    """``(key file, principal)`` from the environment, or None when heads are not signed."""
    key = os.environ.get("GRAPHRUN_HEAD_KEY", "")
    if not key:
        return None
    principal = os.environ.get("GRAPHRUN_HEAD_PRINCIPAL", "") or f"graphrun@{socket.gethostname()}"
    return key, principal


def sign_head(store: object, run_id: str) -> bool:
    """Append a ``HeadSigned`` over the run's current head when a head key is set and
    the head is not signed already; the caller holds the run's lease. True if signed.

    Raises:
        SigningError: The key cannot sign.
    """
    from graphrun.eventstore.events import HeadSigned
    from graphrun.runtime.decisions.sshsig import sign

    configured = head_key()
    if configured is None or not hasattr(store, "raw_rows"):
        return False  # no key, or a replay's scratch log (never persisted)
    key, principal = configured
    row = store.run(run_id)  # type: ignore[attr-defined]
    last = store.read(run_id, after=row.last_seq - 1)  # type: ignore[attr-defined]
    if last and isinstance(last[-1], HeadSigned):
        return False
    stmt = HeadStatement(
        run_id=run_id,
        head_seq=row.last_seq,
        head=row.last_hash,
        principal=principal,
        signed_at=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    )
    data = _encoder.encode(msgspec.structs.asdict(stmt))
    signature = sign(data, key)
    store.append(  # type: ignore[attr-defined]
        run_id,
        [
            HeadSigned(
                head_seq=row.last_seq,
                head=row.last_hash,
                statement=data.decode("utf-8"),
                signature=signature,
                principal=principal,
            )
        ],
        sync=True,
    )
    return True
