"""The one encoder and decoder of events, canonical bytes and the hash chain.

Canonical encoding: msgspec JSON with object keys sorted, so the same event always
encodes to the same bytes, and those bytes are what a store keeps. Each stored event
carries ``hash = "sha256:" + sha256(prev_hash + b"\\n" + stored_bytes)`` (the algorithm
is part of the value); the first event of a run chains from :data:`GENESIS`.
:func:`verify_chain` recomputes it over the bytes as stored, never re-encoding them,
so a log written by a newer graphrun (with fields this one does not know) verifies.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Union, cast, get_args

import msgspec

from graphrun.eventstore.events import Event, LlmCalled

HASH_ALGORITHM = "sha256"
GENESIS = "sha256:" + "0" * 64

_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(Event)
_any_decoder = msgspec.json.Decoder()

#: ``LlmCalled`` for a reader that never looks inside an LLM call's wire bodies
#: (``graphrun replay``, which serves each recorded call whole): its ``request``,
#: ``response`` and ``tool_calls`` stay the JSON text they were stored as
#: (``msgspec.Raw``, re-encoded byte for byte). A 10,000-item map's replay then holds
#: 10,000 strings where it held 60,000 dicts and lists for the collector to walk.
#: It is an ``LlmCalled`` (a subclass of the same name and tag): every other field
#: is the same.
LightLlmCalled = cast(
    "type[LlmCalled]",
    msgspec.defstruct(
        "LlmCalled",
        [
            ("request", msgspec.Raw, msgspec.Raw(b"{}")),
            ("response", msgspec.Raw, msgspec.Raw(b"null")),
            ("tool_calls", msgspec.Raw, msgspec.Raw(b"[]")),
        ],
        bases=(LlmCalled,),
        module=LlmCalled.__module__,
        frozen=True,
        kw_only=True,
        tag="LlmCalled",
    ),
)
_light_decoder = msgspec.json.Decoder(
    Union[tuple(LightLlmCalled if t is LlmCalled else t for t in get_args(Event))]  # noqa: UP007
)


def wire_data(value: Any) -> Any:
    """An LLM call's wire body as data, whether it was read light (left as its JSON
    text by :data:`LightLlmCalled`) or not."""
    return _any_decoder.decode(value) if isinstance(value, msgspec.Raw) else value


def raw_as_json(value: Any) -> Any:
    """An ``enc_hook`` that turns what :data:`LightLlmCalled` left undecoded into data."""
    if isinstance(value, msgspec.Raw):
        return wire_data(value)
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


#: What decoding stored bytes can raise: not JSON, not an event, not UTF-8 (msgspec
#: reports invalid UTF-8 inside a string as ``UnicodeDecodeError``), nested too deep.
DECODE_ERRORS: tuple[type[Exception], ...] = (
    msgspec.DecodeError,
    msgspec.ValidationError,
    UnicodeDecodeError,
    RecursionError,
)


def encode(event: Event) -> bytes:
    """Canonical JSON bytes of an event."""
    return _encoder.encode(event)


def decode(data: bytes | str, *, light: bool = False) -> Event:
    """Decode one event; raises one of :data:`DECODE_ERRORS`. ``light``: an LLM call's
    wire bodies are left undecoded (:data:`LightLlmCalled`)."""
    return (_light_decoder if light else _decoder).decode(data)


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


def unpack_body(stored: str | bytes) -> bytes:
    """The bytes of a stored body as SQLite hands it back (text or a BLOB)."""
    return stored.encode("utf-8") if isinstance(stored, str) else bytes(stored)


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


class _Envelope(msgspec.Struct):
    """The part of a stored body verification reads (any event type, any fields)."""

    type: str = ""
    run_id: str = ""
    seq: int = 0


_envelope = msgspec.json.Decoder(_Envelope)


def read_body(
    body: bytes, run_id: str | None, seq: int, *, light: bool = False
) -> tuple[Event | None, str | None]:
    """A stored body (whose hash matched) as its event, or why it is not a readable
    event of ``run_id`` at ``seq``: ``(event, None)`` or ``(None, problem)``. Reads
    the bytes as they are, never re-encodes them.

    One decode when the body is sound; only a body that does not decode is read again
    for its envelope, so that one of another run or seq says so first. ``light``: an
    LLM call's wire bodies are left undecoded (:data:`LightLlmCalled`)."""
    try:
        event = (_light_decoder if light else _decoder).decode(body)
    except DECODE_ERRORS as exc:
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as bad:
            return None, f"event does not decode: not valid UTF-8 (byte {bad.start})"
        try:
            envelope = _envelope.decode(body)
        except DECODE_ERRORS as exc2:
            return None, f"event does not decode: {exc2}"
        problem = _misplaced(envelope.run_id, envelope.seq, run_id, seq)
        return None, problem or f"event does not decode with this graphrun: {exc}"
    problem = _misplaced(event.run_id, event.seq, run_id, seq)
    return (None, problem) if problem is not None else (event, None)


def _misplaced(found_run: str, found_seq: int, run_id: str | None, seq: int) -> str | None:
    if run_id is not None and found_run != run_id:
        return f"event body says run {found_run!r}"
    if found_seq != seq:
        return f"event body says seq {found_seq}"
    return None


def verify_chain(
    rows: Iterable[tuple[int, bytes, str, str]],
    run_id: str | None = None,
    into: list[Event] | None = None,
    hashes: dict[int, str] | None = None,
    *,
    light: bool = False,
) -> ChainProblem | None:
    """Check stored ``(seq, body, prev_hash, hash)`` rows of one run, in seq order.

    Each hash must be ``sha256:`` over the previous hash and the body's exact
    stored bytes; unknown fields a newer graphrun wrote verify like any other.
    Returns the first problem (gap, broken link, unknown hash algorithm, wrong
    hash, a body that is not UTF-8 JSON of this run and seq), or ``None``. ``into``,
    if given, gets each verified event, decoded (the check decodes it anyway);
    ``hashes``, if given, each verified event's chain hash by seq; ``light``: the
    events' LLM wire bodies are left undecoded (:func:`read_body`).
    """
    expected_prev = GENESIS
    expected_seq = 1
    for seq, body, prev_hash, stored_hash in rows:
        if seq != expected_seq:
            return ChainProblem(expected_seq, f"missing event (next stored seq is {seq})")
        if prev_hash != expected_prev:
            return ChainProblem(seq, "prev_hash does not match the previous event's hash")
        if not isinstance(stored_hash, str) or not stored_hash.startswith(HASH_ALGORITHM + ":"):
            return ChainProblem(seq, f"unknown hash algorithm in {str(stored_hash)[:20]!r}")
        if chain_hash(prev_hash, body) != stored_hash:
            return ChainProblem(seq, "hash does not match the event's content (modified?)")
        event, problem = read_body(body, run_id, seq, light=light)
        if problem is not None:
            return ChainProblem(seq, problem)
        if into is not None and event is not None:
            into.append(event)
        if hashes is not None:
            hashes[seq] = stored_hash
        expected_prev = stored_hash
        expected_seq += 1
    return None
