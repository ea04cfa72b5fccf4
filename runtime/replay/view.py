"""The history a replay compares for a log with upgrades (``graphrun upgrade``).

A log with upgrades replays against the graph it ends on: each upgrade was checked
to reproduce the history before it, and the events a failed run's upgrade
superseded (the failed visit and the run's failure) are left out, as the new graph
never made them. Both the replay (:mod:`~graphrun.runtime.replay.divergence`) and
the upgrade check (:mod:`~graphrun.runtime.replay.upgrade`) read logs this way.
"""

from __future__ import annotations

import msgspec

from graphrun.eventstore.events import Event, GraphUpgraded, RunStarted


def upgraded_view(events: list[Event]) -> list[Event]:
    """The events a replay compares for a log with upgrades: the first ``RunStarted``
    carries the graph the run ends on; ``GraphUpgraded`` events and the failures
    their upgrades superseded are left out. A log without upgrades comes back as is."""
    upgrades = [e for e in events if isinstance(e, GraphUpgraded)]
    if not upgrades:
        return events
    dropped: set[int] = set()
    for up in upgrades:
        start = getattr(up, "superseded", 0) or up.seq
        dropped.update(range(start, up.seq + 1))
    last = upgrades[-1]
    first = events[0]
    assert isinstance(first, RunStarted)
    head = msgspec.structs.replace(
        first,
        graph_source=last.graph_source,
        graph_hash=last.new_hash,
        graph_path=last.graph_path or first.graph_path,
        agent_dir=last.agent_dir or first.agent_dir,
        files=last.files or first.files,
    )
    return [head, *(e for e in events[1:] if e.seq not in dropped)]


__all__ = ["upgraded_view"]
