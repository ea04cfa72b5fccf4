"""Expressions in graph.yaml (``when``, a decision's ``expr``): one safe evaluator.

An expression reads the run's state with the paths templates use
(``ticket.priority``, ``items[0]``, ``len(results) > 2``) and nothing else: it is
evaluated by `simpleeval <https://pypi.org/project/simpleeval/>`_ (never ``eval``),
over the state alone, with a handful of pure functions. Same state, same value, so
replay reproduces every route. simpleeval was chosen over CEL because its syntax is
Python's (what a graph author writes in a script node anyway), dotted access into
mappings is built in, and its input is a Python AST, which :func:`paths` walks to
check the state keys an expression reads at ``validate``.

Every expression is parsed at ``validate`` (:func:`parse`): a syntax error is
reported with the YAML line before anything runs.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

import simpleeval  # type: ignore[import-untyped]

from graphrun.actors.base import parse_python
from graphrun.runtime.errors import GraphrunError

#: The functions an expression may call: pure, total, bounded by simpleeval's limits.
FUNCTIONS: dict[str, Any] = {
    "len": len,
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "lower": lambda s: str(s).lower(),
    "upper": lambda s: str(s).upper(),
    "contains": lambda container, item: item in container,
}
#: Names that are literals, not state keys.
_CONSTANTS = {"True": True, "False": False, "None": None, "true": True, "false": False}


class ExpressionError(GraphrunError):
    """An expression that does not parse, or fails on the state it reads."""


def parse(text: str) -> ast.Expression:
    """The expression's syntax tree; :class:`ExpressionError` when it does not parse
    or uses what the evaluator refuses (assignments, lambdas, comprehensions)."""
    if not isinstance(text, str) or not text.strip():
        raise ExpressionError("an expression must be a non-empty string")
    try:
        tree = parse_python(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"expression {text!r} does not parse: {exc.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Lambda | ast.NamedExpr | ast.comprehension | ast.Await):
            raise ExpressionError(f"expression {text!r}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS
        ):
            allowed = ", ".join(sorted(FUNCTIONS))
            raise ExpressionError(f"expression {text!r}: only these functions exist: {allowed}")
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            raise ExpressionError(f"expression {text!r}: '{node.attr}' cannot be read")
    return tree


def paths(tree: ast.Expression) -> list[str]:
    """The state paths an expression reads (``ticket.priority``), in order."""
    found: list[str] = []

    def dotted(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            continue
        if isinstance(node, ast.Attribute | ast.Name):
            path = dotted(node)
            if path is None or path.split(".")[0] in _CONSTANTS or path in FUNCTIONS:
                continue
            if not any(p == path or p.startswith(path + ".") for p in found):
                found = [p for p in found if not path.startswith(p + ".")]
                found.append(path)
    return found


def evaluate(text: str, state: Mapping[str, Any]) -> Any:
    """The value of ``text`` over ``state`` (pure: no clock, no I/O, no randomness)."""
    tree = parse(text)
    evaluator = simpleeval.EvalWithCompoundTypes(
        names={**_CONSTANTS, **state}, functions=dict(FUNCTIONS)
    )
    try:
        return evaluator.eval(text.strip(), previously_parsed=tree.body)
    except simpleeval.NameNotDefined as exc:
        raise ExpressionError(
            f"expression {text!r} reads '{exc.name}', which is not in the state"
        ) from None
    except (simpleeval.InvalidExpression, ArithmeticError, LookupError, TypeError) as exc:
        raise ExpressionError(f"expression {text!r} failed: {exc}") from None
    except ValueError as exc:
        raise ExpressionError(f"expression {text!r} failed: {exc}") from None


def writable_keys(graph: Any) -> set[str]:
    """The state keys a graph can write: its initial state, every node's
    ``state_updates``, structured outputs, and the keys every run has."""
    keys = {"initial_prompt", "output", "_error"} | set(graph.initial_state)
    for node in graph.nodes.values():
        keys |= set(node.state_updates)
        schema = getattr(node, "output_schema", None)
        if isinstance(schema, dict):
            keys |= set(schema.get("properties") or {})
        collect = getattr(node, "collect_into", None)
        if isinstance(collect, str):
            keys.add(collect)
    return keys


__all__ = ["FUNCTIONS", "ExpressionError", "evaluate", "parse", "paths", "writable_keys"]
