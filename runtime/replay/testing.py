"""Recorded runs as tests: ``graphrun test`` and the pytest plugin.

A recorded run is an export file (``graphrun export RUN -o replays/name.run.jsonl``).
Testing it replays it offline against its agent's *current* graph.yaml and
scripts: a changed prompt, route, template or script shows up as a divergence
naming the node. The agent directory is found through the file header's
``agent_dirs`` (paths relative to the file, written by ``export -o``); a path
there that does not resolve fails the run, naming the file and the path (never
another checkout's directory). A file without ``agent_dirs`` (written to stdout)
uses the absolute directory its log records, when it exists; else the run is
replayed against the graph recorded in its log (and says so).

The pytest plugin (entry point ``graphrun``) collects every ``*.run.jsonl`` file
as test items, one per recorded top-level run (its child runs are part of it), so
users put recorded runs into their own suites. An item is named
``<file stem>[<graph>]`` (``ticket-triage[ticket-triage]`` for
``ticket-triage.run.jsonl``); a file with several top-level runs of one graph
names them in file order ``<stem>[<graph>]``, ``<stem>[<graph>-2]``, ...
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphrun.eventstore.events import Event, RunStarted
from graphrun.runtime.errors import GraphrunError
from graphrun.runtime.replay.divergence import ReplayResult, replay_events

#: The file name ending that marks a recorded run (collected from directories).
SUFFIX = ".run.jsonl"


@dataclass
class CaseResult:
    """One recorded run of one file, replayed."""

    file: Path
    run_id: str
    graph: str
    result: ReplayResult | None
    error: str | None = None
    note: str | None = None
    parent_run_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.result is not None and self.result.ok

    @property
    def events(self) -> int:
        return self.result.events if self.result is not None else 0

    def why(self) -> str:
        """Why the case failed: the error or the divergence report."""
        if self.error:
            return self.error
        if self.result is not None and self.result.divergence is not None:
            return self.result.describe()
        return ""


class MissingAgentDir(GraphrunError):
    """The agent directory an export file names does not exist."""


def agent_dir_of(file: Path, header: dict[str, Any], run_id: str, first: RunStarted) -> Path | None:
    """The run's agent directory today: the header's path relative to the file, else
    (a file without one) the absolute directory the log records; None when neither
    is known. A path the header names that does not resolve is an error: the run
    must not pass against a directory it does not name."""
    import os

    dirs = header.get("agent_dirs")
    rel = dirs.get(run_id) if isinstance(dirs, dict) else None
    if rel:
        candidate = (file.parent / str(rel)).resolve()
        if not candidate.is_dir():
            raise MissingAgentDir(
                f"{file}: agent directory {rel} of run {run_id} ({first.graph_name}) "
                f"not found: no directory {candidate}"
            )
        return candidate
    if first.agent_dir and os.path.isabs(first.agent_dir) and Path(first.agent_dir).is_dir():
        return Path(first.agent_dir)
    return None


class _Graphs:
    """Current graphs by agent directory, loaded once per suite."""

    def __init__(self, config_dir: Path | None = None) -> None:
        self._cache: dict[tuple[Path, int], Any] = {}
        self.config_dir = config_dir

    def load(self, agent_dir: Path, recorded: Any = None) -> Any:
        """A graph agent's graph.yaml, or the graph an LLM-loop agent runs as.

        A model Loki's default-model chain takes from the configuration directory
        is the recorded one when that directory is not here: a missing
        configuration is not a changed graph."""
        from graphrun.runtime.agents import load_agent
        from graphrun.runtime.graph.config import config_dir

        key = (agent_dir, id(recorded))
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = load_agent(
                agent_dir, config_dir=self.config_dir or config_dir(None), recorded=recorded
            )
        return found


def _recorded_graph(events: list[Event]) -> Any:
    """The graph the run was recorded with (None when it cannot be read)."""
    from graphrun.eventstore.fold import fold
    from graphrun.runtime.engine.driver import graph_of

    try:
        return graph_of(fold(events[:1])).graph
    except GraphrunError:
        return None


def replay_file(
    file: Path, *, graphs: _Graphs | None = None, rerun_retrieval: bool = False
) -> list[CaseResult]:
    """Replay every run in one export file against the current graphs and scripts."""
    from graphrun.runtime.errors import GraphrunError
    from graphrun.runtime.replay.transfer import read_export, read_header

    graphs = graphs or _Graphs()
    try:
        header = read_header(file)
        runs = read_export(file)
    except GraphrunError as exc:
        return [CaseResult(file, "?", "?", None, error=str(exc))]
    if not runs:
        return [CaseResult(file, "?", "?", None, error=f"{file} holds no events")]
    out = []
    for run_id, events in runs.items():
        first = events[0]
        if not isinstance(first, RunStarted):
            error = f"run {run_id} does not start with RunStarted"
            out.append(CaseResult(file, run_id, "?", None, error=error))
            continue
        case = CaseResult(file, run_id, first.graph_name, None, parent_run_id=first.parent_run_id)
        out.append(case)
        try:
            agent_dir = agent_dir_of(file, header, run_id, first)
        except MissingAgentDir as exc:
            case.error = str(exc)
            continue
        loaded = None
        try:
            if agent_dir is not None:
                loaded = graphs.load(agent_dir, _recorded_graph(events))
            else:
                case.note = "agent directory not found: replayed against the recorded graph"
            sources = (header.get("sources") or {}).get(run_id)
            case.result = replay_events(
                events,
                loaded,
                check_files=loaded is not None,
                sources=sources,
                rerun_retrieval=rerun_retrieval,
            )
        except GraphrunError as exc:
            case.error = str(exc)
    return out


def find_files(paths: list[str]) -> list[Path]:
    """The recorded-run files in ``paths`` (directories are searched for ``*.run.jsonl``)."""
    files: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            files.extend(sorted(path.rglob(f"*{SUFFIX}")))
        elif path.exists():
            files.append(path)
        else:
            from graphrun.runtime.errors import UsageError

            raise UsageError(
                f"no such file or directory: {p}",
                hint="record one with `graphrun export RUN -o replays/NAME.run.jsonl`",
            )
    return files


def run_cases(paths: list[str]) -> Iterator[CaseResult]:
    """Every recorded run under ``paths``, replayed (one suite: graphs loaded once)."""
    graphs = _Graphs()
    for file in find_files(paths):
        yield from replay_file(file, graphs=graphs)


def case_line(case: CaseResult) -> str:
    """``PASS``/``FAIL`` line of one run (a failure carries its report)."""
    label = f"{case.file} run {case.run_id} ({case.graph})"
    if case.ok:
        extra = f"; {case.note}" if case.note else ""
        notes = f"; {'; '.join(case.result.notes)}" if case.result and case.result.notes else ""
        return f"PASS {label}: {case.events} events{extra}{notes}"
    return f"FAIL {label}: {case.why()}"


def run_suite(
    paths: list[str], *, quiet: bool = False, as_json: bool = False, rerun_retrieval: bool = False
) -> int:
    """``graphrun test``: one line per run, then ``N passed, M failed``.

    Returns the exit code: 0 all passed, 1 any failed, 2 nothing to test.
    """
    from graphrun.runtime.observe.progress import progress_bar

    passed = failed = 0
    out = sys.stdout
    files = list(find_files(paths))
    graphs = _Graphs()

    def cases() -> Iterator[CaseResult]:
        # A transient bar on a terminal's stderr, one step per file; nothing when piped.
        with progress_bar("graphrun test", len(files)) as advance:
            for file in files:
                yield from replay_file(file, graphs=graphs, rerun_retrieval=rerun_retrieval)
                advance(1)

    for case in cases():
        if case.ok:
            passed += 1
        else:
            failed += 1
        if as_json:
            out.write(
                json.dumps(
                    {
                        "file": str(case.file),
                        "run_id": case.run_id,
                        "graph": case.graph,
                        "ok": case.ok,
                        "events": case.events,
                        "error": case.error,
                        "note": case.note,
                        "divergence": case.result.divergence.as_dict()
                        if case.result and case.result.divergence
                        else None,
                    },
                    ensure_ascii=False,
                    default=str,
                )
                + "\n"
            )
        elif not (quiet and case.ok):
            out.write(case_line(case) + "\n")
    if not as_json:
        out.write(f"{passed} passed, {failed} failed\n")
    out.flush()
    if passed + failed == 0:
        print(
            f"no recorded runs (*{SUFFIX}) in {', '.join(paths)}; "
            "record one with `graphrun export RUN -o replays/NAME.run.jsonl`",
            file=sys.stderr,
        )
        return 2
    return 1 if failed else 0


def file_stem(path: Path) -> str:
    """``ticket-triage`` for ``ticket-triage.run.jsonl``; the plain stem otherwise."""
    name = path.name
    return name[: -len(SUFFIX)] if name.endswith(SUFFIX) else path.stem


def top_level_graphs(path: Path) -> list[tuple[str, str]]:
    """``(run id, graph name)`` of each top-level run of an export file, in file order."""
    from graphrun.runtime.replay.transfer import read_export

    runs = read_export(path)
    out = []
    for run_id, events in runs.items():
        first = events[0]
        parent = getattr(first, "parent_run_id", None)
        if parent is None or parent not in runs:
            out.append((run_id, str(getattr(first, "graph_name", "") or "?")))
    return out


def item_names(stem: str, runs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``(test id, run id)`` per run: ``<stem>[<graph>]``, and ``<stem>[<graph>-N]``
    for the Nth run of a graph the file holds more than once (in file order)."""
    seen: dict[str, int] = {}
    used: set[str] = set()
    out = []
    for run_id, graph in runs:
        seen[graph] = seen.get(graph, 0) + 1
        label = graph if seen[graph] == 1 else f"{graph}-{seen[graph]}"
        while label in used:  # a graph named like another's second run
            seen[graph] += 1
            label = f"{graph}-{seen[graph]}"
        used.add(label)
        out.append((f"{stem}[{label}]", run_id))
    return out


# --- pytest plugin ----------------------------------------------------------------

try:
    import pytest
except ImportError:  # pragma: no cover - pytest is optional at run time
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    class ReplayFailure(Exception):
        """A recorded run no longer replays."""

    class RecordedRunItem(pytest.Item):
        """One recorded top-level run (with its child runs) of a ``*.run.jsonl`` file."""

        def __init__(self, *, run_id: str, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.run_id = run_id

        def runtest(self) -> None:
            chosen = self.config.getoption("graphrun_config_dir", None)
            graphs = _Graphs(Path(chosen) if chosen else None)
            cases = replay_file(self.path, graphs=graphs)
            ids = {self.run_id}
            mine = []
            for case in cases:
                # A file error (run id "?"), this run, or one of its descendants.
                if case.run_id == "?" or case.run_id in ids or case.parent_run_id in ids:
                    ids.add(case.run_id)
                    mine.append(case)
            if not mine:
                raise ReplayFailure(f"run {self.run_id} is not in {self.path}")
            bad = [c for c in mine if not c.ok]
            if bad:
                raise ReplayFailure("\n".join(f"run {c.run_id}: {c.why()}" for c in bad))

        def repr_failure(self, excinfo: Any, style: Any = None) -> str:
            if isinstance(excinfo.value, ReplayFailure):
                return f"recorded run {self.run_id} diverged:\n{excinfo.value}"
            return str(super().repr_failure(excinfo))

        def reportinfo(self) -> tuple[Any, int, str]:
            return self.path, 0, f"recorded run {self.run_id}"

    class RecordedRunFile(pytest.File):
        """A ``*.run.jsonl`` export file: one item per top-level run."""

        def collect(self) -> Any:
            from graphrun.runtime.errors import GraphrunError

            try:
                runs = top_level_graphs(self.path)
            except GraphrunError:
                # An unreadable file is still an item: it fails, saying why.
                runs = [("?", "unreadable")]
            for name, run_id in item_names(file_stem(self.path), runs):
                yield RecordedRunItem.from_parent(self, name=name, run_id=run_id)

    def pytest_addoption(parser: Any) -> None:
        """``--config-dir``/``--loki-dir``: the config directory recorded runs load with."""
        group = parser.getgroup("graphrun", "graphrun recorded runs")
        group.addoption(
            "--config-dir",
            "--loki-dir",
            dest="graphrun_config_dir",
            metavar="DIR",
            default=None,
            help="Config directory (e.g. a Loki/Coyote one) the agents' graphs of "
            "recorded runs are loaded with.",
        )

    def pytest_collect_file(parent: Any, file_path: Path) -> Any:
        """Collect ``*.run.jsonl`` files as recorded-run tests."""
        if file_path.name.endswith(SUFFIX):
            return RecordedRunFile.from_parent(parent, path=file_path)
        return None


__all__ = [
    "SUFFIX",
    "CaseResult",
    "Event",
    "agent_dir_of",
    "case_line",
    "replay_file",
    "run_cases",
    "run_suite",
]
