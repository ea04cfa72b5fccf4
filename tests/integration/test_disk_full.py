"""A disk that fills up mid-run: a one-line error (never an internal error), the log
consistent, and the run resumes once there is space again.

The database lives on a small tmpfs mounted for the test, so this needs root (and a
system that lets root mount); otherwise it is skipped, saying why.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FILLER = """\
name: filler
version: "1.0"
settings:
  max_loop_iterations: 100
start: fill
initial_state:
  n: 0
nodes:
  fill:
    type: script
    script: scripts/fill.py
    next: done
  done:
    type: end
    output: "n={{n}}"
"""

# Each visit records ~8 KB of incompressible output: 40 visits do not fit in 512 KiB.
FILL_PY = """\
import json, os
state = json.loads(os.environ.get("GRAPH_STATE") or open(os.environ["GRAPH_STATE_FILE"]).read())
n = state["n"] + 1
print(json.dumps({"n": n, "blob": os.urandom(4000).hex(), "_next": "fill" if n < 40 else "done"}))
"""


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    where = tmp_path / "small"
    where.mkdir()
    mounted = _mount("-t", "tmpfs", "-o", "size=512k", "tmpfs", str(where))
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def test_a_full_disk_is_a_one_line_error_and_the_run_resumes(
    graphrun: Any, agent: Any, small_disk: Path
) -> None:
    root = agent(FILLER, {"scripts/fill.py": FILL_PY})
    db = str(small_disk / "events.db")

    full = graphrun("run", str(root), "--db", db)
    assert full.code != 0, "the disk did not fill up"
    last = full.stderr.strip().splitlines()[-1]
    assert "Traceback" not in full.stderr

    # Space again: the run goes on from its log and ends as it would have.
    assert _mount("-o", "remount,size=32m", str(small_disk)).returncode == 0
    (row,) = graphrun("runs", "--json", "--db", db).json_lines()
    run_id = row["run_id"]  # type: ignore[index]
    assert row["status"] in ("running", "interrupted", "failed"), row  # type: ignore[index]
    assert graphrun("audit", run_id, "--verify", "--db", db).code == 0
    resumed = graphrun("resume", run_id, "--db", db)
    assert resumed.code == 0, resumed.stderr
    assert resumed.stdout == "n=40\n"
    assert graphrun("audit", run_id, "--verify", "--db", db).code == 0

    assert full.code not in (0, 70), full.stderr
    assert last.startswith("error: ") and "internal error" not in last, last
    assert "full" in last, last
