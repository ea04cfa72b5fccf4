"""Who may answer a node, and how: read from the graph that governs the run.

The governing graph is the run's recorded source (``RunStarted.graph_source``,
covered by the hash chain) and, when the agent is on disk, its ``graph.yaml``
there: where the two disagree about a node's policy the answer is refused, so
neither an edited log nor an edited file alone widens who may answer. Data in the
same record as the answer (``HumanInputRequested.approvers``) is never used.
Identities are compared exactly (no trimming, no case folding).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphrun.eventstore.errors import GraphrunError
from graphrun.eventstore.events import Event, RunStarted

__all__ = [
    "CancelRefused",
    "Policy",
    "PolicyError",
    "check_canceller",
    "governing_policy",
    "graph_approvers",
    "policy_of",
]


class PolicyError(GraphrunError):
    """The run's recorded graph and the graph on disk disagree, or neither can be read."""


@dataclass(frozen=True)
class Policy:
    """How a node may be answered.

    Attributes:
        node_id: The node.
        approvers: Who may answer (empty: anyone).
        signed: Answers must carry a verified signature.
        required: How many distinct signers must give the same answer.
    """

    node_id: str
    approvers: tuple[str, ...] = ()
    signed: bool = False
    required: int = 1

    def allows(self, principal: str) -> bool:
        return not self.approvers or principal in self.approvers

    def describe(self) -> str:
        parts = [f"approvers: {', '.join(self.approvers)}" if self.approvers else "anyone"]
        if self.required > 1:
            parts.append(f"{self.required} distinct signers")
        elif self.signed:
            parts.append("signed")
        return "; ".join(parts)


def policy_of(graph: Any, node_id: str) -> Policy:
    """The policy of ``node_id`` in a parsed ``Graph`` (anyone, unsigned, when the node
    has none or is not a human node)."""
    node = graph.nodes.get(node_id)
    if node is None:
        return Policy(node_id)
    approvals = getattr(node, "approvals", None)
    approvers = tuple(getattr(node, "approvers", None) or ())
    if approvals is not None and not approvers:
        approvers = tuple(approvals.of)
    own = getattr(node, "signed_decisions", None)
    signed = (own or graph.settings.signed_decisions) == "required" or approvals is not None
    required = approvals.required if approvals is not None else 1
    return Policy(node_id, approvers, signed, required)


def graph_approvers(graph: Any) -> tuple[str, ...]:
    """Everyone any human node of ``graph`` names (``cancel_by: approvers``)."""
    out: dict[str, None] = {}
    for node_id in graph.nodes:
        for name in policy_of(graph, node_id).approvers:
            out[name] = None
    return tuple(out)


def recorded_graph(events: Sequence[Event]) -> Any:
    """The ``Graph`` a run was started with, from its ``RunStarted``."""
    from graphrun.runtime.graph.loader import load_text

    first = events[0] if events else None
    if not isinstance(first, RunStarted):
        raise PolicyError("the run does not start with RunStarted: its graph is unknown")
    path = Path(first.graph_path or "graph.yaml")
    agent_dir = Path(first.agent_dir) if first.agent_dir else None
    return load_text(first.graph_source, path=path, agent_dir=agent_dir).graph


def disk_graph(events: Sequence[Event], *, base: Path | None = None) -> tuple[Any, str] | None:
    """The graph.yaml the run's ``RunStarted`` points at, when it is on disk here (and
    where), else None. Relative paths (an export's) are taken from ``base``."""
    from graphrun.runtime.graph.loader import load_graph

    first = events[0] if events else None
    if not isinstance(first, RunStarted):
        return None
    for raw in (first.graph_path, first.agent_dir):
        if not raw:
            continue
        path = Path(raw)
        if not path.is_absolute():
            if base is None:
                continue
            path = base / path
        if path.is_dir():
            path = path / "graph.yaml"
        if path.name == "config.yaml":
            # An LLM-loop agent: its graph is made from config.yaml, which names no
            # approvers, so the recorded graph's policy is the one on disk too.
            return None
        if path.is_file():
            try:
                return load_graph(path).graph, os.fspath(path)
            except GraphrunError as exc:
                raise PolicyError(
                    f"the run's graph on disk ({path}) cannot be loaded to check who may "
                    f"answer: {exc}"
                ) from None
    return None


def governing_policy(
    events: Sequence[Event], node_id: str, *, disk: bool = True, base: Path | None = None
) -> Policy:
    """The policy of ``node_id`` in the graph that governs the run.

    Args:
        events: The run's log (its ``RunStarted`` first).
        node_id: The human node.
        disk: Also read the agent's graph.yaml on disk, when it is there, and refuse
            when its policy for the node differs from the recorded graph's.
        base: The folder relative paths of ``RunStarted`` are relative to (an export's).

    Raises:
        PolicyError: The two graphs disagree, or one cannot be read.
    """
    recorded = policy_of(recorded_graph(events), node_id)
    if not disk:
        return recorded
    found = disk_graph(events, base=base)
    if found is None:
        return recorded
    graph, where = found
    on_disk = policy_of(graph, node_id)
    if on_disk != recorded:
        raise PolicyError(
            f"who may answer node '{node_id}' differs between the run's recorded graph "
            f"({recorded.describe()}) and {where} ({on_disk.describe()}); nothing was recorded",
            hint="restore the graph.yaml the run was started with (its source is in the log)",
        )
    return recorded


def check_canceller(events: Sequence[Event], who: str, *, disk: bool = True) -> None:
    """Refuse ``who`` unless the governing graph lets anyone cancel the run, or names
    them among its approvers (``settings.cancel_by: approvers``); compared exactly.

    Raises:
        PolicyError: The recorded graph and the graph on disk disagree.
        CancelRefused: ``who`` may not cancel the run.
    """
    try:
        graph = recorded_graph(events)
    except GraphrunError:
        return  # a run whose graph cannot be read can never go on: anyone may end it
    rule = (graph.settings.cancel_by, graph_approvers(graph))
    found = disk_graph(events) if disk else None
    if found is not None:
        other, where = found
        if (other.settings.cancel_by, graph_approvers(other)) != rule:
            raise PolicyError(
                f"who may cancel differs between the run's recorded graph and {where}; "
                "nothing was recorded",
                hint="restore the graph the run was started with",
            )
    cancel_by, approvers = rule
    if cancel_by == "approvers" and who not in approvers:
        raise CancelRefused(
            f"{who!r} may not cancel run {events[0].run_id}: its graph lets only its "
            f"approvers cancel it ({', '.join(approvers) or 'none are named'})",
            hint="pass --as NAME with one of them",
        )


class CancelRefused(GraphrunError):
    """Someone the graph does not allow tried to cancel a run."""
