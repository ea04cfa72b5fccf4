"""Snapshots: a run's folded state kept at a verified point of its log.

A command that continues a run reads and verifies the whole log anyway; folding
it again from the first event is what a snapshot saves. A snapshot is the
:class:`~graphrun.eventstore.fold.RunState` after seq ``N``, encoded, next to the
chain hash of event ``N``. It is only ever used when that hash is the one the
log, verified as it was read, has at ``N``: the fold then starts from the
snapshot and applies the events after ``N``. The log stays the source of truth:
a snapshot of another fold (this code's ``fold.py`` or ``events.py`` changed),
of another log (the hash differs), damaged or unreadable, is ignored and the
log folded from its first event.

A snapshot is only ever made from events read back from the log, each checked
against the chain, never from a driver's working state (which holds values the
store redacts, and events as the process built them rather than as they were
stored): :func:`fold_stored` folds stored rows onto the last snapshot, checking
that each row chains to the one before.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from graphrun.eventstore import codec, events, fold
from graphrun.eventstore.events import Event
from graphrun.eventstore.fold import BranchEffects, RunState

__all__ = [
    "Stored",
    "decode_state",
    "encode_state",
    "fingerprint",
    "fold_stored",
    "state_from",
]

#: A stored snapshot row: ``(seq, chain hash of that seq, body, digest)``.
Stored = tuple[int, str, bytes, str]


class _Body(msgspec.Struct, frozen=True, kw_only=True):
    """What a snapshot's body holds: the fold it was made by, where, and the state."""

    fold: str
    run_id: str
    seq: int
    hash: str
    state: RunState


def _enc_hook(value: Any) -> Any:
    if isinstance(value, BranchEffects):
        return dict(value)
    raise NotImplementedError(f"a run state holds a {type(value).__name__}")


_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)
_decoder = msgspec.json.Decoder(_Body)


@functools.cache
def fingerprint() -> str | None:
    """What makes a snapshot foldable by this code: a hash of the fold and of the
    events it reads (a snapshot made by other code is ignored). ``None`` when the
    sources cannot be read: no snapshot is made or used then."""
    digest = hashlib.sha256()
    for module in (fold, events):
        try:
            digest.update(Path(module.__file__ or "").read_bytes())
        except OSError:
            return None
    return f"sha256:{digest.hexdigest()}"


def encode_state(state: RunState, chain_hash: str) -> tuple[bytes, str] | None:
    """The body of a snapshot of ``state`` (at ``state.last_seq``, whose chain hash
    is ``chain_hash``) and its digest, or ``None`` when there is no fingerprint."""
    mark = fingerprint()
    if mark is None:
        return None
    body = _encoder.encode(
        _Body(fold=mark, run_id=state.run_id, seq=state.last_seq, hash=chain_hash, state=state)
    )
    return body, _digest(body)


def decode_state(stored: Stored, run_id: str) -> RunState | None:
    """The state a stored snapshot holds, or ``None`` when it is not usable by this
    code for ``run_id`` (another fold, damaged, or it disagrees with its row)."""
    seq, chain_hash, body, digest = stored
    mark = fingerprint()
    if mark is None or not isinstance(body, bytes | bytearray | memoryview):
        return None
    body = bytes(body)
    if digest != _digest(body):
        return None
    try:
        found = _decoder.decode(body)
    except codec.DECODE_ERRORS:
        return None
    state = found.state
    if (
        found.fold != mark
        or found.run_id != run_id
        or state.run_id != run_id
        or found.seq != seq
        or state.last_seq != seq
        or found.hash != chain_hash
    ):
        return None
    # The decoder reads a map of branch effects as a dict; the fold keeps them in
    # a BranchEffects (same items, same order).
    effects = state.branch_effects
    if not isinstance(effects, BranchEffects):
        effects = BranchEffects(effects)
        state = msgspec.structs.replace(state, branch_effects=effects)
    return state


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def state_from(
    stored: Stored | None,
    run_id: str,
    verified: Sequence[Event],
    hashes: Mapping[int, str],
) -> RunState | None:
    """The fold of ``verified`` (a run's whole log, as it was just read and
    verified; ``hashes``: their chain hashes by seq) started from the snapshot
    ``stored``, or ``None`` when the snapshot is missing or is not one of this
    log: the caller folds from the first event then."""
    if stored is None:
        return None
    seq, chain_hash = stored[0], stored[1]
    if not 0 < seq <= len(verified) or hashes.get(seq) != chain_hash:
        return None
    if verified[seq - 1].seq != seq:  # a verified log has no gaps; be sure anyway
        return None
    state = decode_state(stored, run_id)
    if state is None:
        return None
    return fold.fold(verified[seq:], state)


def fold_stored(
    run_id: str,
    base: Stored | None,
    rows: Sequence[tuple[int, bytes, str]],
) -> tuple[RunState, str] | None:
    """The state after stored ``rows`` (``(seq, body, hash)`` in seq order, every row
    after the snapshot ``base``, or every row of the run when ``base`` is
    ``None``) and the chain hash of the last of them; ``None`` when a row does not
    chain to the one before it (or to ``base``), or does not decode as this run's
    event at its seq."""
    if base is None:
        state, seq, prev = RunState(), 0, codec.GENESIS
    else:
        kept = decode_state(base, run_id)
        if kept is None:
            return None
        state, seq, prev = kept, base[0], base[1]
    chain_hash = codec.chain_hash
    read_body = codec.read_body
    apply = fold.apply
    for row_seq, body, stored_hash in rows:
        seq += 1
        if row_seq != seq or chain_hash(prev, body) != stored_hash:
            return None
        event, problem = read_body(body, run_id, seq)
        if event is None or problem is not None:
            return None
        state = apply(state, event)
        prev = stored_hash
    return state, prev
