"""Reducers: how the writes of a super-step's branches (and of every node) combine.

A branch's *writes* are the keys whose final value differs from the step's
snapshot (new keys included). :func:`merge_writes` groups them by key (keys in
sorted order, writers in node-id order) and folds each group into the live value
through the key's declared reducer; a key with no reducer may have one writer only
(the runtime single-writer rule). Pure functions of JSON values: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from graphrun.runtime.errors import GraphrunError

#: The live value of a key that is not in state (distinct from ``None``/null).
ABSENT: Any = type("Absent", (), {"__repr__": lambda self: "<absent>"})()


class ReducerError(GraphrunError):
    """A reducer met a value of the wrong type, or two writers met no reducer."""


def json_type(value: Any) -> str:
    """The JSON type name of a value, as messages print it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def differs(a: Any, b: Any) -> bool:
    """JSON inequality (``1`` and ``True`` differ, as do ``1`` and ``1.0``)."""
    if type(a) is not type(b):
        return True
    if isinstance(a, dict):
        return a.keys() != b.keys() or any(differs(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) != len(b) or any(differs(x, y) for x, y in zip(a, b, strict=True))
    return bool(a != b)


def writes_of(snapshot: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``after`` whose value differs from ``snapshot`` (new keys included)."""
    return {k: v for k, v in after.items() if k not in snapshot or differs(snapshot[k], v)}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(value: float) -> Any:
    if not math.isfinite(value):
        return None
    if float(value).is_integer() and abs(value) <= 2**63 - 1:
        return int(value)
    return value


def _wrong(name: str, which: str, want: str, value: Any) -> ReducerError:
    absent = " (or absent)" if which == "current" and name not in ("sum", "max", "min") else ""
    return ReducerError(
        f"reducer '{name}' requires {want}{absent} for the {which} value, got {json_type(value)}"
    )


def reduce(name: str, current: Any, incoming: Any, *, key: str = "", writer: str = "") -> Any:
    """Fold one incoming value into the current one (``ABSENT`` when the key is missing).

    ``key`` (and ``writer``, the node whose write it is) name the state key in a
    type error."""
    try:
        return _reduce(name, current, incoming)
    except ReducerError as exc:
        if not key:
            raise
        by = f" (written by '{writer}')" if writer else ""
        raise ReducerError(f"state key '{key}'{by}: {exc}") from None


def _reduce(name: str, current: Any, incoming: Any) -> Any:
    if name == "overwrite":
        return incoming
    if name in ("append", "extend"):
        cur = [] if current is ABSENT else current
        if not isinstance(cur, list):
            raise _wrong(name, "current", "an array", current)
        if name == "append":
            return [*cur, incoming]
        if not isinstance(incoming, list):
            raise _wrong(name, "incoming", "an array", incoming)
        return [*cur, *incoming]
    if name == "concat":
        if not isinstance(incoming, str):
            raise _wrong(name, "incoming", "a string", incoming)
        if current is ABSENT:
            return incoming
        if not isinstance(current, str):
            raise _wrong(name, "current", "a string", current)
        return incoming if current == "" else f"{current}\n{incoming}"
    if name in ("sum", "max", "min"):
        if not _number(incoming):
            raise _wrong(name, "incoming", "a number", incoming)
        if current is ABSENT:
            return incoming if name != "sum" else _whole(float(incoming))
        if not _number(current):
            raise _wrong(name, "current", "a number", current)
        if name == "sum":
            return _whole(float(current) + float(incoming))
        pick = max(current, incoming) if name == "max" else min(current, incoming)
        return _whole(float(pick))
    if name == "merge":
        if not isinstance(incoming, dict):
            raise _wrong(name, "incoming", "an object", incoming)
        cur = {} if current is ABSENT else current
        if not isinstance(cur, dict):
            raise _wrong(name, "current", "an object", current)
        return {**cur, **incoming}
    raise ReducerError(f"unknown reducer '{name}'")


def merge_writes(
    live: dict[str, Any], writes: dict[str, dict[str, Any]], reducers: Mapping[str, str]
) -> dict[str, Any]:
    """The state keys a set of branch writes sets: ``{key: final value}``.

    ``writes`` maps each writer (a branch's node id) to its writes; writers are taken
    in sorted order whatever order they finished in.

    Raises:
        ReducerError: a reducer's type rule failed, or a key without a reducer had
            two or more writers.
    """
    by_key: dict[str, list[tuple[str, Any]]] = {}
    for writer in sorted(writes):
        for key, value in writes[writer].items():
            by_key.setdefault(key, []).append((writer, value))
    merged: dict[str, Any] = {}
    for key in sorted(by_key):
        values = by_key[key]
        reducer = reducers.get(key)
        if reducer is None:
            if len(values) > 1:
                names = ", ".join(w for w, _ in values)
                raise ReducerError(
                    f"Key '{key}' was written by {len(values)} parallel branches ({names}) "
                    "but has no reducer declared: add one under `reducers:` (append, "
                    "extend, concat, sum, max, min, merge, overwrite) or write different keys"
                )
            merged[key] = values[0][1]
            continue
        current = live.get(key, ABSENT)
        for writer, value in values:
            current = reduce(reducer, current, value, key=key, writer=writer)
        merged[key] = current
    return merged


__all__ = ["ABSENT", "ReducerError", "differs", "json_type", "merge_writes", "reduce", "writes_of"]
