"""A worker taking over a killed worker's run first ends what it left running: the
script in flight (and its own child) never runs beside the node performed again."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import write_agent
from tests.postgres.test_workers import cli, setup, store_of, wait_for, worker  # noqa: F401
from tests.support.pg import PgServer, pg_server, pg_url  # noqa: F401  (fixtures)

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="Linux: /proc")

SLOW = """
    name: slow
    version: "1.0"
    start: work
    nodes:
      work:
        type: script
        script: work.sh
        next: done
      done:
        type: end
        output: "{{n}}"
"""

# The first attempt works for minutes (with a child of its own); a later one checks
# that nothing the first started still runs, then ends at once.
WORK_SH = """
    marks="$MARKERS/work"
    if [ -s "$marks" ]; then
      for pid in $(awk '{print $2}' "$marks"); do
        state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)  # a zombie is dead
        if [ -n "$state" ] && [ "$state" != Z ]; then echo "beside $pid" >> "$marks"; fi
      done
      echo "again $$" >> "$marks"
      echo '{"n": 2}'
      exit 0
    fi
    echo "start $$" >> "$marks"
    sleep 300 &
    echo "child $!" >> "$marks"
    sleep 300
    echo '{"n": 1}'
"""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(240)
def test_a_worker_taking_over_ends_the_orphans_first(setup: dict[str, Any]) -> None:  # noqa: F811
    ctx = setup
    agent = write_agent(ctx["tmp"] / "slow", SLOW, {"work.sh": WORK_SH})
    submitted = cli(ctx, "submit", str(agent), "go")
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    marks: Path = ctx["markers"] / "work"
    first = worker(ctx, "--lease", "3")
    wait_for(lambda: marks.exists() and "child" in marks.read_text(), 60, "the script")
    started = [int(line.split()[1]) for line in marks.read_text().splitlines()]
    # The worker and its lifeline die together: nothing ends the script for them.
    for child in psutil.Process(first.pid).children():
        if "lifeline" in " ".join(child.cmdline()):
            child.kill()
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    time.sleep(0.5)
    assert all(alive(pid) for pid in started)
    second = worker(ctx, "--lease", "3", "--once")
    assert second.wait(120) == 0
    assert not any(alive(pid) for pid in started)
    text = marks.read_text()
    assert "beside" not in text and "again" in text, text
    with store_of(ctx) as store:
        assert store.run(run_id).status == "completed"
        assert store.run(run_id).output == "2"
