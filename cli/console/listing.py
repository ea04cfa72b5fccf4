"""What the console lists: a page of runs, and what waits for a person.

Both read only what one page needs: the runs table through its primary key (run
ids sort by when a run was made), newest first, a page at a time with a cursor
(the last id shown), then the events of the runs on the page. Nothing here scans
every event of the store, so a page costs the same with ten runs or 100,000.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from graphrun.eventstore.events import Event, HumanInputRequested
from graphrun.eventstore.fold import fold
from graphrun.eventstore.projections import RunRow
from graphrun.runtime.observe.usage import Usage, run_usage

PAGE = 50
STATUSES = (
    "running",
    "waiting",
    "completed",
    "completed_with_errors",
    "failed",
    "cancelled",
    "interrupted",
)


@dataclass
class RunLine:
    """One run of the list, as the page and the API show it."""

    row: RunRow
    usage: Usage
    waiting: HumanInputRequested | None = None
    children: int = 0

    @property
    def duration(self) -> float:
        return max(0.0, self.row.updated_at - self.row.started_at)

    def waits_for(self) -> str:
        if self.waiting is None:
            return ""
        who = ", ".join(self.waiting.approvers) if self.waiting.approvers else "anyone"
        return f"{self.waiting.kind}: {who}"

    def as_dict(self) -> dict[str, Any]:
        data = self.row.as_dict()
        data["duration_s"] = round(self.duration, 3)
        data["usage"] = self.usage.as_dict()
        data["waiting"] = (
            None
            if self.waiting is None
            else {
                "node_id": self.waiting.node_id,
                "kind": self.waiting.kind,
                "visit": self.waiting.visit,
                "question": self.waiting.question,
                "options": list(self.waiting.options),
                "approvers": list(self.waiting.approvers),
            }
        )
        return data


@dataclass
class Page:
    lines: list[RunLine]
    next_cursor: str | None
    filters: dict[str, str] = field(default_factory=dict)


def _sqlite(store: Any) -> bool:
    return getattr(store, "conn", None) is not None


def _rows(store: Any, sql: str, args: list[Any]) -> list[tuple[Any, ...]]:
    if _sqlite(store):
        return [tuple(r) for r in store.conn.execute(sql.replace("%s", "?"), args).fetchall()]
    with store.pool.connection() as conn:
        return [tuple(r) for r in conn.execute(sql, args).fetchall()]


def list_runs(
    store: Any,
    *,
    status: str | None = None,
    agent: str | None = None,
    search: str | None = None,
    cursor: str | None = None,
    children: bool = False,
    limit: int = PAGE,
    prices: Mapping[str, tuple[float, float]] | None = None,
) -> Page:
    """A page of runs, newest first, after ``cursor`` (a run id shown last)."""
    where: list[str] = []
    args: list[Any] = []
    if not children:
        where.append("parent_run_id IS NULL")
    if status:
        where.append("status = %s")
        args.append(status)
    if agent:
        where.append("graph_name = %s")
        args.append(agent)
    if search:
        where.append("(run_id >= %s AND run_id < %s OR graph_name = %s OR started_by = %s)")
        args += [search, search + "\uffff", search, search]
    if cursor:
        where.append("run_id < %s")
        args.append(cursor)
    head = "run_heads" if _sqlite(store) else "runs"
    sql = f"SELECT run_id FROM {head}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY run_id DESC LIMIT %s"
    ids = [str(r[0]) for r in _rows(store, sql, [*args, limit + 1])]
    more = len(ids) > limit
    ids = ids[:limit]
    lines = [run_line(store, run_id, prices) for run_id in ids]
    filters = {
        k: v
        for k, v in (("status", status), ("agent", agent), ("q", search))
        if v  # the filters the next page keeps
    }
    return Page(lines, ids[-1] if more and ids else None, filters)


def run_line(
    store: Any, run_id: str, prices: Mapping[str, tuple[float, float]] | None = None
) -> RunLine:
    """One run's line: its row, its LLM usage, what it waits for."""
    row = store.run(run_id)
    events = store.read(run_id)
    usage, _ = run_usage(events, prices)
    waiting = _waiting(events) if row.status == "waiting" else None
    return RunLine(row, usage, waiting)


def _waiting(events: list[Event]) -> HumanInputRequested | None:
    state = fold(events)
    return None if state.terminal else state.waiting


def may_answer(request: HumanInputRequested, principal: str) -> bool:
    """Whether ``principal`` may answer ``request`` (no approvers: anyone)."""
    return not request.approvers or principal in request.approvers


@dataclass
class Wait:
    """One question waiting for a person."""

    run_id: str
    graph_name: str
    started_by: str | None
    request: HumanInputRequested
    state: dict[str, Any]


def inbox(
    store: Any, principal: str, *, limit: int = PAGE, cursor: str | None = None
) -> list[Wait]:
    """What waits for ``principal``: the waiting runs whose question they may answer,
    newest first. The approvers are read from each run's own request (the graph
    that governs the run), in SQL where the store is SQLite."""
    if _sqlite(store):
        ids = _sqlite_waiting_for(store, principal, limit, cursor)
    else:
        ids = _pg_waiting(store, cursor)
    from graphrun.cli.console.decide import signed_by
    from graphrun.runtime.decisions.policy import PolicyError, governing_policy

    out: list[Wait] = []
    for run_id in ids:
        events = store.read(run_id)
        state = fold(events)
        request = None if state.terminal else state.waiting
        if request is None or not may_answer(request, principal):
            continue
        try:  # the graph that governs the run decides, as when the answer comes
            if not governing_policy(events, request.node_id).allows(principal):
                continue
        except PolicyError:
            pass  # shown; answering says why it is refused
        if principal in signed_by(events, request):
            continue  # already signed: waits for the other signers
        row = store.run(run_id)
        out.append(Wait(run_id, row.graph_name, row.started_by, request, dict(state.state)))
        if len(out) >= limit:
            break
    return out


def _sqlite_waiting_for(store: Any, principal: str, limit: int, cursor: str | None) -> list[str]:
    rng = "e.id > h.run_no << 32 AND e.id < (h.run_no + 1) << 32"
    sql = f"""
        SELECT run_id FROM (
            SELECT h.run_id,
                   (SELECT e.body FROM events AS e
                    WHERE {rng} AND e.type = 'HumanInputRequested'
                    ORDER BY e.id DESC LIMIT 1) AS request
            FROM run_heads AS h
            WHERE h.status = 'waiting' {"AND h.run_id < ?" if cursor else ""}
        )
        WHERE coalesce(json_array_length(request, '$.approvers'), 0) = 0
           OR EXISTS (SELECT 1 FROM json_each(request, '$.approvers') WHERE value = ?)
        ORDER BY run_id DESC LIMIT ?
    """
    args: list[Any] = [cursor] if cursor else []
    rows = store.conn.execute(sql, [*args, principal, limit]).fetchall()
    return [str(r[0]) for r in rows]


def _pg_waiting(store: Any, cursor: str | None) -> list[str]:
    sql = "SELECT run_id FROM runs WHERE status = 'waiting'"
    args: list[Any] = []
    if cursor:
        sql += " AND run_id < %s"
        args.append(cursor)
    sql += " ORDER BY run_id DESC LIMIT 2000"
    return [str(r[0]) for r in _rows(store, sql, args)]


__all__ = ["PAGE", "STATUSES", "Page", "RunLine", "Wait", "inbox", "list_runs", "may_answer"]
