"""Workers load graphs in several threads at once: that must never crash.

msgspec builds a type's converter on first use, and two threads doing it at once
for the same type can crash the process (a segmentation fault in about one start
in four of the script below without the preparation). ``prepare_graph_types``,
which a worker runs before its slots start, builds them first.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
GRAPH = ROOT / "examples" / "ticket-triage" / "graph.yaml"

SCRIPT = f"""
import threading
from pathlib import Path
from graphrun.runtime.graph.loader import load_text
from graphrun.runtime.engine.workers import prepare_graph_types

prepare_graph_types()
source = Path({str(GRAPH)!r}).read_text()
barrier = threading.Barrier(8)

def load():
    barrier.wait()
    load_text(source, path=Path({str(GRAPH)!r}), agent_dir=Path({str(GRAPH.parent)!r}))

threads = [threading.Thread(target=load) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("ok")
"""


@pytest.mark.timeout(240)
def test_eight_threads_loading_one_graph_after_preparation() -> None:
    for _ in range(12):
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60
        )
        assert (proc.returncode, proc.stdout.strip()) == (0, "ok"), proc.stderr[-2000:]
