"""What a validation rule looks at (:class:`Check`), and where rules register.

The validator (:mod:`graphrun.runtime.graph.validate`) runs its own rules and those
the rule modules beside it register here (:func:`register_rule`, :func:`advice`);
a node kind's own rules (``NodeBase.rules``, in its module under ``runtime/nodes/``)
get a :class:`Check` and build their findings with :meth:`Check.diag` and
:func:`node_path`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphrun.runtime.graph.loader import Diagnostic, LoadedGraph, _child
from graphrun.runtime.graph.model import NodeBase


@dataclass
class Check:
    """What the rules look at."""

    loaded: LoadedGraph
    agents_dir: Path | None = None
    config_dir: Path | None = None
    # Optional, expensive checks (tool discovery, model config) can be switched off.
    deep: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def graph(self) -> Any:
        return self.loaded.graph

    def nodes(self) -> Iterator[tuple[str, NodeBase]]:
        yield from self.loaded.graph.nodes.items()

    def diag(
        self,
        severity: str,
        rule: str,
        message: str,
        path: str,
        *,
        node: str | None = None,
        hint: str | None = None,
    ) -> Diagnostic:
        return Diagnostic(
            severity, rule, message, self.loaded.file, self.loaded.line(path), path, node, hint
        )


def node_path(node_id: str, *fields: str) -> str:
    """The JSON path of a node's field (``routes[0]``: a field, then list indices)."""
    path = _child("$.nodes", node_id)
    for f in fields:
        name, _, rest = f.partition("[")
        path = _child(path, name)
        for index in rest.rstrip("]").split("][") if rest else ():
            path = _child(path, int(index)) if index.isdigit() else _child(path, index)
    return path


def did_you_mean(name: str, choices: list[str]) -> str | None:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else None


Rule = Callable[[Check], list[Diagnostic]]

#: Rules of the modules beside the validator (tools, models, parallel branches, state
#: keys), in the order they registered.
RULES: list[Rule] = []
#: Advice only ``graphrun validate`` gives (a run does not repeat it every time).
ADVICE: list[Rule] = []


def register_rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


def advice(fn: Rule) -> Rule:
    ADVICE.append(fn)
    return fn


__all__ = ["ADVICE", "RULES", "Check", "Rule", "advice", "did_you_mean", "node_path"]
