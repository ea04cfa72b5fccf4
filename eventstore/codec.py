"""The one encoder and decoder of events, canonical bytes and the hash chain.

Canonical encoding: msgspec JSON with object keys sorted, so the same event always
encodes to the same bytes. Each stored event carries ``prev_hash`` and
``hash = "sha256:" + sha256(prev_hash + b"\\n" + canonical_bytes)``; the first
event of a run chains from :data:`GENESIS`. :func:`verify_chain` recomputes it.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from graphrun.eventstore.events import Event, RunStarted

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


#: Bodies at least this long are stored zlib-compressed when that saves space
#: (below it a body gains little and zlib's set-up would cost more than the write).
COMPRESS_FROM = 1024


def pack_body(body: bytes, compress: bool = True) -> str | bytes:
    """What the store keeps for canonical bytes ``body``: the JSON text, or, for a
    large body that compresses by a tenth or more, its zlib bytes."""
    if compress and len(body) >= COMPRESS_FROM:
        # A window no larger than the body: zlib's set-up cost grows with it.
        wbits = 13 if len(body) <= 8192 else 15
        squeeze = zlib.compressobj(6, zlib.DEFLATED, wbits, wbits - 8)
        packed = squeeze.compress(body) + squeeze.flush()
        if len(packed) <= len(body) * 0.9:
            return packed
    return body.decode("utf-8")


def unpack_body(stored: str | bytes) -> bytes:
    """The canonical bytes of a stored body (raises ``zlib.error`` if damaged).

    Bytes are compressed unless they are plain JSON (a hand-edited row)."""
    if isinstance(stored, str):
        return stored.encode("utf-8")
    if stored[:1] == b"{":
        return stored
    return zlib.decompress(stored)


#: Kept as plain JSON whatever their size, so SQL can read the human decisions.
PLAIN_TYPES = frozenset({"HumanInputRequested", "HumanInputReceived"})


def storable(event: Event, canonical: bytes) -> bytes:
    """The bytes the store keeps for a stamped event: its canonical bytes without
    ``run_id``, ``seq`` and ``ts`` (the row's key and ``ts`` column hold those),
    except a ``RunStarted``, kept whole so the log alone names its run."""
    if isinstance(event, RunStarted):
        return canonical
    return _encoder.encode(msgspec.structs.replace(event, run_id="", seq=0, ts=0.0))


def event_from_row(stored: str | bytes, run_id: str, seq: int, ts: float) -> Event:
    """The event a stored row holds (a whole stored body is taken as it is)."""
    event = _decoder.decode(stored if isinstance(stored, str) else unpack_body(stored))
    if event.run_id:
        return event
    return msgspec.structs.replace(event, run_id=run_id, seq=seq, ts=ts)


def canonical_from_row(stored: str | bytes, run_id: str, seq: int, ts: float) -> bytes:
    """The canonical bytes (the ones the chain hashes) of a stored row.

    A row that does not unpack or decode gives its stored bytes: they will not
    hash to the stored hash, and verification names the row."""
    try:
        raw = unpack_body(stored)
    except zlib.error:
        return stored if isinstance(stored, bytes) else stored.encode("utf-8")
    try:
        event = _decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return raw
    if event.run_id:
        return raw
    return _encoder.encode(msgspec.structs.replace(event, run_id=run_id, seq=seq, ts=ts))


def chain_hash(prev_hash: str, body: bytes) -> str:
    """``sha256:<hex>`` chaining ``body`` (canonical bytes) to ``prev_hash``."""
    return f"{HASH_ALGORITHM}:{chain_digest(prev_hash, body).hex()}"


def chain_digest(prev_hash: str, body: bytes) -> bytes:
    """The raw 32 bytes of :func:`chain_hash` (what the store keeps)."""
    return _sha256(prev_hash.encode("ascii") + b"\n" + body).digest()


_sha256 = hashlib.sha256


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
