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
#: Every kind a failure can have, with what it means (docs/graph-yaml.md lists them).
ERROR_KINDS: dict[str, str] = {
    "TimeoutError": "the node's effect ran out of time (its `timeout`, an LLM call's)",
    "HTTPError": "an LLM provider answered with an HTTP error status (the message has it)",
    "ConnectionError": "an LLM provider could not be reached",
    "LLMError": "an LLM call failed otherwise (no usable reply, a configuration error)",
    "OutputSchemaError": "a reply or child output did not match the node's output_schema",
    "ScriptExit": "a script exited with a non-zero status",
    "ScriptOutput": "a script's output was not usable (bad `_next`, not JSON)",
    "ToolError": "a tool failed or is unknown",
    "AgentFailed": "a child agent's run failed",
    "RetrievalError": "a rag node's retrieval failed",
    "GuardFailed": "an input or output guard did not hold",
    "ExpressionError": "a route, guard or condition expression failed on the state",
    "TemplateError": "a template read a key the state does not have",
    "Cancelled": "the effect was cancelled (a join, a parent run)",
}

_MAY_WRITE = "a script or tool may write it"


def _route_list(node: Any) -> list[Any]:
    routes = getattr(node, "routes", None)
    return routes if isinstance(routes, list) else []


def conditions(node: Any) -> list[tuple[str, str]]:
    """``(field, expression)`` of every ``when`` of a ``routes:`` list, of a guard's
    expressions (not its schemas) and of ``if``/``unless``."""
    found = [
        (f"routes[{i}].when", r.when) for i, r in enumerate(_route_list(node)) if r.when != DEFAULT
    ]
    guard = getattr(node, "guard", None)
    if guard is not None:
        found += [
            (f"guard.{side}", e)
            for side in ("input", "output")
            if isinstance(e := getattr(guard, side), str)
        ]
    return found


def skip_conditions(node: Any) -> list[tuple[str, str]]:
    """``(field, expression)`` of a node's ``if`` and ``unless``."""
    found = []
    if getattr(node, "if_", None) is not None:
        found.append(("if", node.if_))
    if getattr(node, "unless", None) is not None:
        found.append(("unless", node.unless))
    return found


def skip_reason(node: Any, state: Mapping[str, Any]) -> str | None:
    """Why the node is skipped over ``state`` (its ``if`` is false or its ``unless``
    true), or None when it runs. Raises :class:`ExpressionError` when one fails."""
    if node.if_ is not None and not bool(evaluate(node.if_, state)):
        return f"if {node.if_!r} is false"
    if node.unless is not None and bool(evaluate(node.unless, state)):
        return f"unless {node.unless!r} is true"
    return None


def route_reads(node: Any) -> set[str]:
    """The state keys the node's conditions (and ``if``/``unless``) read."""
    return expression_reads(conditions(node) + skip_conditions(node))


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
    well-formed regular expressions and known kinds; no node has both ``on_error`` and
    ``fallback``; a node with ``if``/``unless`` has a ``next`` to skip to."""
    out = check_expressions(node_id, check, conditions(node))
    out += guard_schema_rules(node, node_id, check)
    on_error = getattr(node, "on_error", None) or []
    for i, entry in enumerate(on_error):
        path = _child_path(node_id, "on_error", i)
        if entry.default == (entry.match is not None or entry.kind is not None):
            out.append(
                check.diag(
                    "error",
                    "on-error",
                    f"node '{node_id}': on_error[{i}] needs either `match: PATTERN` and/or "
                    "`kind: KIND`, or `default: true`",
                    path,
                    node=node_id,
                )
            )
            continue
        if entry.kind is not None and entry.kind not in ERROR_KINDS:
            close = difflib.get_close_matches(entry.kind, sorted(ERROR_KINDS), n=1)
            out.append(
                check.diag(
                    "error",
                    "on-error",
                    f"node '{node_id}': on_error[{i}].kind '{entry.kind}' is not a failure kind",
                    path + ".kind",
                    node=node_id,
                    hint=f"did you mean '{close[0]}'?"
                    if close
                    else "one of " + ", ".join(sorted(ERROR_KINDS)),
                )
            )
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


def skip_rules(node: Any, node_id: str, check: Any) -> list[Any]:
    """Every node's ``if``/``unless``: they parse, read keys the graph writes, and the
    node has a ``next`` to go to when it is skipped."""
    found = skip_conditions(node)
    out = check_expressions(node_id, check, found)
    if not found or node.targets or node.next == []:
        return out
    if any(getattr(n, "branch", None) == node_id for n in check.graph.nodes.values()):
        return out  # a map's branch: a skipped item collects null
    field = found[0][0]
    return [
        *out,
        check.diag(
            "error",
            "skip",
            f"node '{node_id}': `{field}` needs a `next` to go to when the node is skipped",
            _child_path(node_id, field),
            node=node_id,
            hint="add `next: <node>` (`next: []` ends the branch)",
        ),
    ]


def guard_schema_rules(node: Any, node_id: str, check: Any) -> list[Any]:
    """A guard's JSON Schema (a mapping) is itself a valid draft 2020-12 schema."""
    guard = getattr(node, "guard", None)
    if guard is None:
        return []
    import jsonschema

    out = []
    for side in ("input", "output"):
        schema = getattr(guard, side)
        if not isinstance(schema, dict):
            continue
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            where = "/".join(str(p) for p in exc.absolute_path)
            out.append(
                check.diag(
                    "error",
                    "guard-schema",
                    f"node '{node_id}': guard.{side} is not a valid JSON Schema"
                    f"{f' (at {where})' if where else ''}: {exc.message}",
                    _child(_child_path(node_id, "guard"), side),
                    node=node_id,
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


def error_route(node: Any, error: str, kind: str = "") -> str | None:
    """The first ``on_error`` entry matching a failure of ``kind`` with message
    ``error`` (``match`` is searched in ``"<kind>: <message>"``), else None."""
    text = f"{kind}: {error}" if kind else error
    for entry in getattr(node, "on_error", None) or ():
        if entry.default:
            return str(entry.to)
        if entry.kind is not None and entry.kind != kind:
            continue
        if entry.match is None or re.search(entry.match, text):
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
    "ERROR_KINDS",
    "check_expressions",
    "conditions",
    "error_route",
    "expression_reads",
    "failure_handled",
    "pick_route",
    "retry_rules",
    "route_reads",
    "route_rules",
    "skip_conditions",
    "skip_reason",
    "skip_rules",
]
