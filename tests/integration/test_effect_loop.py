"""Every effect is awaited on the run's event loop: a map of script nodes has its
processes running at once, watched from that loop, with no thread per process;
the loop goes when the run does."""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine.driver import Driver, RunOptions, drive, start_run
from graphrun.runtime.graph.loader import load_graph

MAP = """\
name: sleepers
version: "1.0"
start: m
initial_state: {{items: {items}}}
nodes:
  m:
    type: map
    over: "{{{{items}}}}"
    as: item
    branch: nap
    collect_into: napped
    max_concurrency: {cap}
    next: done
  nap:
    type: script
    script: nap.sh
    state_updates: {{}}
  done:
    type: end
    output: "{{{{napped}}}}"
"""
# Each branch waits until all of them are running (or 20 s pass), then answers.
NAP = """\
#!/bin/bash
item=$(printf '%s' "$GRAPH_STATE" | sed -n 's/.*"item":\\([0-9]*\\).*/\\1/p')
touch "$GATE/$item"
for _ in $(seq 200); do
  [ "$(ls "$GATE" | wc -l)" -ge "$PARTIES" ] && break
  sleep 0.1
done
printf '{"output": %s}\\n' "$item"
"""


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "events.db")
    yield s
    s.close()


def test_a_map_of_scripts_runs_them_at_once_on_the_loop(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = list(range(6))
    root = tmp_path / "sleepers"
    root.mkdir()
    (root / "graph.yaml").write_text(MAP.format(items=json.dumps(items), cap=6))
    (root / "nap.sh").write_text(textwrap.dedent(NAP))
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv("GATE", str(gate))
    monkeypatch.setenv("PARTIES", "6")
    run_id = start_run(store, load_graph(root), prompt="go")
    outcome: list[object] = []
    driver = Driver(store, run_id, RunOptions())
    runner = threading.Thread(target=lambda: outcome.append(drive(driver)))
    started = time.monotonic()
    runner.start()
    seen: set[str] = set()
    while runner.is_alive():
        seen |= {t.name for t in threading.enumerate()}
        time.sleep(0.02)
    runner.join()
    elapsed = time.monotonic() - started
    result = outcome[0]
    assert getattr(result, "status", None) == "completed", result
    assert json.loads(getattr(result, "output", "")) == items
    # All six were running together (each waited for the others to start).
    assert len(list(gate.iterdir())) == 6 and elapsed < 15
    # Watched from the run's loop: no executor thread was needed for any of them.
    assert f"graphrun-loop-{run_id[:8]}" in seen
    assert not [name for name in seen if name.startswith(f"graphrun-{run_id[:8]}")]
    # The run's loop ended with it.
    assert f"graphrun-loop-{run_id[:8]}" not in {t.name for t in threading.enumerate()}
