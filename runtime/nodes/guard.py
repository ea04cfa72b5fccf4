"""``guard:`` on llm, tool and agent nodes: conditions the decider checks.

Each side is an expression, or a JSON Schema (a mapping; draft 2020-12, checked with
`jsonschema <https://pypi.org/project/jsonschema/>`_):

* ``input`` is checked before the node's effect is asked for: an expression over the
  state, or a schema the state (the whole of it, as the node's templates read it)
  must be valid against. When it does not hold, the effect is never performed.
* ``output`` is checked after it: an expression over the state the node would leave
  (its updates applied) with ``output`` bound to the node's result, or a schema the
  result itself (the tool's output, the reply's text or structured value, the child
  run's output) must be valid against. When it does not hold, the completion is
  replaced.

Either way the node routes to ``on_fail`` with ``_error`` set (or fails the run
without ``on_fail``); the failure's kind is ``GuardFailed``. Expressions are the same
pure evaluator as routes (:mod:`graphrun.runtime.graph.expressions`) and schema
validation is a pure function of the schema and the value, so replay reproduces
every guard's outcome.
"""

from __future__ import annotations

from typing import Any

from graphrun.eventstore.events import NodeCompleted
from graphrun.eventstore.fold import RunState
from graphrun.runtime.graph.expressions import ExpressionError, evaluate
from graphrun.runtime.nodes.plan import Append, Step, fail, tolerated

KIND = "GuardFailed"


def _blocked(node: Any, node_id: str, state: RunState, message: str) -> Append:
    target = node.guard.on_fail
    visit = state.current_visit
    if target:
        return tolerated(node_id, visit, node, state.state, target, message, KIND)
    return fail(node_id, visit, message, KIND)


def schema_problem(schema: dict[str, Any], value: Any) -> str | None:
    """The first way ``value`` breaks ``schema`` (its path and message), or None."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    first = errors[0]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first.absolute_path)
    return f"{where.lstrip('.') or 'the value'}: {first.message}"


def _check(
    side: str, condition: str | dict[str, Any], view: dict[str, Any], value: Any
) -> str | None:
    """Why the guard's ``side`` does not hold (None: it holds). Raises ExpressionError."""
    if isinstance(condition, dict):
        problem = schema_problem(condition, value)
        return None if problem is None else f"{side} guard failed: schema: {problem}"
    held = bool(evaluate(condition, view))
    return None if held else f"{side} guard failed: {condition}"


def input_blocked(node: Any, node_id: str, state: RunState) -> Append | None:
    """The decisions when the input guard does not hold (None when it does)."""
    guard = getattr(node, "guard", None)
    if guard is None or not guard.input:
        return None
    try:
        problem = _check("input", guard.input, state.state, state.state)
    except ExpressionError as exc:
        return fail(node_id, state.current_visit, f"input guard: {exc}", "ExpressionError")
    return None if problem is None else _blocked(node, node_id, state, problem)


def output_checked(node: Any, node_id: str, state: RunState, step: Step, primary: Any) -> Step:
    """``step`` when the output guard holds over what the node completed with, else
    the guard's route."""
    guard = getattr(node, "guard", None)
    if guard is None or not guard.output or not isinstance(step, Append):
        return step
    done = next((e for e in step.events if isinstance(e, NodeCompleted)), None)
    if done is None or done.failed:
        return step
    view = {**state.state, **done.updates}
    result = primary(node, state.effects, done) if primary is not None else None
    if primary is not None:
        view["output"] = result
    try:
        problem = _check("output", guard.output, view, result)
    except ExpressionError as exc:
        return fail(node_id, state.current_visit, f"output guard: {exc}", "ExpressionError")
    return step if problem is None else _blocked(node, node_id, state, problem)


__all__ = ["input_blocked", "output_checked", "schema_problem"]
