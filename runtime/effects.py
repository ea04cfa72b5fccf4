"""Which actor performs each node type's effect, and how it is configured for a run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graphrun.runtime.errors import WaitingForHuman

if TYPE_CHECKING:
    from graphrun.runtime.supervisor import Driver


def _waiting(task: Any) -> BaseException:
    return WaitingForHuman(f"run waits for an answer at node '{task.node_id}'")


def actor_class(node_type: str, driver: Driver) -> tuple[type, tuple[Any, ...]]:
    """``(actor class, constructor args)`` for a node type in this driver's run."""
    options = driver.options
    if node_type == "script":
        from graphrun.actors.script import ScriptActor

        return ScriptActor, (driver.tmp_dir,)
    if node_type in ("approval", "input"):
        from graphrun.actors.human_actor import HumanActor

        return HumanActor, (options.answers, options.as_user, options.interactive, _waiting)
    factory = options.extra.get(node_type)
    if factory is not None:
        return factory(driver)  # type: ignore[no-any-return]
    from graphrun.runtime.nodes import node_actor

    return node_actor(node_type, driver)


__all__ = ["actor_class"]
