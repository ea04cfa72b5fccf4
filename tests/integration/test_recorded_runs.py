"""Recorded runs as regression tests: portable files, pytest ids, agent directories.

* The recordings shipped in ``replays/`` (other than the deliberately old
  ``format-v1*``) carry no absolute path, host name, OS account or pid.
* The pytest plugin names an item ``<file stem>[<graph>]`` and plain ``pytest`` in
  this repository collects ``replays/``.
* An export whose agent directory does not resolve fails, naming the file and the
  path: it never passes against the absolute directory recorded elsewhere.
"""

from __future__ import annotations

import getpass
import json
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, write_agent
from tests.integration.test_human_nodes import APPROVAL, DRAFT

pytest_plugins = ["pytester"]

REPLAYS = ROOT / "replays"
#: The deliberately old-format recordings: kept exactly as they were written.
OLD_FORMAT = "format-v1"

COUNT = """
version: "1.0"
name: count
start: count
nodes:
  count:
    type: script
    script: scripts/count.sh
    next: done
  done:
    type: end
    output: "{{words}} words"
"""
COUNT_FILES = {
    "scripts/count.sh": """
        #!/bin/sh
        echo "{\\"words\\": $(echo "$GRAPH_STATE" | wc -c)}"
    """
}


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _strings(value: Any) -> list[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _origin_problems(path: Path) -> list[str]:
    """What in an export file says where, by whom or by which process it was made."""
    records = _records(path)
    problems = []
    if records[0].get("origin") != "omitted":
        problems.append("the header does not say origin: omitted")
    accounts = {getpass.getuser(), "root"}
    absolute = re.compile(r"(^|[\s\"'(=:,])/(work|root|home|tmp|Users|var|opt|srv|mnt)/")
    for number, record in enumerate(records, 1):
        for text in _strings(record):
            if text.startswith("/") or absolute.search(text):
                problems.append(f"line {number}: absolute path in {text[:80]!r}")
        event = record.get("event")
        if not isinstance(event, dict):
            continue
        for name in ("host", "os_user", "pid"):
            if name in event:
                problems.append(f"line {number}: {event['type']}.{name}")
        for name in ("started_by", "by"):
            if event.get(name) in accounts or str(event.get(name, "")).startswith("uid:"):
                problems.append(f"line {number}: {event['type']}.{name} is an OS account")
        if event.get("host") == socket.gethostname():
            problems.append(f"line {number}: the host name")
        config = event.get("config") or {}
        for name in ("config_dir", "agents_dir", "loki_dir"):
            if str(config.get(name, "")).startswith("/"):
                problems.append(f"line {number}: config.{name} is absolute")
    return problems


def _shipped() -> list[Path]:
    return sorted(p for p in REPLAYS.glob("*.run.jsonl") if not p.name.startswith(OLD_FORMAT))


# -- the shipped recordings ------------------------------------------------------------


@pytest.mark.parametrize("path", _shipped(), ids=lambda p: p.name)
def test_a_shipped_recording_carries_no_origin(path: Path) -> None:
    assert _origin_problems(path) == []
    header = _records(path)[0]
    assert header["version"] == 2
    for rel in header["agent_dirs"].values():
        assert not rel.startswith("/") and (REPLAYS / rel).is_dir(), rel


def test_the_origin_check_catches_an_old_format_recording() -> None:
    # The check is not blind: the old-format file kept as it was written fails it.
    problems = _origin_problems(REPLAYS / f"{OLD_FORMAT}.run.jsonl")
    assert any("RunStarted.host" in p for p in problems), problems
    assert any("absolute path" in p for p in problems), problems
    assert len(_shipped()) >= 6


# -- what an export leaves out -----------------------------------------------------------


def test_an_answer_without_as_and_a_home_config_dir_are_left_out(graphrun, tmp_path) -> None:
    project = tmp_path / "project"
    gate = write_agent(project / "agents" / "gate", APPROVAL, DRAFT)
    (gate / "scripts" / "draft.sh").chmod(0o755)
    (project / "config").mkdir()
    # The OS account answers (no --as); the config dir is the user's (outside the project).
    assert graphrun("run", str(gate), "--answer", "review=approve").code == 0
    run_id = graphrun.last_run()
    out = project / "replays" / "gate.run.jsonl"
    assert graphrun("export", run_id, "-o", str(out)).code == 0
    assert _origin_problems(out) == []
    events = [r["event"] for r in _records(out)[1:-1]]
    started, answer = events[0], next(e for e in events if e["type"] == "HumanInputReceived")
    assert "config_dir" not in started["config"] and "agents_dir" not in started["config"]
    assert answer["by"] == "" and answer["answer"] == "approve"
    # The same run, as far as import is concerned; and it replays.
    assert graphrun("import", str(out)).stdout == f"present: {run_id}\n"
    assert graphrun("test", str(out)).code == 0
    # A config dir inside the project stays, relative to the file.
    res = graphrun("run", str(gate), "--config-dir", str(project / "config"), "--as", "ann")
    assert res.code == 3, res.stderr
    waiting = graphrun.last_run()
    out = project / "replays" / "waiting.run.jsonl"
    assert graphrun("export", waiting, "-o", str(out)).code == 0
    started = _records(out)[1]["event"]
    assert started["config"]["config_dir"] == "../config"
    assert started["started_by"] == "ann"


# -- pytest ids and collection ------------------------------------------------------------


def _project(graphrun, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    """A project with the count agent and two recordings: one run, and two runs of
    the same graph in one file."""
    project = tmp_path / "project"
    agent_dir = write_agent(project / "agents" / "count", COUNT, COUNT_FILES)
    (agent_dir / "scripts" / "count.sh").chmod(0o755)
    replays = project / "replays"
    files = []
    for prompt in ("one", "two words", "three more words"):
        assert graphrun("run", str(agent_dir), prompt).code == 0
        out = replays / f"{len(files)}.part"
        assert graphrun("export", graphrun.last_run(), "-o", str(out)).code == 0
        files.append(out)
    shutil.move(str(files[0]), str(replays / "single.run.jsonl"))
    # Two exports made one file: the runs, their event lines as written, both trailers.
    first, second = (part.read_text(encoding="utf-8").splitlines() for part in files[1:])
    header, tail = json.loads(first[0]), json.loads(second[0])
    header["runs"] += tail["runs"]
    header["agent_dirs"].update(tail["agent_dirs"])
    counts = {
        **json.loads(first[-1])["trailer"]["runs"],
        **json.loads(second[-1])["trailer"]["runs"],
    }
    lines = [
        json.dumps(header),
        *first[1:-1],
        *second[1:-1],
        json.dumps({"trailer": {"runs": counts}}),
    ]
    (replays / "twice.run.jsonl").write_text("".join(line + "\n" for line in lines))
    for part in files[1:]:
        part.unlink()
    return project


def test_pytest_items_are_named_by_file_and_graph(graphrun, tmp_path, pytester) -> None:  # type: ignore[no-untyped-def]
    project = _project(graphrun, tmp_path)
    shutil.copytree(project / "agents", pytester.path / "agents")
    shutil.copytree(project / "replays", pytester.path / "replays")
    twice = _records(pytester.path / "replays" / "twice.run.jsonl")[0]["runs"]
    result = pytester.runpytest("-p", "no:cacheprovider", "replays", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines_random(
        [
            "*replays/single.run.jsonl::single[[]count[]] PASSED*",
            "*replays/twice.run.jsonl::twice[[]count[]] PASSED*",
            "*replays/twice.run.jsonl::twice[[]count-2[]] PASSED*",
        ]
    )
    # The ids follow the file's order of runs, so they are the same on every machine;
    # `-k` picks one run of a file.
    result = pytester.runpytest("-p", "no:cacheprovider", "replays", "-k", "count-2", "-v")
    result.assert_outcomes(passed=1)
    # The second run is the one a failure reports under count-2.
    graph = pytester.path / "agents" / "count" / "graph.yaml"
    graph.write_text(graph.read_text().replace("{{words}} words", "{{words}} word(s)"))
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "replays/twice.run.jsonl", "-k", "count-2"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*recorded run {twice[1]} diverged*"])


def test_plain_pytest_collects_the_shipped_recordings() -> None:
    # pytest with no path collects the configured testpaths.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    items = [line for line in done.stdout.splitlines() if line.startswith("replays/")]
    assert sorted(items) == sorted(
        f"replays/{p.name}::{p.name.removesuffix('.run.jsonl')}[{name}]"
        for p, name in [
            *((p, p.name.removesuffix(".run.jsonl")) for p in _shipped()),
            (REPLAYS / f"{OLD_FORMAT}.run.jsonl", OLD_FORMAT),
        ]
    )


# -- a missing agent directory ------------------------------------------------------------


@pytest.mark.parametrize("origin", [False, True], ids=["portable", "with-origin"])
def test_an_agent_directory_that_does_not_resolve_fails_the_run(
    graphrun, tmp_path: Path, origin: bool, pytester
) -> None:  # type: ignore[no-untyped-def]
    project = _project(graphrun, tmp_path)
    single = project / "replays" / "single.run.jsonl"
    if origin:
        # With --with-origin the log records the agent's absolute directory, which
        # exists: the file must still not pass against it from elsewhere.
        run_id = _records(single)[0]["runs"][0]
        assert graphrun("export", run_id, "-o", str(single), "--with-origin").code == 0
        assert Path(_records(single)[1]["event"]["agent_dir"]).is_dir()
    assert graphrun("test", str(single)).code == 0
    moved = project / "elsewhere" / "deeper" / "single.run.jsonl"
    moved.parent.mkdir(parents=True)
    shutil.copy(single, moved)
    res = graphrun("test", str(moved))
    assert res.code == 1, res.stdout
    (line,) = [ln for ln in res.stdout.splitlines() if ln.startswith("FAIL")]
    missing = project / "elsewhere" / "agents" / "count"
    assert f"{moved}: agent directory ../agents/count of run" in line
    assert f"not found: no directory {missing}" in line
    assert res.stdout.endswith("0 passed, 1 failed\n")
    # --update cannot re-record it either, and says why (the file is left as it is).
    before = moved.read_bytes()
    res = graphrun("test", "--update", str(moved))
    assert res.code == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert "agent directory ../agents/count of run" in res.stdout + res.stderr
    assert moved.read_bytes() == before
    # The pytest plugin fails the item with the same message.
    shutil.copytree(project / "elsewhere", pytester.path / "elsewhere")
    result = pytester.runpytest("-p", "no:cacheprovider", "elsewhere")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*agent directory ../agents/count of run * not found*"])


# -- importing a portable file ------------------------------------------------------------


def test_an_imported_run_forks_with_the_scripts_next_to_the_file(graphrun, tmp_path) -> None:  # type: ignore[no-untyped-def]
    project = _project(graphrun, tmp_path)
    # Another checkout of the project, whose script says something else.
    other = tmp_path / "other-checkout"
    shutil.copytree(project, other)
    script = other / "agents" / "count" / "scripts" / "count.sh"
    script.write_text('#!/bin/sh\necho \'{"words": "elsewhere"}\'\n')
    fresh = str(tmp_path / "fresh.db")
    res = graphrun("import", str(other / "replays" / "single.run.jsonl"), "--db", fresh)
    assert res.code == 0, res.stderr
    run_id = res.stdout.split(": ")[1].strip()
    started = graphrun("events", run_id, "--json", "--db", fresh).json_lines()[0]
    assert started["agent_dir"] == str(other / "agents" / "count")  # type: ignore[index]
    forked = graphrun("fork", run_id, "--at", "1", "--db", fresh)
    assert forked.code == 0, forked.stderr
    assert forked.stdout == "elsewhere words\n"
    # Exported again, the paths are relative to the new file; the run is the same.
    again = tmp_path / "again" / "single.run.jsonl"
    assert graphrun("export", run_id, "-o", str(again), "--db", fresh).code == 0
    assert _records(again)[1]["event"]["agent_dir"] == "../other-checkout/agents/count"
    assert graphrun("import", str(again), "--db", fresh).stdout == f"present: {run_id}\n"
