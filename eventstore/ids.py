"""Typed identifiers and the clock/id sources that stamp events.

The decider never reads the clock or makes ids: the supervisor does, through a
:class:`Clock` and :func:`new_run_id`, and what it read is recorded in the events.
"""

from __future__ import annotations

import os
import time
from typing import NewType

RunId = NewType("RunId", str)
NodeId = NewType("NodeId", str)
Seq = NewType("Seq", int)

_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"


def new_run_id(now: float | None = None) -> RunId:
    """A sortable, unique run id: 48 bits of milliseconds then 40 random bits (base32)."""
    millis = int((time.time() if now is None else now) * 1000)
    value = (millis << 40) | int.from_bytes(os.urandom(5), "big")
    chars = []
    for _ in range(18):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return RunId("".join(reversed(chars)))


class Clock:
    """Wall clock; tests inject a fake one."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()
