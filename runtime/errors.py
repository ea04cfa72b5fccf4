"""graphrun's error tree (store errors live in ``eventstore/errors.py``).

::

    GraphrunError                      exit 2 unless noted
    ├── StoreError                     (eventstore) corrupt db, unknown run, lease held, …
    ├── GraphError                     graph.yaml cannot be loaded or is invalid
    │   ├── GraphLoadError             missing file, malformed YAML, wrong shape
    │   └── GraphValidationError       semantic rules of the spec (carries diagnostics)
    ├── TemplateError                  a strict template names a missing key
    ├── UsageError                     bad flags or arguments
    ├── RunError (exit 1)              the run itself failed
    │   └── WaitingForHuman (exit 3)   non-interactive and no answer supplied
    │       └── ChildWaiting           a child run waits for a person (so its parent does)
    ├── AnswerError                    answering a run that waits for nothing, refused approver
    ├── ReplayDivergence (exit 1)      replay decided differently than the log
    └── (actors add ToolError, LlmConfigError, RagError, …)

:func:`node_context` attaches the node id to errors raised inside it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from graphrun.eventstore.errors import GraphrunError


class GraphError(GraphrunError):
    """The graph cannot be used."""


class GraphLoadError(GraphError):
    """graph.yaml is missing, malformed, or has the wrong shape."""


class GraphValidationError(GraphError):
    """The graph breaks one or more rules; ``diagnostics`` lists them all."""

    def __init__(self, diagnostics: list[Any], *, path: str = "graph.yaml") -> None:
        self.diagnostics = diagnostics
        errors = [d for d in diagnostics if d.severity == "error"]
        first = errors[0] if errors else diagnostics[0]
        more = f" (+{len(errors) - 1} more errors)" if len(errors) > 1 else ""
        super().__init__(f"{first.format()}{more}")


class TemplateError(GraphrunError):
    """A template could not be rendered."""


class UsageError(GraphrunError):
    """Bad command-line usage."""


class RunError(GraphrunError):
    """The run failed."""

    exit_code = 1


class WaitingForHuman(GraphrunError):
    """The run waits for a person and none can be asked here."""

    exit_code = 3


class ChildWaiting(WaitingForHuman):
    """A child run waits for a person; the parent waits with it."""

    def __init__(self, message: str, request: Any) -> None:
        super().__init__(message)
        self.request = request


class AnswerError(GraphrunError):
    """An answer cannot be recorded (nothing waits, wrong node, not an approver, …)."""


class ReplayDivergence(GraphrunError):
    """Replay reached a different decision than the recorded one."""

    exit_code = 1


@contextmanager
def node_context(node_id: str) -> Iterator[None]:
    """Attach ``node '<id>'`` to a GraphrunError raised inside, unless it has a place."""
    try:
        yield
    except GraphrunError as exc:
        if exc.where is None:
            exc.where = f"node '{node_id}'"
        raise


__all__ = [
    "AnswerError",
    "ChildWaiting",
    "GraphError",
    "GraphLoadError",
    "GraphValidationError",
    "GraphrunError",
    "ReplayDivergence",
    "RunError",
    "TemplateError",
    "UsageError",
    "WaitingForHuman",
    "node_context",
]
