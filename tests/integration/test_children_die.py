"""Children die with graphrun: ``kill -9`` of graphrun while scripts run (each with
a child of its own, in a parallel step) leaves no process behind, and ``resume``
never performs a node beside what a killed graphrun left running."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="Linux: /proc")

FAN = """
name: fan
version: "1.0"
start: fan
settings: {max_concurrency: 4}
reducers: {done: append}
nodes:
  fan: {type: script, script: scripts/fan.py, next: [a, b]}
  a: {type: script, script: scripts/work.sh, state_updates: {}, next: join}
  b: {type: script, script: scripts/work.sh, state_updates: {}, next: join}
  join: {type: end, output: "{{done}}"}
"""

# Each branch checks that no process a former attempt started is still alive (it
# would run beside it), notes its pid and its child's, then works.
WORK_SH = """\
for pid in $(awk -v now="$ATTEMPT" '$3 != now {print $2}' "$MARKS" 2>/dev/null); do
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)  # a zombie is dead
  if [ -n "$state" ] && [ "$state" != Z ]; then echo "beside $pid $ATTEMPT" >> "$MARKS"; fi
done
echo "start $$ $ATTEMPT" >> "$MARKS"
sleep 300 &
echo "child $! $ATTEMPT" >> "$MARKS"
sleep "$WORK_SECONDS"
echo "end $$ $ATTEMPT" >> "$MARKS"
echo '{"done": ["ok"]}'
"""


def wait_for(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def marked(marks: Path, kind: str) -> list[int]:
    if not marks.exists():
        return []
    rows = (line.split() for line in marks.read_text().splitlines())
    return [int(row[1]) for row in rows if row[0] == kind]


def running(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def start_and_kill(
    graphrun: Any, agent: Any, tmp_path: Path, *, lifeline_too: bool
) -> tuple[Path, list[int]]:
    root = agent(FAN, {"scripts/fan.py": "print('{}')\n", "scripts/work.sh": WORK_SH})
    marks = tmp_path / "marks"
    proc = graphrun.popen("run", str(root), MARKS=str(marks), WORK_SECONDS="300", ATTEMPT="1")
    try:
        wait_for(lambda: len(marked(marks, "child")) == 2)
        started = marked(marks, "start") + marked(marks, "child")
        assert len(running(started)) == 4
        if lifeline_too:  # as if both were killed at once (an OOM kill, a kill -9 of both)
            lifelines = [
                c
                for c in psutil.Process(proc.pid).children()
                if "lifeline" in " ".join(c.cmdline())
            ]
            for lifeline in lifelines:
                lifeline.kill()
            wait_for(lambda: not running([c.pid for c in lifelines]))
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
    return marks, started


def test_kill_9_leaves_no_process_behind(graphrun: Any, agent: Any, tmp_path: Path) -> None:
    marks, started = start_and_kill(graphrun, agent, tmp_path, lifeline_too=False)
    wait_for(lambda: not running(started), timeout=10)
    assert marked(marks, "end") == []  # killed, not finished


def test_resume_ends_what_a_killed_graphrun_left_before_performing_again(
    graphrun: Any, agent: Any, tmp_path: Path
) -> None:
    marks, started = start_and_kill(graphrun, agent, tmp_path, lifeline_too=True)
    time.sleep(0.5)
    assert len(running(started)) == 4  # nothing ended them: the orphans run on
    res = graphrun("resume", graphrun.last_run(), MARKS=str(marks), WORK_SECONDS="0", ATTEMPT="2")
    assert res.code == 0, res.stderr
    assert res.stdout.count('"ok"') == 2, res.stdout
    assert running(started) == []
    assert "beside" not in marks.read_text(), marks.read_text()
    assert set(marked(marks, "end")).isdisjoint(started)  # the orphans never finished
