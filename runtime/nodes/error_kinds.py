"""What kind of failure a node's failure was: a name ``on_error`` and ``retry.on`` test.

A failure's kind is read from the facts its visit recorded (the effect's result and
the calls on the way), never from the world, so deciding again gives the same kind
and replay reproduces every route. It is recorded as ``error_kind`` on the
``NodeFailed`` (or the tolerated ``NodeCompleted``) of the failure.

``on_error`` entries match it two ways: ``kind: TimeoutError`` (exactly one of
:data:`ERROR_KINDS`), and ``match: PATTERN``, a regular expression searched in
``"<kind>: <message>"`` (so ``match: "TimeoutError"`` matches a timeout as well as
``match: "timed out"`` does).
"""

from __future__ import annotations

from typing import Any

from graphrun.eventstore.events import (
    ChildRunFinished,
    LlmCalled,
    LlmResult,
    RetrievalDone,
    ScriptFinished,
    ToolFinished,
)
from graphrun.runtime.graph.routing import ERROR_KINDS


def _timed_out(message: str | None) -> bool:
    text = (message or "").lower()
    return "timed out" in text or "timeout" in text


def kind_of_result(done: Any, effects: tuple[Any, ...] = ()) -> str:
    """The kind of the failure the effect result ``done`` records."""
    if isinstance(done, ScriptFinished):
        if done.timed_out:
            return "TimeoutError"
        if done.exit_code is None:
            return "Cancelled"
        return "ScriptExit" if done.exit_code != 0 else "ScriptOutput"
    if isinstance(done, LlmResult):
        if done.error is None:
            return "OutputSchemaError"
        if _timed_out(done.error):
            return "TimeoutError"
        if done.error.startswith("cancelled"):
            return "Cancelled"
        call = next((e for e in reversed(effects) if isinstance(e, LlmCalled) and e.error), None)
        if call is not None and call.status is not None and call.status >= 400:
            return "HTTPError"
        if call is not None and call.status is None:
            return "ConnectionError"
        return "LLMError"
    if isinstance(done, ToolFinished):
        return "TimeoutError" if _timed_out(done.error) else "ToolError"
    if isinstance(done, ChildRunFinished):
        if done.status == "completed":
            return "OutputSchemaError"
        if done.status == "cancelled":
            return "Cancelled"
        return "TimeoutError" if _timed_out(done.error) else "AgentFailed"
    if isinstance(done, RetrievalDone):
        return "TimeoutError" if _timed_out(done.error) else "RetrievalError"
    return ""


__all__ = ["ERROR_KINDS", "kind_of_result"]
