"""A node kind: everything the engine needs to know about one ``type:`` of node.

Each kind lives in ``runtime/nodes/<kind>.py`` and is listed in the registry
(``runtime/nodes/__init__.py``): its graph.yaml Struct, the effect event that ends
a visit's effect, how a visit asks for its effect (``request``), how it decides
once the effect is in (``complete``), what it yields as a map branch's primary
result (decision D3), and which actor performs its effect. The decider dispatches
through the registry; it holds no per-kind code but the control-flow nodes
(``map``, fan-out).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphrun.eventstore.events import Event
    from graphrun.eventstore.fold import RunState
    from graphrun.runtime.graph.model import Graph, NodeBase
    from graphrun.runtime.nodes.plan import Step
    from graphrun.runtime.nodes.ports import RunPorts

#: ``request(graph, node, node_id, state) -> Step``: the visit's effect to perform
#: (a ``Perform``), or decisions to record first (an ``Append``).
Request = Callable[["Graph", Any, str, "RunState"], "Step"]
#: ``complete(graph, node, node_id, state, result) -> Step``: the decisions once the
#: effect's result (the ``result`` event; None for a kind without effect) is in.
Complete = Callable[["Graph", Any, str, "RunState", Any], "Step"]
#: ``primary(node, effects, completion) -> value``: a map item's result when the
#: branch did not write ``output_key`` itself.
Primary = Callable[[Any, "tuple[Event, ...]", Any], Any]
#: ``effect(ports) -> (actor class, constructor args)``: who performs the effect.
Effect = Callable[["RunPorts"], "tuple[type, tuple[Any, ...]]"]


@dataclass(frozen=True)
class NodeKind:
    type: str
    struct: builtins.type[NodeBase]  # builtins: the field `type` shadows it here
    complete: Complete
    result: builtins.type[Event] | None = None  # the effect event that ends a visit's effect
    request: Request | None = None
    primary: Primary | None = None
    effect: Effect | None = None
    # Waits for a person (never a fan-out target, never a map branch).
    human: bool = False


__all__ = ["NodeKind"]
