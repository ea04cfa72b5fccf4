"""What the decider returns (its plan for the next step), and the helpers every
node kind builds its decisions with.

* :class:`Append` — decision events to record (then decide again);
* :class:`Perform` — an effect to run for the current node (its outcome comes
  back as effect events);
* :class:`PerformMany` — a super-step's (or a map's) effects, run concurrently;
* :class:`Finished` — the run is over.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import msgspec

from graphrun.eventstore.events import Event, NodeCompleted, NodeFailed, RunFailed
from graphrun.runtime.graph.model import next_targets

#: The state key that holds the last tolerated failure (script/llm routed on).
ERROR_KEY = "_error"


# The plan's types are frozen structs, not dataclasses: a map of 10,000 items makes
# one Perform per item as it starts and one Append per item as it collects, and a
# struct is made several times faster.


class Append(msgspec.Struct, frozen=True):
    events: tuple[Event, ...]


class Perform(msgspec.Struct, frozen=True):
    """An effect to perform: the node's rendered task, for one branch (or map item).

    ``group`` names the concurrency limit it counts against (empty: the super-step's
    ``settings.max_concurrency``; a map node's id: that map's own cap, ``cap``)."""

    node_id: str
    node_type: str
    task: Any
    branch: str = ""
    group: str = ""
    cap: int = 0

    @property
    def visit(self) -> int:
        return int(getattr(self.task, "visit", 0))


def task_fields(task: Any) -> dict[str, Any]:
    """An effect's task as a dict of its fields (a struct's or a dataclass's; ``{}``
    for anything else): what a cache key hashes and a replay compares."""
    if isinstance(task, msgspec.Struct):
        return msgspec.structs.asdict(task)
    if dataclasses.is_dataclass(task) and not isinstance(task, type):
        return dataclasses.asdict(task)
    return {}


class PerformMany(msgspec.Struct, frozen=True):
    """The effects of a super-step (or a map's items) still to perform; they run
    concurrently, each under its branch id. ``join``: the super-step's join policy
    (``{type, count, timeout}``; empty: every branch)."""

    tasks: tuple[Perform, ...]
    join: Mapping[str, Any] | None = None


class Finished(msgspec.Struct, frozen=True):
    status: str


Step = Append | Perform | PerformMany | Finished


def fail(node_id: str, visit: int, error: str, kind: str = "") -> Append:
    """The node failed and so did the run (``kind``: the failure's kind)."""
    return Append(
        (
            NodeFailed(node_id=node_id, visit=visit, error=error, error_kind=kind),
            RunFailed(error=f"node '{node_id}': {error}", node_id=node_id),
        )
    )


def completed(
    node_id: str, visit: int, target: str | list[str] | None, **fields: Any
) -> NodeCompleted:
    """A completion routed to ``target``: one node, a fan-out list, or none (``[]``)."""
    targets = next_targets(target)
    if len(targets) > 1:
        return NodeCompleted(
            node_id=node_id, visit=visit, routed_to=None, fan_out=list(targets), **fields
        )
    return NodeCompleted(
        node_id=node_id, visit=visit, routed_to=targets[0] if targets else None, **fields
    )


def tolerated(
    node_id: str,
    visit: int,
    node: Any,
    state: dict[str, Any],
    target: str,
    message: str,
    kind: str = "",
) -> Append:
    """A failure routed to ``target`` (``on_error``, ``fallback``): the error is in the
    state as ``_error``, and ``state_updates`` see it (``{{output}}`` is the message)."""
    from graphrun.runtime.graph.templates import render_updates

    failure = {ERROR_KEY: {"node": node_id, "message": message}}
    updates = {
        **failure,
        **render_updates(node.state_updates, {**state, **failure}, {"output": message}),
    }
    return Append(
        (
            completed(
                node_id, visit, target, updates=updates, failed=True, error=message, error_kind=kind
            ),
        )
    )


def state_json(state: dict[str, Any]) -> str:
    """The canonical JSON a script receives (sorted keys: same state, same bytes)."""
    return json.dumps(state, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def last(effects: tuple[Any, ...], kind: type) -> Any:
    """The latest effect event of ``kind`` among a visit's effects, or None."""
    for event in reversed(effects):
        if isinstance(event, kind):
            return event
    return None


__all__ = [
    "ERROR_KEY",
    "Append",
    "Finished",
    "Perform",
    "PerformMany",
    "Step",
    "completed",
    "fail",
    "last",
    "state_json",
    "tolerated",
]
