"""The runtime pins itself to one CPU under SCHED_BATCH (as the CLI does for a run);
what it spawns gets every CPU and the normal policy back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux scheduling calls and at least two CPUs",
)

PROBE = textwrap.dedent(
    """
    import json, os, sys, threading
    from pathlib import Path
    from graphrun.actors.base import ListContext, confine_to_one_cpu
    from graphrun.actors.messages import ScriptTask
    from graphrun.actors.script import run_script

    before = sorted(os.sched_getaffinity(0))
    assert confine_to_one_cpu()
    seen = {}

    def in_thread():
        seen["thread"] = (len(os.sched_getaffinity(0)), os.sched_getscheduler(0))

    worker = threading.Thread(target=in_thread)
    worker.start()
    worker.join()
    ctx = ListContext(agent_dir=Path(sys.argv[1]))
    run_script(ScriptTask("probe", 1, "probe.py", 30.0, "{}"), ctx)
    (finished,) = ctx.events
    print(json.dumps({
        "before": before,
        "runtime": [len(os.sched_getaffinity(0)), os.sched_getscheduler(0)],
        "thread": list(seen["thread"]),
        "script": finished.output,
        "batch": os.SCHED_BATCH,
        "other": os.SCHED_OTHER,
    }))
    """
)

SCRIPT = textwrap.dedent(
    """
    import json, os
    print(json.dumps({"cpus": sorted(os.sched_getaffinity(0)), "policy": os.sched_getscheduler(0)}))
    """
)


def test_the_runtime_is_pinned_and_batched_and_scripts_are_not(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(SCRIPT, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "GRAPHRUN_NO_PIN"},
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["runtime"] == [1, seen["batch"]]
    assert seen["thread"] == [1, seen["batch"]]  # actor threads inherit both
    assert seen["script"] == {"cpus": seen["before"], "policy": seen["other"]}
