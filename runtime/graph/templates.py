"""``{{path}}`` templates, exactly as the spec's State and Templates section says.

Paths: ``key``, ``a.b.c``, ``arr[0]``, ``matrix[0][1]``, ``users[0].name`` and any
mix. Rendering: strings as-is; numbers, booleans and null stringified
(``42``, ``true``, ``null``); arrays and objects as compact JSON. Missing keys raise
:class:`TemplateError` in strict mode (a node's primary fields) and render as ``""``
in lenient mode (``state_updates``).

One addition: a ``state_updates`` value that is exactly one expression
(``"{{output.sources}}"``) stores the value itself, keeping its JSON type, so
``{{rag_sources[0]}}`` works downstream; rendering it into text later gives the
same string the spec's rules give.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from graphrun.runtime.errors import TemplateError

_EXPR = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_SEGMENT = re.compile(r"([^.\[\]]+)|\[(-?\d+)\]|\.")
_MISSING = object()


@lru_cache(maxsize=4096)
def parse_path(path: str) -> tuple[str | int, ...]:
    """``"users[0].name"`` -> ``("users", 0, "name")``; raises ValueError if malformed."""
    if not path:
        raise ValueError("empty template expression")
    parts: list[str | int] = []
    pos = 0
    expect_key = True
    while pos < len(path):
        m = _SEGMENT.match(path, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"malformed template path {path!r}")
        if m.group(1) is not None:
            if not expect_key:
                raise ValueError(f"malformed template path {path!r}")
            parts.append(m.group(1))
            expect_key = False
        elif m.group(2) is not None:
            if not parts:
                raise ValueError(f"malformed template path {path!r}")
            parts.append(int(m.group(2)))
            expect_key = False
        else:  # "."
            if expect_key:
                raise ValueError(f"malformed template path {path!r}")
            expect_key = True
        pos = m.end()
    if expect_key:
        raise ValueError(f"malformed template path {path!r}")
    return tuple(parts)


def lookup(context: Mapping[str, Any], path: str) -> Any:
    """The value at ``path``, or the module's ``_MISSING`` sentinel."""
    value: Any = context
    for part in parse_path(path):
        if isinstance(part, int):
            if isinstance(value, list) and -len(value) <= part < len(value):
                value = value[part]
            else:
                return _MISSING
        # A dict first: the ABC check is the slow part of a lookup.
        elif (type(value) is dict or isinstance(value, Mapping)) and part in value:
            value = value[part]
        else:
            return _MISSING
    return value


def to_text(value: Any) -> str:
    """The spec's rendering rules for one value."""
    if isinstance(value, str):
        return value
    if type(value) is int:  # what JSON writes for it, without the encoder (a map's index)
        return str(value)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def unterminated(template: str) -> int | None:
    """The offset of the first ``{{`` that no ``}}`` closes, or None.

    Such text renders as itself, braces and all, which is never what was meant:
    ``validate`` reports it.
    """
    start = template.find("{{")
    while start != -1:
        match = _EXPR.match(template, start)
        if match is None:
            return start
        start = template.find("{{", match.end())
    return None


def expressions(template: str) -> list[str]:
    """The paths a template refers to (for validation)."""
    return [m.group(1) for m in _EXPR.finditer(template)]


def render(template: str, context: Mapping[str, Any], *, strict: bool, field: str = "") -> str:
    """Render ``template`` against ``context``."""
    if "{{" not in template:
        return template
    out: list[str] = []
    for text, path in _pieces(template):
        out.append(text)
        if path is None:
            break
        try:
            value = lookup(context, path)
        except ValueError as exc:
            if strict:
                raise TemplateError(f"{exc} in {field or 'template'}") from None
            continue
        if value is _MISSING:
            if strict:
                raise TemplateError(
                    f"{{{{{path}}}}} in {field or 'template'}: '{path}' is not in state",
                    hint=_hint(context, path),
                )
            continue
        out.append(to_text(value))
    return "".join(out)


@lru_cache(maxsize=1024)
def _pieces(template: str) -> tuple[tuple[str, str | None], ...]:
    """``template`` as (text, path) pieces, each text followed by the expression at
    ``path``; the last piece's path is None. Found once per template (a map renders
    one template per item)."""
    pieces: list[tuple[str, str | None]] = []
    pos = 0
    for m in _EXPR.finditer(template):
        pieces.append((template[pos : m.start()], m.group(1)))
        pos = m.end()
    pieces.append((template[pos:], None))
    return tuple(pieces)


def _hint(context: Mapping[str, Any], path: str) -> str | None:
    import difflib

    root = parse_path(path)[0] if path else ""
    keys = [k for k in context if isinstance(k, str)]
    if isinstance(root, str) and root not in context:
        close = difflib.get_close_matches(root, keys, n=1)
        if close:
            return f"did you mean '{close[0]}'?"
        if keys:
            shown = ", ".join(sorted(keys)[:8])
            return f"state has: {shown}" + (", …" if len(keys) > 8 else "")
        return "state is empty"
    return None


def render_update(value: Any, context: Mapping[str, Any]) -> Any:
    """Evaluate one ``state_updates`` value (lenient; whole-expression keeps its type)."""
    if isinstance(value, str):
        m = _EXPR.fullmatch(value.strip()) if value.startswith("{{") else None
        if m is not None and value.strip() == value:
            try:
                found = lookup(context, m.group(1))
            except ValueError:
                return ""
            return "" if found is _MISSING else found
        return render(value, context, strict=False)
    if isinstance(value, list):
        return [render_update(v, context) for v in value]
    if isinstance(value, dict):
        return {k: render_update(v, context) for k, v in value.items()}
    return value


def render_updates(
    updates: Mapping[str, Any], state: Mapping[str, Any], scoped: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Evaluate a node's ``state_updates`` against state plus scoped variables.

    The scoped variables (``output``, ``choice``, ``input``) exist only here: they
    are not part of the returned updates unless a template stores them.
    """
    if not updates:
        return {}
    context: Mapping[str, Any] = {**state, **scoped} if scoped else state
    return {key: render_update(value, context) for key, value in updates.items()}
