"""The store failing under a running effect (the database away for a moment, the run's
lease gone) stops the run where its log says, resumable: it is never recorded as the
node's failure, and nothing the run started goes on running behind it.

The store is a real SQLite file; the outage is one refused call, made by the test
through a subclass (a PostgreSQL restart under workers is in tests/postgres)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from graphrun.eventstore.errors import StoreUnreachableError
from graphrun.eventstore.events import LlmCalled
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine import driver as driver_module
from graphrun.runtime.engine.driver import Driver, RunOptions, drive, start_run
from graphrun.runtime.graph.loader import load_graph
from tests.integration.test_durable_effects import GRAPH as TOOL_GRAPH
from tests.integration.test_durable_effects import TOOLS_SH
from tests.integration.test_timeouts import wait_gone
from tests.support.fake_llm import text, tool_calls

NAP = {
    "scripts/nap.sh": """
        sleep "${NAP:-30}" &
        echo $! >> "$PIDS"
        echo $$ >> "$PIDS"
        wait
        echo '{"napped": true}'
    """,
    "scripts/quick.sh": """
        echo $$ >> "$QUICK"
        echo '{"quick": true}'
    """,
}

ONE = """
name: one-nap
version: "1.0"
start: nap
nodes:
  nap: {type: script, script: scripts/nap.sh, next: done}
  done: {type: end, output: "napped={{napped}}"}
"""

FAN = """
name: two-naps
version: "1.0"
start: go
reducers:
  napped: overwrite
nodes:
  go: {type: script, script: scripts/quick.sh, next: [left, right]}
  left: {type: script, script: scripts/nap.sh, next: done}
  right: {type: script, script: scripts/nap.sh, next: done}
  done: {type: end, output: "napped={{napped}}"}
"""


class FlakyStore(SqliteStore):
    """A SQLite store whose next ``renew_lease`` (or append of an ``LlmCalled``)
    fails as an unreachable database does, once."""

    def __init__(self, path: Path, *, renew: bool = False, checkpoint: bool = False) -> None:
        super().__init__(path)
        self.fail_renew = renew
        self.fail_checkpoint = checkpoint

    def renew_lease(self, run_id: str, **kw: Any) -> None:
        if self.fail_renew:
            self.fail_renew = False
            time.sleep(0.3)  # the database answers nothing for a while
            raise StoreUnreachableError("PostgreSQL db: connection refused")
        super().renew_lease(run_id, **kw)

    def append(self, run_id: str, events: Any, **kw: Any) -> Any:
        if self.fail_checkpoint and any(isinstance(e, LlmCalled) for e in events):
            self.fail_checkpoint = False
            raise StoreUnreachableError("PostgreSQL db: connection refused")
        return super().append(run_id, events, **kw)


def types(store: SqliteStore, run_id: str) -> list[str]:
    return [type(e).__name__ for e in store.read(run_id)]


def pids(path: Path, count: int, within: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().split()) >= count:
            return [int(p) for p in path.read_text().split()]
        time.sleep(0.02)
    raise AssertionError(f"{count} pids in {path} within {within}s")


@pytest.fixture
def renew_often(monkeypatch: pytest.MonkeyPatch) -> None:
    # The driver renews the run's lease every 10 s while an effect runs: sooner here.
    monkeypatch.setattr(driver_module, "_LEASE_RENEW_EVERY", 0.5)


@pytest.mark.parametrize("graph", [ONE, FAN], ids=["one-node", "fan-out"])
def test_a_lease_renewal_the_store_refuses_is_not_the_nodes_failure(
    tmp_path: Path, agent: Any, monkeypatch: pytest.MonkeyPatch, renew_often: None, graph: str
) -> None:
    root = agent(graph, NAP)
    monkeypatch.setenv("PIDS", str(tmp_path / "pids"))
    monkeypatch.setenv("QUICK", str(tmp_path / "quick"))
    store = FlakyStore(tmp_path / "events.db", renew=True)
    run_id = start_run(store, load_graph(root))
    with pytest.raises(StoreUnreachableError):
        drive(Driver(store, run_id, RunOptions()))
    # Stopped, not failed: no NodeFailed, no RunFailed; the scripts (and their
    # children) it had started are gone.
    recorded = types(store, run_id)
    assert "RunFailed" not in recorded and "NodeFailed" not in recorded, recorded
    started = pids(tmp_path / "pids", 2 if graph == ONE else 4)
    assert all(wait_gone(pid) for pid in started), started
    # The database is back: the run resumes and completes.
    (tmp_path / "pids").unlink()
    monkeypatch.setattr(driver_module, "_LEASE_RENEW_EVERY", 10.0)
    monkeypatch.setenv("NAP", "0")
    outcome = drive(Driver(store, run_id, RunOptions(), resumed_by="test"))
    assert (outcome.status, outcome.output) == ("completed", "napped=true"), outcome
    recorded = types(store, run_id)
    assert recorded.count("RunCompleted") == 1 and "RunFailed" not in recorded
    assert store.verify(run_id) is None
    store.close()


def test_a_checkpoint_the_store_refuses_inside_an_effect_is_not_the_nodes_failure(
    tmp_path: Path, agent: Any, fake_llm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = agent(TOOL_GRAPH, {"tools.sh": TOOLS_SH})
    marks = tmp_path / "marks"
    monkeypatch.setenv("OPENAI_BASE_URL", fake_llm.url_openai)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    monkeypatch.setenv("MARKS", str(marks))
    fake_llm.script(tool_calls(("mark", {"name": "first"})), text("all marked"))
    # The tool loop commits the model's turn before it runs the tool: that commit fails.
    store = FlakyStore(tmp_path / "events.db", checkpoint=True)
    run_id = start_run(store, load_graph(root))
    with pytest.raises(StoreUnreachableError):
        drive(Driver(store, run_id, RunOptions()))
    recorded = types(store, run_id)
    assert "RunFailed" not in recorded and "NodeFailed" not in recorded, recorded
    assert not marks.exists()  # the tool did not run on an uncommitted turn
    fake_llm.reset()
    fake_llm.script(tool_calls(("mark", {"name": "first"})), text("all marked"))
    outcome = drive(Driver(store, run_id, RunOptions(), resumed_by="test"))
    assert (outcome.status, outcome.output) == ("completed", "all marked")
    assert marks.read_text().split() == ["first"]
    assert types(store, run_id).count("RunCompleted") == 1
    store.close()
