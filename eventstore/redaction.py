"""Secret values that must never be recorded, and their redaction (``***``).

The runtime registers the values of every configured key (LLM client keys, the
passwords in base URLs' userinfo) with :func:`register`; the store passes every
event through :func:`redact_event` before it is encoded, hashed and written, so
nothing recorded — results, state, outputs, requests, URLs — can hold one, and
exports and narration (which read the log) cannot either.

This module knows values, not where they come from: which variables are keys is
decided by :mod:`graphrun.actors.secrets`.
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar

import msgspec

__all__ = ["MASK", "MIN_SECRET_LENGTH", "clear", "redact", "redact_event", "register", "secrets"]

MASK = "***"
#: Shorter values are not treated as secrets (redacting "1" would mangle everything).
MIN_SECRET_LENGTH = 6

_lock = threading.Lock()
_values: tuple[str, ...] = ()
_encoded: tuple[bytes, ...] = ()

E = TypeVar("E")


def register(*values: str | None) -> None:
    """Treat each of ``values`` (ignoring empty or short ones) as a secret from now on."""
    global _values, _encoded
    new = [v for v in values if v and len(v) >= MIN_SECRET_LENGTH and v not in _values]
    if not new:
        return
    with _lock:
        merged = sorted({*_values, *new}, key=len, reverse=True)  # longest first
        _values = tuple(merged)
        # A secret as it appears inside JSON text (keys rarely need escaping).
        _encoded = tuple(msgspec.json.encode(v)[1:-1] for v in merged)


def clear() -> None:
    """Forget every registered secret (tests)."""
    global _values, _encoded
    with _lock:
        _values, _encoded = (), ()


def secrets() -> tuple[str, ...]:
    """The registered secret values, longest first."""
    return _values


def redact(value: Any) -> Any:
    """``value`` (str, bytes, dict, list, tuple, msgspec Struct) with every secret masked.

    Returns the very same object when nothing in it is secret.
    """
    values = _values
    if not values:
        return value
    return _walk(value, values)


def _walk(value: Any, values: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        for secret in values:
            if secret in value:
                value = value.replace(secret, MASK)
        return value
    if isinstance(value, dict):
        out = {_walk(k, values): _walk(v, values) for k, v in value.items()}
        same = all(a is b for a, b in zip(out.values(), value.values(), strict=True))
        return value if same and list(out) == list(value) else out
    if isinstance(value, list | tuple):
        items = [_walk(v, values) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return type(value)(items) if isinstance(value, tuple) else items
    if isinstance(value, bytes):
        for secret in values:
            raw = secret.encode("utf-8")
            if raw in value:
                value = value.replace(raw, MASK.encode())
        return value
    if isinstance(value, msgspec.Struct):
        changes = {}
        for name in value.__struct_fields__:
            item = getattr(value, name)
            new = _walk(item, values)
            if new is not item:
                changes[name] = new
        return msgspec.structs.replace(value, **changes) if changes else value
    return value


def redact_event(event: E, encoded: bytes | None = None) -> E:
    """``event`` with every secret masked in every field; the same object when it holds
    none. ``encoded`` (the event's JSON, if at hand) makes the common case one scan."""
    if not _encoded:
        return event
    if encoded is not None and not any(s in encoded for s in _encoded):
        return event
    return _walk(event, _values)
