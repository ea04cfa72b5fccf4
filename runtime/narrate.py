"""The stderr narration (``▸`` lines) and the performance summary.

Narration is always on (dimmed on a terminal unless ``NO_COLOR``); the
performance summary and state snapshots go through :mod:`logging` at the level
``GRAPHRUN_LOG`` sets (``info``: start/end/summary, ``debug``: + routing and state
sizes, ``trace``: + full state).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterable
from typing import Any, TextIO

from graphrun.actors.terminal import terminal_safe
from graphrun.eventstore.events import (
    BranchesJoined,
    BranchesMerged,
    ChildRunFinished,
    Event,
    HumanInputRequested,
    LlmCalled,
    LlmContinued,
    LlmResult,
    NodeCompleted,
    NodeEntered,
    NodeFailed,
    NodeRetrying,
    RetrievalDone,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunInterrupted,
    RunResumed,
    RunStarted,
    ScriptFinished,
    StepStarted,
    TimeoutFired,
    ToolCalled,
)
from graphrun.eventstore.fold import RunState

TRACE = 5
log = logging.getLogger("graphrun.graph")

# Node types whose effect may take a while and prints nothing meanwhile (not agent
# nodes, whose child run narrates itself, nor human nodes, which prompt).
_PENDING_TYPES = frozenset({"llm", "script", "rag"})


def configure_logging() -> None:
    """Set up the tracing channel from ``GRAPHRUN_LOG`` (off when unset)."""
    level_name = os.environ.get("GRAPHRUN_LOG", "").strip().lower()
    if not level_name:
        return
    logging.addLevelName(TRACE, "TRACE")
    level = {
        "trace": TRACE,
        "debug": logging.DEBUG,
        "info": logging.INFO,
        "warn": logging.WARNING,
        "warning": logging.WARNING,
        "error": logging.ERROR,
    }.get(level_name, logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    root = logging.getLogger("graphrun")
    root.handlers[:] = [handler]
    root.setLevel(level)


def child_narrator() -> Narrator:
    """A narrator for a child run: its lines indented under its parent's."""
    narrator = Narrator()
    original = narrator.line
    narrator.line = lambda text: original("  " + text)  # type: ignore[method-assign]
    return narrator


class Narrator:
    """Turns appended events into ``▸`` lines on stderr."""

    def __init__(self, stream: TextIO | None = None, *, color: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        if color is None:
            color = self.stream.isatty() and "NO_COLOR" not in os.environ
        self.color = color
        self.started_ts: float | None = None
        self.graph_name = ""
        self.events: list[Event] = []
        self.resumed_at: str | None = None
        # settings.log_state_snapshots (default true): state size/keys at debug, full at trace.
        self.snapshots = True
        # On a terminal, a node whose effect takes time shows a spinner and its elapsed time.
        self.pending: Any = None
        self._pending_lock = threading.Lock()  # effects narrate from their own threads
        # A map's items or a fan-out's branches: counted, and on a terminal shown on
        # one live line (done / running / failed, elapsed) instead of a line each.
        self.live = self.color
        self.group: _Group | None = None

    def line(self, text: str) -> None:
        self.stop_pending()
        text = terminal_safe(text)  # what a run brings is shown, not obeyed
        if self.color:
            text = f"\x1b[2m{text}\x1b[0m"
        group = self.group
        if group is not None and group.display is not None:
            from rich.text import Text

            group.display.console.print(Text.from_ansi(text))  # above the live line
            return
        print(text, file=self.stream, flush=True)

    def __call__(self, events: Iterable[Event], state: RunState) -> None:
        batch = list(events)
        for i, event in enumerate(batch):
            self.events.append(event)
            if isinstance(event, RunResumed):
                # ``state`` is the state after the whole batch: the node the run
                # resumed at is the first one the events after the resume name
                # (the answered node after approve/answer).
                self.resumed_at = next(
                    (n for e in batch[i + 1 :] if (n := getattr(e, "node_id", None))), None
                )
            self.narrate(event, state)

    def narrate(self, event: Event, state: RunState) -> None:
        if event.branch:
            self._branch(event)
            return
        if self.group is not None and isinstance(
            event,
            NodeCompleted
            | NodeFailed
            | BranchesMerged
            | RunCompleted
            | RunFailed
            | RunCancelled
            | RunInterrupted,
        ):
            self.end_group()
        match event:
            case RunStarted():
                self.started_ts = event.ts
                self.graph_name = event.graph_name
                start, self.snapshots = _start_of(state)
                self.line(f"▸ graph: {event.graph_name} (start: {start})")
                log.info("[graph:%s] started run %s", event.graph_name, event.run_id)
            case RunResumed():
                self.started_ts = self.started_ts or event.ts
                self.graph_name = state.graph_name
                step = (
                    f"super-step {state.step} ({', '.join(sorted(state.branches))})"
                    if state.branches
                    else None
                )
                targets = ", ".join(state.targets) if len(state.targets) > 1 else None
                where = (
                    self.resumed_at
                    or step
                    or state.current
                    or state.routed_to
                    or targets
                    or ("start" if state.last_node is None else state.last_node)
                )
                self.line(f"▸ graph: {state.graph_name} resumed (at: {where})")
            case NodeEntered():
                self.line(f"▸ {event.node_id} ({event.node_type})")
                if self.color and event.node_type in _PENDING_TYPES:
                    self.start_pending(f"{event.node_id} ({event.node_type})")
                if event.node_type == "map":
                    self.start_group(event.node_id, *_map_size(state, event.node_id))
                if self.snapshots and log.isEnabledFor(logging.DEBUG):
                    import json

                    text = json.dumps(state.state, default=str)
                    log.debug(
                        "[graph:%s] state before %s: %d bytes, keys: %s",
                        state.graph_name,
                        event.node_id,
                        len(text),
                        ", ".join(sorted(state.state)),
                    )
                    log.log(TRACE, "[graph:%s] state: %s", state.graph_name, text)
            case LlmCalled():
                tools = [
                    t.get("function", t).get("name", "?") for t in event.request.get("tools", [])
                ]
                self.line(
                    f"▸ llm call: model={event.model or '<active>'} "
                    f"tools={','.join(tools) if tools else '<none>'}"
                    + (f" (attempt {event.attempt})" if event.attempt > 1 else "")
                )
            case ToolCalled():
                self.line(f"▸ tool: {event.name}" + (" (error)" if event.is_error else ""))
            case LlmContinued():
                self.line(f"▸ prompted again ({event.reason}, {event.count})")
            case NodeCompleted(routed_to=None):
                pass
            case NodeCompleted():
                if event.skipped:
                    self.line(f"▸ {event.node_id} skipped ({event.skipped}) -> {event.routed_to}")
                elif event.failed:
                    self.line(f"▸ {event.node_id} failed: {event.error} -> {event.routed_to}")
                else:
                    self.line(f"▸ {event.node_id} -> {event.routed_to}")
                log.debug(
                    "[graph:%s] %s routed to %s", state.graph_name, event.node_id, event.routed_to
                )
            case NodeFailed():
                self.line(f"▸ {event.node_id} failed: {event.error}")
            case NodeRetrying():
                self.line(
                    f"▸ {event.node_id} attempt {event.attempt} failed ({event.error[:120]}); "
                    f"trying again in {event.delay:g}s"
                )
            case HumanInputRequested():
                self.line(f"▸ {event.node_id} waits for an answer")
            case TimeoutFired():
                self.line(f"▸ timeout fired after {event.timeout_s:g}s")
            case RunCompleted():
                self.line(f"▸ graph done in {self._elapsed(event.ts)}")
                if event.unhandled_failures:
                    from graphrun.runtime.engine.failures import summary

                    self.line(f"▸ graph completed with errors: {summary(event.unhandled_failures)}")
                self.summary()
            case RunFailed():
                self.line(f"▸ graph failed in {self._elapsed(event.ts)}: {event.error}")
                self.summary()
            case RunCancelled():
                self.line(f"▸ graph cancelled: {event.reason}")
                self.summary()
            case RunInterrupted():
                self.line(f"▸ graph {event.reason} in {self._elapsed(event.ts)}")
            case StepStarted():
                self.line(f"▸ super-step {event.step} start: {', '.join(event.frontier)}")
                size = len(event.frontier)
                self.start_group(f"super-step {event.step}", size, size)
            case BranchesJoined():
                cancelled = ", ".join(event.cancelled) or "none"
                failed = "".join(
                    f", {b} failed" + (f" ({event.errors[b]})" if event.errors.get(b) else "")
                    for b in event.failed
                )
                self.line(
                    f"▸ super-step {event.step} joined ({event.reason}): "
                    f"{', '.join(event.counted) or 'none'} counted{failed}, {cancelled} cancelled"
                )
            case BranchesMerged():
                merged = ", ".join(
                    f"{key} ({event.reducers[key]})" if key in event.reducers else key
                    for key in sorted(event.merged)
                )
                targets = ", ".join(event.targets) or "END"
                self.line(
                    f"▸ super-step {event.step} end -> {targets}"
                    + (f" (merged: {merged})" if merged else "")
                )
            case _:
                pass

    def _branch(self, event: Event) -> None:
        """A line for a branch of a parallel super-step (or a map item), indented; on a
        terminal, a map item's outcome only moves the live line (failures still print)."""
        group = self.group
        match event:
            case NodeEntered():
                if group is None or group.display is None:
                    self.line(f"▸   {event.node_id} ({event.node_type}) start")
            case ScriptFinished() | RetrievalDone() | ChildRunFinished():
                failed = bool(
                    getattr(event, "error", None)
                    or getattr(event, "status", "") in ("failed", "cancelled")
                )
                self._item_done(
                    event,
                    failed,
                    f"▸   {_who(event)} {'FAILED' if failed else 'done'} "
                    f"in {_ms(event.duration_ms)}",
                )
            case LlmResult():
                self._item_done(
                    event,
                    bool(event.error),
                    f"▸   {_who(event)} "
                    f"{'FAILED: ' + event.error[:120] if event.error else 'done'}",
                )
            case ToolCalled():
                self.line(
                    f"▸   {event.branch} tool: {event.name}"
                    + (" (error)" if event.is_error else "")
                )
            case NodeFailed():
                self.line(f"▸   {event.node_id} FAILED: {event.error[:120]}")
            case NodeRetrying():
                self.line(
                    f"▸   {event.node_id} attempt {event.attempt} failed; again in {event.delay:g}s"
                )
            case HumanInputRequested():
                self.line(f"▸   {event.node_id} waits for an answer")
            case _:
                pass

    def _item_done(self, event: Event, failed: bool, text: str) -> None:
        """One map item (or fan-out branch) finished: count it, say it."""
        group = self.group
        if group is None or not event.branch.startswith(group.prefix):
            self.line(text)
            return
        group.count(event.branch, failed)
        if group.display is not None:
            if failed:
                self.line(text)
            group.refresh()
            return
        self.line(f"{text} ({group.done}/{group.total})")

    def start_group(self, name: str, total: int, cap: int) -> None:
        """Begin counting a map's items or a super-step's branches."""
        self.end_group()
        self.stop_pending()
        prefix = f"{name}[" if not name.startswith("super-step") else ""
        group = _Group(name, prefix, total, max(1, cap))
        self.group = group
        if self.live and total > 1:
            group.show(self.stream)

    def end_group(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            group.close()

    def start_pending(self, what: str) -> None:
        """A transient spinner with the elapsed time, until the next line (terminal only)."""
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.stop_pending()
        progress = Progress(
            SpinnerColumn(),
            TextColumn("[dim]{task.description}"),
            TimeElapsedColumn(),
            console=Console(file=self.stream),
            transient=True,
        )
        progress.add_task(what, total=None)
        with self._pending_lock:
            progress.start()
            self.pending = progress

    def stop_pending(self) -> None:
        with self._pending_lock:
            pending, self.pending = self.pending, None
        if pending is not None:
            pending.stop()

    def _elapsed(self, ts: float) -> str:
        if self.started_ts is None:
            return "?"
        return f"{ts - self.started_ts:.2f}s"

    def summary(self) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        rows = performance(self.events)
        log.info("[graph:%s] performance summary (slowest first):", self.graph_name)
        for node_id, visits, total, avg, peak in rows:
            log.info(
                "[graph:%s] %s: %d visit(s), total %.0fms, avg %.0fms, max %.0fms",
                self.graph_name,
                node_id,
                visits,
                total,
                avg,
                peak,
            )


class _Group:
    """The counts of a map's items (branch ids ``<map>[i]``) or of a super-step's
    branches, and their live line on a terminal (``rich``)."""

    def __init__(self, name: str, prefix: str, total: int, cap: int) -> None:
        self.name = name
        self.prefix = prefix
        self.total = total
        self.cap = cap
        self.finished: dict[str, bool] = {}
        self.display: Any = None
        self.task: Any = None

    @property
    def done(self) -> int:
        return len(self.finished)

    @property
    def failed(self) -> int:
        return sum(self.finished.values())

    @property
    def running(self) -> int:
        # Slots refill as items finish, so all of them are busy while items remain.
        return max(0, min(self.cap, self.total - self.done))

    def count(self, branch: str, failed: bool) -> None:
        self.finished[branch] = self.finished.get(branch, False) or failed

    def describe(self) -> str:
        return (
            f"{self.name}: {self.done}/{self.total} done, {self.running} running, "
            f"{self.failed} failed"
        )

    def show(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.display = Progress(
            TextColumn("[dim]▸ {task.description}"),
            BarColumn(bar_width=20),
            TimeElapsedColumn(),
            console=Console(file=stream),
            transient=True,
        )
        self.task = self.display.add_task(self.describe(), total=self.total)
        self.display.start()

    def refresh(self) -> None:
        if self.display is not None:
            self.display.update(self.task, completed=self.done, description=self.describe())

    def close(self) -> None:
        display, self.display = self.display, None
        if display is not None:
            display.stop()


def _map_size(state: RunState, node_id: str) -> tuple[int, int]:
    """How many items the map node ``node_id`` runs and how many at once (0 when it
    cannot tell: the map then fails, and says why)."""
    try:
        from graphrun.runtime.engine.decider import map_items
        from graphrun.runtime.engine.driver import graph_of
        from graphrun.runtime.nodes.map import MapNode

        graph = graph_of(state).graph
        node = graph.nodes.get(node_id)
        if not isinstance(node, MapNode):
            return 0, 1
        items = map_items(node, node_id, state.state)
        return len(items), node.max_concurrency or graph.settings.max_concurrency
    except Exception:  # the narration must never break a run
        return 0, 1


def _start_of(state: RunState) -> tuple[str, bool]:
    """The start node and ``settings.log_state_snapshots`` of the run's recorded graph."""
    import yaml

    try:
        data: Any = yaml.load(
            state.graph_source, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        )
        settings = data.get("settings") or {}
        return str(data.get("start")), bool(settings.get("log_state_snapshots", True))
    except Exception:  # the narration must never break a run
        return "?", True


def performance(events: Iterable[Event]) -> list[tuple[str, int, float, float, float]]:
    """Per node: visits, total/avg/max wall-clock ms (from entry to completion)."""
    entered: dict[str, float] = {}
    spans: dict[str, list[float]] = {}
    for event in events:
        if isinstance(event, NodeEntered):
            entered[event.node_id] = event.ts
        elif isinstance(event, NodeCompleted | NodeFailed) and event.node_id in entered:
            spans.setdefault(event.node_id, []).append(
                (event.ts - entered.pop(event.node_id)) * 1000
            )
    rows = [(node, len(ms), sum(ms), sum(ms) / len(ms), max(ms)) for node, ms in spans.items()]
    return sorted(rows, key=lambda r: r[2], reverse=True)


def _ms(ms: float) -> str:
    return f"{ms:.0f}ms" if ms < 1000 else f"{ms / 1000:.2f}s"


def _who(event: Event) -> str:
    """A branch's name in narration: the node, or the map item and its node."""
    node_id = getattr(event, "node_id", "")
    return node_id if event.branch == node_id else f"{event.branch} ({node_id})"
