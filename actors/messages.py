"""What the driver hands an effect: one task per node visit.

The decider builds a task (everything already rendered); the effect, awaited on
the run's event loop, performs it and records its outcome through the context.
Nothing else crosses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ScriptTask:
    node_id: str
    visit: int
    script: str  # as written in graph.yaml, relative to the agent directory
    timeout: float
    state_json: str  # the state the script receives (GRAPH_STATE / GRAPH_STATE_FILE)


@dataclass(frozen=True)
class HumanTask:
    node_id: str
    visit: int
    kind: str  # "input" or "approval"
    question: str
    options: tuple[str, ...] = ()
    default: str | None = None
    approvers: tuple[str, ...] = ()
    #: The graph requires a signed answer here: only ``graphrun approve/answer
    #: --sign`` can give it, never a flag or a terminal prompt.
    signed: bool = False


@dataclass(frozen=True)
class AgentTask:
    node_id: str
    visit: int
    agent: str
    prompt: str
    timeout: float
    output_schema: dict[str, Any] | None = None


@dataclass(frozen=True)
class RagTask:
    node_id: str
    visit: int
    query: str
    top_k: int | None
    timeout: float
    config: dict[str, Any] = field(default_factory=dict)
