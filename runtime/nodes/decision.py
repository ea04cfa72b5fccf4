"""``decision`` nodes: route on an expression over the state, with no LLM and no script.

::

    pick:
      type: decision
      expr: "ticket.priority"            # optional: the value the routes compare with
      routes:
        - {when: "p0", to: page_oncall}  # with expr: equal to the value (as text)
        - {when: default, to: queue}     # always matches
    triage:
      type: decision
      routes:                            # without expr: each when is a condition
        - {when: "len(items) > 10 and not urgent", to: batch}
        - {when: default, to: single}

The first route that matches wins; no match and no ``default`` fails the node. There
is no effect: the decider evaluates the expression (pure, over the recorded state),
so replay reproduces the route. Everything about the kind is in this module.
"""

from __future__ import annotations

from typing import Any, ClassVar

from graphrun.eventstore.fold import RunState
from graphrun.runtime.graph.expressions import ExpressionError, evaluate
from graphrun.runtime.graph.model import Graph, NodeBase, Route
from graphrun.runtime.graph.routing import DEFAULT, check_expressions, expression_reads
from graphrun.runtime.graph.templates import render_updates
from graphrun.runtime.nodes.kind import NodeKind
from graphrun.runtime.nodes.plan import Append, Step, completed, fail


class DecisionNode(NodeBase, tag="decision", kw_only=True):
    routes: list[Route]
    expr: str | None = None

    DESCRIPTIONS: ClassVar[dict[str | None, str]] = {
        None: "Routes on an expression over the state, with no LLM and no script; the "
        "first route that matches wins.",
        "routes": "Conditional edges, in order: `{when, to}`. With `expr`, `when` is a "
        "value compared (as text) with the expression's value; without it, `when` is a "
        "condition. `when: default` always matches.",
        "expr": "An expression over the state (the paths templates use, e.g. "
        "`ticket.priority`); its value picks the route.",
    }
    MAP_BRANCH: ClassVar[bool] = False

    def route_edges(self) -> list[tuple[str, str, str]]:
        return [
            (f"routes[{i}].to", route.to, route.when if self.expr is None else f"= {route.when}")
            for i, route in enumerate(self.routes)
        ]

    def _expressions(self) -> list[tuple[str, str]]:
        """``(field path, expression)`` of every expression the node evaluates."""
        found = [("expr", self.expr)] if self.expr is not None else []
        if self.expr is None:
            found += [
                (f"routes[{i}].when", route.when)
                for i, route in enumerate(self.routes)
                if route.when != DEFAULT
            ]
        return found

    def reads(self) -> set[str]:
        return expression_reads(self._expressions())

    def rules(self, node_id: str, check: Any) -> list[Any]:
        out = []
        where = f"$.nodes.{node_id}"
        if not self.routes:
            out.append(
                check.diag(
                    "error", "decision-routes", f"decision node '{node_id}' has no routes", where
                )
            )
        if self.next is not None and self.if_ is None and self.unless is None:
            out.append(
                check.diag(
                    "warning",
                    "decision-next",
                    f"decision node '{node_id}': `next` is ignored (routes decide; it is "
                    "only where an `if`/`unless` skips to)",
                    f"{where}.next",
                    node=node_id,
                    hint="move the target into a route: {when: default, to: ...}",
                )
            )
        if self.routes and all(route.when != DEFAULT for route in self.routes):
            out.append(
                check.diag(
                    "warning",
                    "decision-default",
                    f"decision node '{node_id}' has no `when: default` route; the run fails "
                    "there when no route matches",
                    f"{where}.routes",
                    node=node_id,
                )
            )
        out += check_expressions(node_id, check, self._expressions())
        return out


def _matches(node: DecisionNode, route: Route, value: Any, state: dict[str, Any]) -> bool:
    if route.when == DEFAULT:
        return True
    if node.expr is not None:
        return _text(value) == route.when
    return bool(evaluate(route.when, state))


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def complete(graph: Graph, node: DecisionNode, node_id: str, state: RunState, _: Any) -> Step:
    s = state.state
    visit = state.current_visit
    try:
        value = evaluate(node.expr, s) if node.expr is not None else None
        chosen = next((r for r in node.routes if _matches(node, r, value, s)), None)
    except ExpressionError as exc:
        return fail(node_id, visit, str(exc), "ExpressionError")
    if chosen is None:
        seen = f" (the value was {_text(value)!r})" if node.expr is not None else ""
        return fail(node_id, visit, f"no route matched{seen} and there is no `when: default`")
    updates = render_updates(node.state_updates, s)
    return Append((completed(node_id, visit, chosen.to, updates=updates),))


KIND = NodeKind(type="decision", struct=DecisionNode, complete=complete)
