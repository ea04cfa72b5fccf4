"""Actors for the node types whose effects need configuration from the run (llm, rag, agent)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graphrun.runtime.errors import GraphrunError

if TYPE_CHECKING:
    from graphrun.runtime.supervisor import Driver


def node_actor(node_type: str, driver: Driver) -> tuple[type, tuple[Any, ...]]:
    raise GraphrunError(f"node type '{node_type}' cannot run in this build of graphrun")
