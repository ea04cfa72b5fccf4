"""Which actor performs each node type's effect, and how it is configured for a run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graphrun.runtime.errors import WaitingForHuman

if TYPE_CHECKING:
    from graphrun.runtime.engine.ports import RunPorts


def _waiting(task: Any) -> BaseException:
    return WaitingForHuman(f"run waits for an answer at node '{task.node_id}'")


def actor_class(node_type: str, ports: RunPorts) -> tuple[type, tuple[Any, ...]]:
    """``(actor class, constructor args)`` for a node type in the run of ``ports``."""
    options = ports.options
    if node_type == "script":
        from graphrun.actors.script import ScriptActor

        return ScriptActor, (ports.scratch(),)
    if node_type in ("approval", "input"):
        from graphrun.actors.human.actor import HumanActor

        return HumanActor, (options.answers, options.as_user, options.interactive, _waiting)
    factory = options.extra.get(node_type)
    if factory is not None:
        return factory(ports)
    from graphrun.runtime.nodes import node_actor

    return node_actor(node_type, ports)


__all__ = ["actor_class"]
