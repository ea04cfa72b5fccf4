"""Projections of the event log: the ``runs`` table and the audit view.

Both are derived from events only, so ``runs`` can be dropped and rebuilt
(:func:`rebuild_runs`) and must always equal what appending produced.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import msgspec

from graphrun.eventstore.events import (
    ApprovalSigned,
    ChildRunFinished,
    ChildRunStarted,
    Event,
    GraphUpgraded,
    HumanInputReceived,
    HumanInputRequested,
    NodeEntered,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunInterrupted,
    RunResumed,
    RunStarted,
)


class RunRow(msgspec.Struct, frozen=True):
    """One row of the ``runs`` view (a msgspec Struct: replacing a field is cheap).

    A new head field needs a column in ``run_heads`` (a migration in
    ``migrations.py``); a new step field, a column of the ``runs`` view."""

    run_id: str
    graph_name: str
    status: str
    parent_run_id: str | None
    started_at: float
    updated_at: float
    last_seq: int
    last_hash: str
    started_by: str | None = None
    agent_dir: str | None = None
    current_node: str | None = None
    waiting_node: str | None = None
    output: str | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__struct_fields__}


COLUMNS = tuple(RunRow.__struct_fields__)

#: Past any time a run could start (year 5138): a larger value is damage.
_LATEST_TIME = 1e11
_KINDS: dict[str, tuple[type, ...]] = {"str": (str,), "float": (int, float), "int": (int,)}
#: Each column's annotation and the Python types a stored value of it may have.
_COLUMN_TYPES = tuple(
    (str(RunRow.__annotations__[c]), _KINDS.get(str(RunRow.__annotations__[c]), (str, type(None))))
    for c in COLUMNS
)


def row_problem(values: Sequence[Any]) -> str | None:
    """Why stored ``runs`` values (in :data:`COLUMNS` order) are not a run's row
    (a column of the wrong type, as a damaged or hand-edited file may hold), or
    ``None``."""
    for name, value, (kind, types) in zip(COLUMNS, values, _COLUMN_TYPES, strict=False):
        if not isinstance(value, types) or isinstance(value, bool):
            return f"its runs row's {name} is {type(value).__name__}, not {kind}"
        if kind == "float" and not 0 <= cast(float, value) < _LATEST_TIME:
            return f"its runs row's {name} ({value!r}) is not a time"
    return None


_replace = msgspec.structs.replace

#: The columns of a ``runs`` row its last event decides (read from ``events``);
#: the others are the run's head, kept in ``run_heads``.
STEP_COLUMNS = ("updated_at", "last_seq", "last_hash", "current_node")
HEAD_COLUMNS = tuple(c for c in COLUMNS if c not in STEP_COLUMNS)

_RANGE = "{t}.id > h.run_no << 32 AND {t}.id < (h.run_no + 1) << 32"

#: ``runs``: each run's head with the step columns its events give, so the view is
#: true after every commit without a write per step.
RUNS_VIEW_SQL = f"""
CREATE VIEW runs AS
SELECT {", ".join(f"h.{c}" if c not in STEP_COLUMNS else c for c in COLUMNS)}, h.run_no
FROM (
    SELECT h.*,
           coalesce(last.ts, h.started_at) AS updated_at,
           coalesce(last.seq, 0) AS last_seq,
           coalesce(last.hash, '') AS last_hash,
           (SELECT n.node_id FROM events AS n
            WHERE {_RANGE.format(t="n")} AND n.type = 'NodeEntered'
            ORDER BY n.id DESC LIMIT 1) AS current_node
    FROM run_heads AS h
    LEFT JOIN events AS last
      ON last.id = (SELECT max(e.id) FROM events AS e WHERE {_RANGE.format(t="e")})
) AS h
"""


def entered_node(event: Event) -> str | None:
    """The node an event makes the run's ``current_node`` (the view's rule)."""
    return event.node_id if isinstance(event, NodeEntered) else None


#: The events that change a ``runs`` row beyond its step columns (``updated_at``,
#: ``last_seq``, ``last_hash``, and ``current_node``, which ``NodeEntered`` sets).
HEAD_EVENT_TYPES = frozenset(
    {
        RunStarted,
        HumanInputRequested,
        HumanInputReceived,
        RunResumed,
        RunCompleted,
        RunFailed,
        RunCancelled,
        RunInterrupted,
        GraphUpgraded,
    }
)


def apply_run_row(row: RunRow | None, event: Event, event_hash: str) -> RunRow:
    """The ``runs`` row after ``event`` (stored with ``event_hash``)."""
    if row is None:
        if not isinstance(event, RunStarted):
            raise ValueError(f"run {event.run_id} does not start with RunStarted")
        return RunRow(
            run_id=event.run_id,
            graph_name=event.graph_name,
            status="running",
            parent_run_id=event.parent_run_id,
            started_at=event.ts,
            updated_at=event.ts,
            last_seq=event.seq,
            last_hash=event_hash,
            started_by=event.started_by,
            agent_dir=event.agent_dir,
        )
    row = _replace(row, updated_at=event.ts, last_seq=event.seq, last_hash=event_hash)
    match event:
        case NodeEntered(node_id=node_id):
            return _replace(row, current_node=node_id)
        case HumanInputRequested(node_id=node_id):
            return _replace(row, status="waiting", waiting_node=node_id)
        case RunResumed():
            # A process that takes over a waiting run without an answer leaves it waiting.
            if row.status in ("running", "interrupted"):
                return _replace(row, status="running", waiting_node=None)
            return row
        case HumanInputReceived():
            if row.status in ("waiting", "running", "interrupted"):
                return _replace(row, status="running", waiting_node=None)
            return row
        case RunCompleted(output=output, unhandled_failures=unhandled):
            if unhandled:
                return _replace(
                    row,
                    status="completed_with_errors",
                    output=output,
                    error=unhandled_summary(unhandled),
                    waiting_node=None,
                )
            return _replace(row, status="completed", output=output, waiting_node=None)
        case RunFailed(error=error):
            return _replace(row, status="failed", error=error, waiting_node=None)
        case RunCancelled(reason=reason):
            return _replace(row, status="cancelled", error=reason, waiting_node=None)
        case GraphUpgraded():
            if row.status == "failed":  # a failed run comes back: its failed node again
                return _replace(row, status="running", error=None)
            return row
        case RunInterrupted():
            if row.status == "running":
                return _replace(row, status="interrupted")
            return row
        case _:
            return row


def graph_version(graph_hash: str) -> str:
    """A graph's version as people read it: the first 12 hex digits of its hash."""
    return graph_hash.partition(":")[2][:12] if ":" in graph_hash else graph_hash[:12]


def unhandled_summary(unhandled: Iterable[dict[str, Any]]) -> str:
    """One line naming a run's unhandled failures (``runs``, ``show``, stderr)."""
    parts = [f"node '{f.get('node')}': {f.get('error')}" for f in unhandled]
    if not parts:
        return ""
    return f"{len(parts)} unhandled failure{'s' if len(parts) != 1 else ''}: " + "; ".join(parts)


def rebuild_rows(events_with_hashes: Iterable[tuple[Event, str]]) -> dict[str, RunRow]:
    """Fold every stored event into ``runs`` rows (for :func:`rebuild_runs`)."""
    rows: dict[str, RunRow] = {}
    for event, event_hash in events_with_hashes:
        rows[event.run_id] = apply_run_row(rows.get(event.run_id), event, event_hash)
    return rows


@dataclass(frozen=True)
class Decision:
    """One human decision, for ``graphrun audit``."""

    run_id: str
    seq: int
    ts: float
    node_id: str
    question: str
    options: list[str]
    answer: str
    by: str
    os_user: str
    host: str
    via: str
    requested_at: float | None
    depth: int = 0
    #: "signed" (a signature, not checked here; ``audit --verify`` checks it),
    #: "token", "proxy" or "claimed".
    identity: str = "claimed"
    visit: int = 0


@dataclass(frozen=True)
class ChildLink:
    """A child run started by an agent node."""

    node_id: str
    child_run_id: str
    agent: str
    status: str | None


def runs_query(
    select: str,
    mark: str,
    *,
    status: str | None,
    parent: str | None,
    limit: int,
    offset: int = 0,
    heads: str | None = None,
) -> tuple[str, list[Any]]:
    """``select`` over the runs projection, filtered and newest first, one page of
    it (``limit`` rows after ``offset``), with its arguments; ``mark`` is the
    driver's placeholder (``?`` or ``%s``). ``heads``: a table with the filter and
    order columns, indexed for them (SQLite's ``run_heads``): the page is picked
    there first, so only its rows are read through ``select`` (a view whose
    columns cost a look at each run's last event)."""
    where: list[str] = []
    args: list[Any] = []
    if status:
        where.append(f"status = {mark}")
        args.append(status)
    if parent:
        where.append(f"parent_run_id = {mark}")
        args.append(parent)
    filtered = " WHERE " + " AND ".join(where) if where else ""
    order = " ORDER BY started_at DESC, run_id DESC"
    page = f" LIMIT {mark} OFFSET {mark}"
    if heads:
        picked = f"SELECT run_id FROM {heads}{filtered}{order}{page}"
        return f"{select} WHERE run_id IN ({picked}){order}", [*args, limit, max(0, offset)]
    return select + filtered + order + page, [*args, limit, max(0, offset)]


def prefix_match(prefix: str, found: list[Any], unknown: Exception) -> str:
    """The one run id ``found`` for ``prefix`` (rows of at most three ids), or why not."""
    from graphrun.eventstore.errors import UnknownRunError

    if len(found) == 1:
        return str(found[0][0])
    if not found:
        raise unknown
    raise UnknownRunError(f"run id prefix {prefix!r} is ambiguous", hint="give more characters")


def decisions(events: Iterable[Event], depth: int = 0) -> list[Decision]:
    """Every ``HumanInputReceived`` (and ``ApprovalSigned``) of one run, with when it
    was asked."""
    asked: dict[tuple[str, int], HumanInputRequested] = {}
    out: list[Decision] = []
    for event in events:
        if isinstance(event, HumanInputRequested):
            asked[(event.node_id, event.visit)] = event
        elif isinstance(event, HumanInputReceived | ApprovalSigned):
            request = asked.get((event.node_id, event.visit))
            if isinstance(event, HumanInputReceived):
                question, options = event.question, list(event.options)
                via = event.channel
            else:
                question = request.question if request is not None else ""
                options = list(request.options) if request is not None else []
                via = f"{event.channel} (co-signature)"
            if event.signature:
                ident = "signed"
            else:
                ident = event.identity if event.identity in ("token", "proxy") else "claimed"
            out.append(
                Decision(
                    run_id=event.run_id,
                    seq=event.seq,
                    ts=event.ts,
                    node_id=event.node_id,
                    question=question,
                    options=options,
                    answer=event.answer,
                    by=event.by,
                    os_user=event.os_user,
                    host=event.host,
                    via=via,
                    requested_at=request.ts if request is not None else None,
                    depth=depth,
                    identity=ident,
                    visit=event.visit,
                )
            )
    return out


def children(events: Iterable[Event]) -> list[ChildLink]:
    """The child runs a run started, with their final status as the parent saw it."""
    links: dict[str, ChildLink] = {}
    for event in events:
        if isinstance(event, ChildRunStarted):
            links[event.child_run_id] = ChildLink(
                event.node_id, event.child_run_id, event.agent, None
            )
        elif isinstance(event, ChildRunFinished) and event.child_run_id in links:
            links[event.child_run_id] = replace(links[event.child_run_id], status=event.status)
    return list(links.values())
