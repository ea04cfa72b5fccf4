"""The one encoder and decoder of events, canonical bytes and the hash chain.

Canonical encoding: msgspec JSON with object keys sorted, so the same event always
encodes to the same bytes. Each stored event carries ``prev_hash`` and
``hash = "sha256:" + sha256(prev_hash + b"\\n" + canonical_bytes)``; the first
event of a run chains from :data:`GENESIS`. :func:`verify_chain` recomputes it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from graphrun.eventstore.events import Event

HASH_ALGORITHM = "sha256"
GENESIS = "sha256:" + "0" * 64

_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(Event)
_any_decoder = msgspec.json.Decoder()


def encode(event: Event) -> bytes:
    """Canonical JSON bytes of an event."""
    return _encoder.encode(event)


def decode(data: bytes | str) -> Event:
    """Decode one event; raises ``msgspec.DecodeError`` / ``ValidationError``."""
    return _decoder.decode(data)


def encode_any(value: Any) -> bytes:
    """Canonical JSON bytes of any JSON-compatible value."""
    return _encoder.encode(value)


def decode_any(data: bytes | str) -> Any:
    return _any_decoder.decode(data)


def to_builtins(event: Event) -> dict[str, Any]:
    """The event as a plain dict (with its ``type`` tag)."""
    return msgspec.to_builtins(event)


def from_builtins(value: dict[str, Any]) -> Event:
    return msgspec.convert(value, Event)


def chain_hash(prev_hash: str, body: bytes) -> str:
    digest = hashlib.sha256()
    digest.update(prev_hash.encode("ascii"))
    digest.update(b"\n")
    digest.update(body)
    return f"{HASH_ALGORITHM}:{digest.hexdigest()}"


def content_hash(data: bytes | str) -> str:
    """``sha256:<hex>`` of some bytes or text (graph sources, scripts, inputs)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return f"{HASH_ALGORITHM}:{hashlib.sha256(data).hexdigest()}"


@dataclass(frozen=True)
class ChainProblem:
    """The first place a run's stored log does not verify."""

    seq: int
    reason: str


def verify_chain(rows: Iterable[tuple[int, bytes, str, str]]) -> ChainProblem | None:
    """Check stored ``(seq, body, prev_hash, hash)`` rows of one run, in seq order.

    Returns the first problem (gap, broken link, wrong hash, undecodable body), or
    ``None`` when every event verifies.
    """
    expected_prev = GENESIS
    expected_seq = 1
    for seq, body, prev_hash, stored_hash in rows:
        if seq != expected_seq:
            return ChainProblem(expected_seq, f"missing event (next stored seq is {seq})")
        if prev_hash != expected_prev:
            return ChainProblem(seq, "prev_hash does not match the previous event's hash")
        if chain_hash(prev_hash, body) != stored_hash:
            return ChainProblem(seq, "hash does not match the event's content (modified?)")
        try:
            event = decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return ChainProblem(seq, f"event does not decode: {exc}")
        if event.seq != seq:
            return ChainProblem(seq, f"event body says seq {event.seq}")
        expected_prev = stored_hash
        expected_seq += 1
    return None
