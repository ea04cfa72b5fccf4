"""Which actor performs each node type's effect, and how it is configured for a run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphrun.runtime.nodes.ports import RunPorts


def actor_class(node_type: str, ports: RunPorts) -> tuple[type, tuple[Any, ...]]:
    """``(actor class, constructor args)`` for a node type in the run of ``ports``:
    the node kind's (the registry in ``runtime/nodes``), unless the run's options
    give another factory for the type (``RunOptions.extra``)."""
    factory = ports.options.extra.get(node_type)
    if factory is not None:
        return factory(ports)
    from graphrun.runtime.nodes import node_actor

    return node_actor(node_type, ports)


__all__ = ["actor_class"]
