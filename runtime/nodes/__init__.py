"""Node kinds: one module per ``type:`` of node, and this registry of them.

Each ``runtime/nodes/<kind>.py`` holds everything about its kind: its graph.yaml
Struct, with what the validator, the schema and the pictures ask of a kind (its
descriptions, rules, the state keys it reads and writes, its edges: the ClassVars
and hooks of :class:`~graphrun.runtime.graph.model.NodeBase`), and what the engine
needs (a :class:`~graphrun.runtime.nodes.kind.NodeKind`): how a visit asks for its
effect, how it decides once the effect is in, its result as a map branch, and the
actor that performs its effect (llm, rag and agent effects need the run's
configuration: their actors live next to their kind).

Adding a node kind is one module here (its Struct and a ``KIND``), plus its effect
under ``actors/`` where it has one: every module of this package that defines
``KIND`` (or ``KINDS``, or only a ``STRUCT`` for control flow the decider runs
itself, as ``map``) is found and registered when ``graphrun.runtime`` is imported,
its Struct included (the loader and the schema then know its ``type``).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

from graphrun.runtime.errors import GraphrunError
from graphrun.runtime.graph.model import register_node_type
from graphrun.runtime.nodes import agent, end, human, llm, rag, script
from graphrun.runtime.nodes import map as map_node
from graphrun.runtime.nodes.kind import NodeKind

if TYPE_CHECKING:
    from graphrun.runtime.nodes.ports import RunPorts

#: Every node kind with an effect or a completion of its own, by ``type``. ``map`` is
#: control flow (the decider runs its items as a super-step).
KINDS: dict[str, NodeKind] = {
    kind.type: kind
    for kind in (
        end.KIND,
        script.KIND,
        llm.KIND,
        human.APPROVAL,
        human.INPUT,
        agent.KIND,
        rag.KIND,
    )
}

#: Loki's node types, in the order errors and the schema list them; the kinds
#: :func:`_discover` finds follow, by module name.
for _struct in (
    agent.AgentNode,
    script.ScriptNode,
    human.ApprovalNode,
    human.InputNode,
    llm.LlmNode,
    rag.RagNode,
    end.EndNode,
    map_node.MapNode,
):
    register_node_type(_struct)


def _discover() -> None:
    """Every other module of this package that defines ``KIND`` or ``KINDS`` (or only
    a ``STRUCT``: a control-flow kind the decider runs itself)."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        found = getattr(module, "KINDS", None) or (getattr(module, "KIND", None),)
        for kind in found:
            if isinstance(kind, NodeKind) and kind.type not in KINDS:
                KINDS[kind.type] = kind
        struct = getattr(module, "STRUCT", None)
        if struct is not None:
            register_node_type(struct)
    for kind in KINDS.values():
        register_node_type(kind.struct)


_discover()


def kind_of(node_type: str) -> NodeKind:
    found = KINDS.get(node_type)
    if found is None:
        raise GraphrunError(f"unsupported node type '{node_type}'")
    return found


def node_actor(node_type: str, ports: RunPorts) -> tuple[type, tuple[Any, ...]]:
    """``(actor class, constructor args)`` performing ``node_type``'s effect."""
    kind = kind_of(node_type)
    if kind.effect is None:
        raise GraphrunError(f"node type '{node_type}' has no effect")
    return kind.effect(ports)


__all__ = ["KINDS", "NodeKind", "kind_of", "node_actor"]
