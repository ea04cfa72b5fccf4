"""``guard:`` on llm, tool and agent nodes: conditions the decider checks.

``input`` is evaluated over the state before the node's effect is asked for; when it
does not hold, the effect is never performed. ``output`` is evaluated after it, over
the state the node would leave (its updates applied) with ``output`` bound to the
node's result; when it does not hold, the completion is replaced. Either way the node
routes to ``on_fail`` with ``_error`` set (or fails the run without ``on_fail``).
Expressions are the same pure evaluator as routes (:mod:`graphrun.runtime.graph.
expressions`), so replay reproduces every guard's outcome.
"""

from __future__ import annotations

from typing import Any

from graphrun.eventstore.events import NodeCompleted
from graphrun.eventstore.fold import RunState
from graphrun.runtime.graph.expressions import ExpressionError, evaluate
from graphrun.runtime.nodes.plan import Append, Step, fail, tolerated


def _blocked(node: Any, node_id: str, state: RunState, message: str) -> Append:
    target = node.guard.on_fail
    visit = state.current_visit
    if target:
        return tolerated(node_id, visit, node, state.state, target, message)
    return fail(node_id, visit, message)


def input_blocked(node: Any, node_id: str, state: RunState) -> Append | None:
    """The decisions when the input guard does not hold (None when it does)."""
    guard = getattr(node, "guard", None)
    if guard is None or not guard.input:
        return None
    try:
        held = bool(evaluate(guard.input, state.state))
    except ExpressionError as exc:
        return fail(node_id, state.current_visit, f"input guard: {exc}")
    return None if held else _blocked(node, node_id, state, f"input guard failed: {guard.input}")


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
    if primary is not None:
        view["output"] = primary(node, state.effects, done)
    try:
        held = bool(evaluate(guard.output, view))
    except ExpressionError as exc:
        return fail(node_id, state.current_visit, f"output guard: {exc}")
    return step if held else _blocked(node, node_id, state, f"output guard failed: {guard.output}")


__all__ = ["input_blocked", "output_checked"]
