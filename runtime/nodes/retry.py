"""``retry:`` on effectful nodes: a failed effect is tried again, as a recorded fact.

When a node's effect comes back failed and its policy allows another attempt, the
decider records :class:`~graphrun.eventstore.events.NodeRetrying` (the attempt, its
error, the delay) instead of routing the failure; the next decision asks for the
effect again, and the driver starts it once the delay has passed since that event
(waiting in slices, so a run stays cancellable; a replay does not wait; a run
resumed after a crash waits only what is left). The delay is a pure function of the
policy, the attempt and the run, node and visit (jitter included), so deciding again
gives the same event.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from graphrun.eventstore.events import ChildRunFinished, NodeRetrying
from graphrun.eventstore.fold import RunState
from graphrun.runtime.graph.model import RetryPolicy
from graphrun.runtime.nodes.error_kinds import kind_of_result
from graphrun.runtime.nodes.plan import Append

#: What ``retry:`` is accepted on (the kinds with an effect that can fail).
RETRYABLE = ("llm", "script", "agent", "rag", "tool")


def delay_for(policy: RetryPolicy, attempt: int, seed: str) -> float:
    """Seconds to wait after failed attempt ``attempt`` (from 1)."""
    if policy.backoff == "fixed":
        base = policy.initial
    else:
        base = policy.initial * (2 ** (attempt - 1))
    base = max(0.0, min(base, policy.max))
    if policy.jitter and base > 0:
        digest = hashlib.sha256(seed.encode()).digest()
        unit = int.from_bytes(digest[:8], "big") / 2**64
        base = base / 2 + unit * base / 2  # "equal jitter": between half and all of it
    return round(base, 3)


def since_last_retry(effects: tuple[Any, ...]) -> tuple[Any, ...]:
    """A visit's effect events of its current attempt (after its last retry)."""
    for i in range(len(effects) - 1, -1, -1):
        if isinstance(effects[i], NodeRetrying):
            return effects[i + 1 :]
    return effects


def pending_retry(effects: tuple[Any, ...]) -> NodeRetrying | None:
    """The retry a visit is waiting out: its last effect event is a ``NodeRetrying``."""
    if effects and isinstance(effects[-1], NodeRetrying):
        return effects[-1]
    return None


def _error_of(done: Any) -> str | None:
    if isinstance(done, ChildRunFinished):
        return None if done.status == "completed" else (done.error or done.status)
    error = getattr(done, "error", None)
    return str(error) if error else None


def retry_step(node: Any, node_id: str, state: RunState, done: Any) -> Append | None:
    """``NodeRetrying`` when the visit's result ``done`` failed and the node's policy
    allows another attempt; None to go on (complete, route or fail the failure)."""
    policy: RetryPolicy | None = getattr(node, "retry", None)
    if policy is None:
        return None
    error = _error_of(done)
    if error is None:
        return None
    attempt = 1 + sum(1 for e in state.effects if isinstance(e, NodeRetrying))
    if attempt >= policy.max_attempts:
        return None
    kind = kind_of_result(done, state.effects)
    text = f"{kind}: {error}" if kind else error
    if policy.on and not any(re.search(pattern, text) for pattern in policy.on):
        return None
    visit = state.current_visit
    delay = delay_for(policy, attempt, f"{state.run_id}:{node_id}:{visit}:{attempt}")
    return Append(
        (NodeRetrying(node_id=node_id, visit=visit, attempt=attempt, error=error, delay=delay),)
    )


__all__ = [
    "RETRYABLE",
    "delay_for",
    "pending_retry",
    "retry_step",
    "since_last_retry",
]
