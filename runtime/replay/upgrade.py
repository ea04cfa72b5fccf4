"""Move runs in flight onto a new graph, checked (``graphrun upgrade``).

A run that waits, was interrupted or failed is *upgraded* when its recorded history,
replayed against the new graph, reproduces up to where the run stopped (its wait,
its interruption, the node that failed). Then one :class:`GraphUpgraded` event
records the old and new graph hashes and who upgraded it, and the run continues on
the new graph from there; a failed run enters the node that failed again. When the
history does not reproduce, the divergence is shown and nothing is written.

A log with upgrades replays against the graph it ends on (:func:`upgraded_view`):
each upgrade was checked to reproduce the history before it, and the events a
failed run's upgrade superseded (the failed visit and the run's failure) are left
out, as the new graph never made them.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from graphrun.eventstore.codec import content_hash
from graphrun.eventstore.events import (
    Event,
    GraphUpgraded,
    NodeEntered,
    NodeFailed,
    RunFailed,
)
from graphrun.eventstore.fold import fold
from graphrun.runtime.errors import UsageError
from graphrun.runtime.replay.view import upgraded_view

if TYPE_CHECKING:
    from graphrun.eventstore.store import Store
    from graphrun.runtime.engine.runs import LoadedRun
    from graphrun.runtime.graph.loader import LoadedGraph
    from graphrun.runtime.replay.divergence import ReplayResult

#: The statuses a run can be upgraded from.
UPGRADABLE = ("waiting", "interrupted", "failed")


@dataclass
class UpgradeCheck:
    """What upgrading one run onto a graph would do (or why it cannot)."""

    run_id: str
    status: str
    old_hash: str
    new_hash: str
    ok: bool = False
    why: str = ""  # why not (a divergence, an unsupported case)
    retry_node: str | None = None
    superseded: int = 0
    last_seq: int = 0
    replay: ReplayResult | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "run_id": self.run_id,
            "status": self.status,
            "old_graph": self.old_hash,
            "new_graph": self.new_hash,
            "ok": self.ok,
            "why": self.why or None,
            "retry_node": self.retry_node,
        }


def _failure_point(events: list[Event]) -> tuple[int, str | None]:
    """Where a failed run's failure begins (the seq the upgrade supersedes) and the
    node that failed (entered again), or raise when it cannot be retried."""
    failed = next((e for e in reversed(events) if isinstance(e, RunFailed)), None)
    assert failed is not None
    node_failed = next(
        (e for e in reversed(events) if isinstance(e, NodeFailed) and e.seq < failed.seq), None
    )
    if any(e.branch for e in events if e.seq >= failed.seq - 1 and hasattr(e, "branch")):
        raise UsageError(
            "it failed inside a parallel step, which upgrade cannot continue yet",
            hint="`graphrun replay RUN --graph DIR --live` re-runs it as a new run",
        )
    if node_failed is None or node_failed.branch or failed.seq - node_failed.seq > 1:
        return failed.seq, None
    entered = next(
        (
            e
            for e in reversed(events)
            if isinstance(e, NodeEntered)
            and e.node_id == node_failed.node_id
            and e.visit == node_failed.visit
            and not e.branch
        ),
        None,
    )
    return (entered.seq if entered else node_failed.seq), node_failed.node_id


def check_upgrade(
    store: Store, run_id: str, loaded: LoadedGraph, *, run: LoadedRun | None = None
) -> UpgradeCheck:
    """Replay ``run_id``'s history against ``loaded``: may it continue on it?
    ``run``: the run as the caller opened it (else its log is read here)."""
    from graphrun.runtime.replay.divergence import replay_events

    if run is not None and run.run_id == run_id:
        events, state = list(run.events), run.state
    else:
        events = store.read(run_id)
        state = fold(events)
    new_hash = content_hash(loaded.source)
    check = UpgradeCheck(run_id, state.status, state.graph_hash, new_hash)
    check.last_seq = events[-1].seq if events else 0
    if state.status not in UPGRADABLE:
        # a running run someone drives, a completed or cancelled one
        live = state.status == "running" and store.is_live(run_id)
        if state.status == "running" and not live:
            check.status = "interrupted"
        else:
            check.why = f"it is {state.status} (upgrade takes waiting, interrupted or failed runs)"
            return check
    if new_hash == state.graph_hash:
        check.why = "it already runs on this graph"
        return check
    history = upgraded_view(events)
    if state.status == "failed":
        try:
            superseded, retry = _failure_point(events)
        except UsageError as exc:
            check.why = str(exc)
            return check
        check.superseded, check.retry_node = superseded, retry
        history = [e for e in history if e.seq < superseded]
    result = replay_events(history, loaded)
    check.replay = result
    check.notes = list(result.notes)
    if not result.ok:
        check.why = "its history does not reproduce on the new graph:\n" + result.describe()
        return check
    if result.ends_mid_step:
        check.why = "its log stops inside one step of the new graph"
        return check
    check.ok = True
    return check


def record_upgrade(
    store: Store, check: UpgradeCheck, loaded: LoadedGraph, *, by: str
) -> GraphUpgraded:
    """Append the :class:`GraphUpgraded` of a checked run (under its lease); returns
    it as appended."""
    files: dict[str, str] = {}
    for node in loaded.graph.nodes.values():
        script = getattr(node, "script", None)
        if script:
            try:
                files[script] = content_hash((loaded.agent_dir / script).read_bytes())
            except OSError:
                pass
    path, agent_dir = loaded.resolved
    event = GraphUpgraded(
        old_hash=check.old_hash,
        new_hash=check.new_hash,
        graph_source=loaded.source,
        graph_path=path,
        agent_dir=agent_dir,
        files=files,
        by=by,
        host=socket.gethostname(),
        was=check.status,
        retry_node=check.retry_node,
        superseded=check.superseded,
    )
    with store.leased(check.run_id):
        last = store.run(check.run_id).last_seq
        if last != check.last_seq:
            raise UsageError(f"run {check.run_id} changed while it was being checked; try again")
        (stamped,) = store.append(check.run_id, [event], sync=True)
    assert isinstance(stamped, GraphUpgraded)
    return stamped


__all__ = ["UPGRADABLE", "UpgradeCheck", "check_upgrade", "record_upgrade", "upgraded_view"]
