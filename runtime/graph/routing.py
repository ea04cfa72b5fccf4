"""Conditional routes (``routes:`` lists with ``when``) and failure routes (``on_error:``).

Where a node goes next, in priority order (docs/graph-yaml.md, Routing):

on success
  1. a script's ``_next``;
  2. an approval's ``routes`` entry for the option picked, else ``on_other``;
  3. the first entry of a ``routes:`` list whose ``when`` holds over the state
     after the node's updates (``when: default`` always holds);
  4. ``next``.
on failure
  1. the first ``on_error`` entry whose ``match`` is found in the error message
     (``default: true`` matches any);
  2. ``fallback``;
  3. what the kind does without them (llm and script continue to ``next`` with
     ``_error`` set; the others fail the run).

A node may not have both ``on_error`` and ``fallback`` (validate says which to keep).
Evaluation is pure (:mod:`graphrun.runtime.graph.expressions`), so replay takes the
same route.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from graphrun.runtime.graph.expressions import (
    ExpressionError,
    evaluate,
    parse,
    paths,
    writable_keys,
)

DEFAULT = "default"
_MAY_WRITE = "a script or tool may write it"


def _route_list(node: Any) -> list[Any]:
    routes = getattr(node, "routes", None)
    return routes if isinstance(routes, list) else []


def conditions(node: Any) -> list[tuple[str, str]]:
    """``(field, expression)`` of every ``when`` of a ``routes:`` list and of a guard."""
    found = [
        (f"routes[{i}].when", r.when) for i, r in enumerate(_route_list(node)) if r.when != DEFAULT
    ]
    guard = getattr(node, "guard", None)
    if guard is not None:
        found += [
            (f"guard.{side}", e) for side in ("input", "output") if (e := getattr(guard, side))
        ]
    return found


def route_reads(node: Any) -> set[str]:
    """The state keys the node's conditions read."""
    return expression_reads(conditions(node))


def expression_reads(found: list[tuple[str, str]]) -> set[str]:
    roots: set[str] = set()
    for _field, text in found:
        try:
            roots |= {path.split(".")[0] for path in paths(parse(text))}
        except ExpressionError:
            continue
    return roots


def check_expressions(node_id: str, check: Any, found: list[tuple[str, str]]) -> list[Any]:
    """Every expression parses (error) and reads keys the graph writes (warning)."""
    out = []
    known = writable_keys(check.graph)
    for field, text in found:
        path = _path(node_id, field)
        try:
            read = paths(parse(text))
        except ExpressionError as exc:
            out.append(check.diag("error", "expression", str(exc), path, node=node_id))
            continue
        for key in sorted({p.split(".")[0] for p in read} - known):
            close = difflib.get_close_matches(key, sorted(known), n=1)
            out.append(
                check.diag(
                    "warning",
                    "expression-path",
                    f"node '{node_id}': {field} reads '{key}', which no node, initial_state "
                    "or output schema of this graph writes",
                    path,
                    node=node_id,
                    hint=f"did you mean '{close[0]}'?" if close else _MAY_WRITE,
                )
            )
    return out


def _path(node_id: str, field: str) -> str:
    """The JSON path of ``field`` (``routes[0].when``) of node ``node_id``."""
    path = _child("$.nodes", node_id)
    for name, index in re.findall(r"([A-Za-z_]\w*)|\[(\d+)\]", field):
        path = _child(path, name) if name else _child(path, int(index))
    return path


def route_rules(node: Any, node_id: str, check: Any) -> list[Any]:
    """``routes:`` conditions parse and read known keys; ``on_error`` entries are
    well-formed regular expressions; no node has both ``on_error`` and ``fallback``."""
    out = check_expressions(node_id, check, conditions(node))
    on_error = getattr(node, "on_error", None) or []
    for i, entry in enumerate(on_error):
        path = _child_path(node_id, "on_error", i)
        if entry.default == (entry.match is not None):
            out.append(
                check.diag(
                    "error",
                    "on-error",
                    f"node '{node_id}': on_error[{i}] needs either `match: PATTERN` or "
                    "`default: true`",
                    path,
                    node=node_id,
                )
            )
            continue
        if entry.match is not None:
            try:
                re.compile(entry.match)
            except re.error as exc:
                out.append(
                    check.diag(
                        "error",
                        "on-error",
                        f"node '{node_id}': on_error[{i}].match is not a regular expression: {exc}",
                        path + ".match",
                        node=node_id,
                    )
                )
    if on_error and getattr(node, "fallback", None):
        out.append(
            check.diag(
                "error",
                "on-error",
                f"node '{node_id}' has both on_error and fallback; they both route failures",
                _child_path(node_id, "fallback"),
                node=node_id,
                hint="keep on_error and end it with {default: true, to: <the fallback>}",
            )
        )
    return out


def _child(path: str, key: str | int) -> str:
    """A JSON path one step down (the loader's spelling: ``.key``, ``['odd key']``, ``[0]``)."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key):
        return f"{path}.{key}"
    return f"{path}[{key!r}]"


def _child_path(node_id: str, field: str, index: int | None = None) -> str:
    path = _child(_child("$.nodes", node_id), field)
    return _child(path, index) if index is not None else path


def retry_rules(node: Any, node_id: str, check: Any) -> list[Any]:
    """A retry policy's numbers and patterns make sense."""
    policy = getattr(node, "retry", None)
    if policy is None:
        return []
    out = []
    where = _child_path(node_id, "retry")
    if policy.max_attempts < 1:
        out.append(
            check.diag(
                "error",
                "retry",
                f"node '{node_id}': retry.max_attempts must be at least 1",
                f"{where}.max_attempts",
                node=node_id,
            )
        )
    if policy.initial < 0 or policy.max < 0:
        out.append(
            check.diag(
                "error", "retry", f"node '{node_id}': retry delays cannot be negative", where
            )
        )
    for i, pattern in enumerate(policy.on):
        try:
            re.compile(pattern)
        except re.error as exc:
            out.append(
                check.diag(
                    "error",
                    "retry",
                    f"node '{node_id}': retry.on[{i}] is not a regular expression: {exc}",
                    _child(_child(where, "on"), i),
                    node=node_id,
                )
            )
    return out


JOIN_TYPES = ("all", "any", "count")


def join_rules(node: Any, node_id: str, check: Any) -> list[Any]:
    """A join policy sits on a fan-out and its type, count and timeout make sense."""
    policy = getattr(node, "join", None)
    if policy is None:
        return []
    where = _child_path(node_id, "join")

    def err(message: str, path: str) -> Any:
        return check.diag("error", "join", f"node '{node_id}': {message}", path, node=node_id)

    targets = node.next if isinstance(node.next, list) else []
    if len(set(targets)) < 2:
        return [err("join needs a fan-out: a `next` list of two or more nodes", where)]
    if policy.type not in JOIN_TYPES:
        return [
            err(
                f"join.type '{policy.type}' is not one of {', '.join(JOIN_TYPES)}",
                _child(where, "type"),
            )
        ]
    out = []
    branches = len(set(targets))
    nodes = check.graph.nodes
    maps = sorted({t for t in targets if t in nodes and nodes[t].per_item() is not None})
    if maps:
        out.append(
            err(
                f"join cannot count a map branch ({', '.join(maps)}): a map's items are a "
                "step of their own",
                where,
            )
        )
    if policy.type == "count":
        if policy.count is None:
            out.append(err("join.type count needs join.count", where))
        elif not 1 <= policy.count <= branches:
            out.append(
                err(
                    f"join.count must be between 1 and {branches} (the fan-out's branches), "
                    f"not {policy.count}",
                    _child(where, "count"),
                )
            )
    elif policy.count is not None:
        out.append(err("join.count is only for join.type count", _child(where, "count")))
    if policy.timeout is not None and policy.timeout <= 0:
        out.append(err("join.timeout must be more than 0 seconds", _child(where, "timeout")))
    return out


def pick_route(node: Any, state: Mapping[str, Any], default: Any) -> Any:
    """The first ``routes:`` entry whose ``when`` holds over ``state``, else
    ``default`` (``next``). Raises :class:`ExpressionError` when a condition fails."""
    for route in _route_list(node):
        if route.when == DEFAULT or bool(evaluate(route.when, state)):
            return route.to
    return default


def error_route(node: Any, error: str) -> str | None:
    """The first ``on_error`` entry matching ``error`` (its message), else None."""
    for entry in getattr(node, "on_error", None) or ():
        if entry.default or (entry.match is not None and re.search(entry.match, error)):
            return str(entry.to)
    return None


def failure_handled(node: Any, routed_to: str | None) -> bool:
    """Whether a node's failure that routed to ``routed_to`` was handled: a route the
    graph declares for failures took it (``fallback``, an ``on_error`` entry). A
    failure that flowed into ``next`` was not (see ``settings.on_unhandled_failure``)."""
    if node is None or routed_to is None:
        return False
    if getattr(node, "fallback", None) == routed_to:
        return True
    guard = getattr(node, "guard", None)
    if guard is not None and guard.on_fail == routed_to:
        return True  # a guard that did not hold, routed where the graph said
    return any(e.to == routed_to for e in getattr(node, "on_error", None) or ())


__all__ = [
    "DEFAULT",
    "check_expressions",
    "conditions",
    "error_route",
    "expression_reads",
    "failure_handled",
    "pick_route",
    "retry_rules",
    "route_reads",
    "route_rules",
]
