"""Recorded runs as tests: ``graphrun test`` and the pytest plugin.

A recorded run is an export file (``graphrun export RUN -o replays/name.run.jsonl``).
Testing it replays it offline against its agent's *current* graph.yaml and
scripts: a changed prompt, route, template or script shows up as a divergence.

The pytest plugin (entry point ``graphrun``) collects every ``*.run.jsonl`` file
as test items, one per recorded top-level run, so users put recorded runs into
their own suites.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphrun.eventstore.events import Event, RunStarted
from graphrun.eventstore.fold import fold
from graphrun.runtime.replay import ReplayResult, replay_events


@dataclass
class CaseResult:
    file: Path
    run_id: str
    graph: str
    result: ReplayResult | None
    error: str | None = None
    note: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.result is not None and self.result.ok


def _agent_dir(file: Path, header: dict[str, Any], run_id: str, first: RunStarted) -> Path | None:
    rel = (header.get("agent_dirs") or {}).get(run_id)
    if rel:
        candidate = (file.parent / rel).resolve()
        if candidate.is_dir():
            return candidate
    if first.agent_dir and Path(first.agent_dir).is_dir():
        return Path(first.agent_dir)
    return None


def replay_file(file: Path) -> list[CaseResult]:
    """Replay every run in one export file against the current graphs."""
    from graphrun.runtime.errors import GraphrunError
    from graphrun.runtime.loader import find_graph_file, load_graph
    from graphrun.runtime.transfer import read_export, read_header

    try:
        header = read_header(file)
        runs = read_export(file)
    except GraphrunError as exc:
        return [CaseResult(file, "?", "?", None, error=str(exc))]
    out = []
    for run_id, events in runs.items():
        first = events[0]
        assert isinstance(first, RunStarted)
        agent_dir = _agent_dir(file, header, run_id, first)
        note = None
        loaded = None
        if agent_dir is not None:
            try:
                loaded = load_graph(find_graph_file(agent_dir))
            except GraphrunError as exc:
                out.append(CaseResult(file, run_id, first.graph_name, None, error=str(exc)))
                continue
        else:
            note = "agent directory not found: replayed against the recorded graph"
        try:
            result = replay_events(events, loaded, check_files=loaded is not None)
        except GraphrunError as exc:
            out.append(CaseResult(file, run_id, first.graph_name, None, error=str(exc)))
            continue
        out.append(CaseResult(file, run_id, first.graph_name, result, note=note))
    return out


def find_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            files.extend(sorted(path.rglob("*.jsonl")))
        elif path.exists():
            files.append(path)
        else:
            from graphrun.runtime.errors import UsageError

            raise UsageError(f"no such file or directory: {p}")
    return files


def run_suite(paths: list[str], *, quiet: bool = False, as_json: bool = False) -> int:
    cases = [case for file in find_files(paths) for case in replay_file(file)]
    passed = sum(c.ok for c in cases)
    failed = len(cases) - passed
    for c in cases:
        if as_json:
            print(
                json.dumps(
                    {
                        "file": str(c.file),
                        "run_id": c.run_id,
                        "graph": c.graph,
                        "ok": c.ok,
                        "events": c.result.events if c.result else 0,
                        "error": c.error,
                        "divergence": c.result.divergence.format()
                        if c.result and c.result.divergence
                        else None,
                    }
                )
            )
            continue
        if c.ok:
            if not quiet:
                assert c.result is not None
                extra = f" ({c.note})" if c.note else ""
                print(f"PASS {c.file} run {c.run_id} ({c.graph}): {c.result.events} events{extra}")
        else:
            why = c.error or (
                c.result.divergence.format() if c.result and c.result.divergence else ""
            )
            print(f"FAIL {c.file} run {c.run_id} ({c.graph}): {why}")
    if not as_json:
        print(f"{passed} passed, {failed} failed")
    sys.stdout.flush()
    if not cases:
        return 2
    return 1 if failed else 0


# --- pytest plugin ----------------------------------------------------------------

try:
    import pytest
except ImportError:  # pragma: no cover - pytest is optional at run time
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    class ReplayFailure(Exception):
        """A recorded run no longer replays."""

    class RecordedRunItem(pytest.Item):  # type: ignore[misc]
        def __init__(self, *, case: CaseResult | None = None, run_id: str, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.run_id = run_id

        def runtest(self) -> None:
            for case in replay_file(self.path):
                if case.run_id == self.run_id and not case.ok:
                    why = case.error or (
                        case.result.divergence.format()
                        if case.result and case.result.divergence
                        else ""
                    )
                    raise ReplayFailure(why)

        def repr_failure(self, excinfo: Any, style: Any = None) -> str:
            if isinstance(excinfo.value, ReplayFailure):
                return f"recorded run {self.run_id} diverged:\n{excinfo.value}"
            return str(super().repr_failure(excinfo))

        def reportinfo(self) -> tuple[Any, int, str]:
            return self.path, 0, f"recorded run {self.run_id}"

    class RecordedRunFile(pytest.File):  # type: ignore[misc]
        def collect(self) -> Any:
            from graphrun.runtime.transfer import read_header

            header = read_header(self.path)
            for run_id in header.get("runs", [])[:1]:
                yield RecordedRunItem.from_parent(self, name=f"replay[{run_id}]", run_id=run_id)

    def pytest_collect_file(parent: Any, file_path: Path) -> Any:
        if file_path.name.endswith(".run.jsonl"):
            return RecordedRunFile.from_parent(parent, path=file_path)
        return None


__all__ = ["CaseResult", "Event", "fold", "replay_file", "run_suite"]
