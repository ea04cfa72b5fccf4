"""MCP tool calls awaited on the run's own event loop.

A run's MCP sessions live on its :class:`~graphrun.actors.loop.EffectLoop`: an llm
node's tool loop and a ``tool`` node await their calls there (no "graphrun-mcp"
loop thread, no executor thread waiting), branches calling at once overlap on the
one session, timeouts and cancellation answer as the blocking path does, and the
server processes stop when the loop does. The server is a real child process
(tests/support/mcp_server.py) spoken to over stdio; the model is a real HTTP server
on 127.0.0.1 (tests/support/fake_llm.py).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from graphrun.actors.base import CancelToken
from graphrun.actors.loop import EffectLoop
from graphrun.actors.tools.mcp import McpError, McpHub, default_hub
from graphrun.actors.tools.toolbox import load_toolbox
from graphrun.eventstore.events import ToolCalled, ToolFinished
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine.driver import Driver, RunOptions, RunOutcome, drive, start_run
from graphrun.runtime.graph.loader import load_graph
from tests.conftest import ROOT, GraphrunCli
from tests.support.fake_llm import FakeLlm, RecordedRequest, Reply, text, tool_calls

SERVER = str(ROOT / "tests" / "support" / "mcp_server.py")

MAP = """\
name: mcp-fan
version: "1.0"
model: openai:gpt-test
mcp_servers: [calc]
start: fan
initial_state:
  items: {items}
nodes:
  fan:
    type: map
    over: "{{{{items}}}}"
    as: item
    branch: ask
    collect_into: answers
    max_concurrency: {cap}
    next: done
  ask:
    type: llm
    prompt: "item {{{{item}}}}"
    tools: [mcp:calc]
  done:
    type: end
    output: "{{{{answers}}}}"
"""

TOOL_NODE = """\
name: mcp-tool
version: "1.0"
mcp_servers: [calc]
start: add
nodes:
  add:
    type: tool
    tool: mcp:calc/add
    params: {a: 40, b: 2}
    state_updates:
      sum: "{{output}}"
    next: done
  done:
    type: end
    output: "{{sum}}"
"""


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_gone(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def write_config(config_dir: Path) -> Path:
    functions = config_dir / "functions"
    functions.mkdir(parents=True, exist_ok=True)
    server = {"command": sys.executable, "args": [SERVER]}
    (functions / "mcp.json").write_text(json.dumps({"mcpServers": {"calc": server}}))
    return config_dir


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "events.db")
    yield s
    s.close()


@pytest.fixture
def llm(fake_llm: FakeLlm, monkeypatch: pytest.MonkeyPatch) -> FakeLlm:
    monkeypatch.setenv("OPENAI_BASE_URL", fake_llm.url_openai)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    return fake_llm


class Calls:
    """Where and how many of the hub's MCP calls ran at once (wrapping ``_call``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.threads: list[str] = []
        self.in_flight = 0
        self.most = 0
        self.lock = threading.Lock()
        original = McpHub._call

        async def recording(hub: McpHub, server: str, name: str, arguments: Any) -> Any:
            with self.lock:
                self.threads.append(threading.current_thread().name)
                self.in_flight += 1
                self.most = max(self.most, self.in_flight)
            try:
                return await original(hub, server, name, arguments)
            finally:
                with self.lock:
                    self.in_flight -= 1

        monkeypatch.setattr(McpHub, "_call", recording)
        self.blocking = 0  # calls made through the blocking API (a thread waiting)
        blocking = McpHub.call_tool

        def counted(hub: McpHub, *args: Any, **kwargs: Any) -> Any:
            self.blocking += 1
            return blocking(hub, *args, **kwargs)

        monkeypatch.setattr(McpHub, "call_tool", counted)


def ask_for_process_info(delay: float) -> Any:
    """The model: asks for ``calc_process_info`` once, then answers with its result."""

    def answer(request: RecordedRequest) -> Reply:
        results = [m for m in request.body["messages"] if m["role"] == "tool"]
        if not results:
            return tool_calls(("calc_process_info", {"delay": delay}))
        return text(results[-1]["content"])

    return answer


def map_agent(tmp_path: Path, items: int, cap: int, tools: str = "[mcp:calc]") -> Path:
    root = tmp_path / "agent"
    root.mkdir(exist_ok=True)
    graph = MAP.format(items=json.dumps(list(range(items))), cap=cap)
    (root / "graph.yaml").write_text(graph.replace("[mcp:calc]", tools))
    return root


def drive_watching(store: SqliteStore, run_id: str, options: RunOptions) -> tuple[Any, set[str]]:
    """Drive the run on a thread; the outcome and every thread name seen meanwhile."""
    outcome: list[RunOutcome] = []
    runner = threading.Thread(target=lambda: outcome.append(drive(Driver(store, run_id, options))))
    runner.start()
    seen: set[str] = set()
    while runner.is_alive():
        seen |= {t.name for t in threading.enumerate()}
        time.sleep(0.02)
    runner.join()
    return outcome[0], seen


def server_pids(store: SqliteStore, run_id: str) -> set[int]:
    called = [e for e in store.read(run_id) if isinstance(e, ToolCalled)]
    assert called and not any(e.is_error for e in called), called
    return {json.loads(e.result)["pid"] for e in called}


def test_an_llm_tool_loop_awaits_its_mcp_call_on_the_runs_loop(
    store: SqliteStore, llm: FakeLlm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_dir = write_config(tmp_path / "_config")
    calls = Calls(monkeypatch)
    llm.default = ask_for_process_info(0.5)
    run_id = start_run(store, load_graph(map_agent(tmp_path, 1, 1)), prompt="go")

    outcome, seen = drive_watching(store, run_id, RunOptions(config_dir=config_dir))

    assert outcome.status == "completed", outcome
    # The call ran on the run's loop thread; no MCP loop thread existed meanwhile.
    assert calls.threads == [f"graphrun-loop-{run_id[:8]}"]
    assert calls.blocking == 0  # awaited, not waited for by an executor thread
    assert "graphrun-mcp" not in seen
    assert f"graphrun-loop-{run_id[:8]}" in seen
    # The server's process ended with the run's loop.
    [pid] = server_pids(store, run_id)
    assert wait_gone(pid)
    assert f"graphrun-loop-{run_id[:8]}" not in {t.name for t in threading.enumerate()}


def test_with_lokis_built_ins_the_mcp_call_is_still_awaited_on_the_loop(
    store: SqliteStore, llm: FakeLlm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node naming Loki's built-ins has them in its toolbox: its MCP tools are
    still awaited on the run's loop, not waited for on the executor."""
    config_dir = write_config(tmp_path / "_config")
    calls = Calls(monkeypatch)
    llm.default = ask_for_process_info(0)
    root = map_agent(tmp_path, 1, 1, tools="[mcp:calc, todo__list]")
    run_id = start_run(store, load_graph(root), prompt="go")

    outcome, seen = drive_watching(store, run_id, RunOptions(config_dir=config_dir))

    assert outcome.status == "completed", outcome
    offered = [t["function"]["name"] for t in llm.requests[0].body["tools"]]
    assert "todo__list" in offered and "calc_process_info" in offered
    assert (calls.threads, calls.blocking) == ([f"graphrun-loop-{run_id[:8]}"], 0)
    assert "graphrun-mcp" not in seen
    assert wait_gone(next(iter(server_pids(store, run_id))))


def test_branches_calling_mcp_tools_at_once_overlap_on_one_loop(
    store: SqliteStore, llm: FakeLlm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_dir = write_config(tmp_path / "_config")
    calls = Calls(monkeypatch)
    delay, branches = 1.5, 4
    llm.default = ask_for_process_info(delay)
    run_id = start_run(store, load_graph(map_agent(tmp_path, branches, branches)), prompt="go")

    started = time.monotonic()
    outcome, seen = drive_watching(store, run_id, RunOptions(config_dir=config_dir))
    elapsed = time.monotonic() - started

    assert outcome.status == "completed", outcome
    assert calls.most == branches  # all four calls were awaited at the same time
    assert set(calls.threads) == {f"graphrun-loop-{run_id[:8]}"}
    assert (len(calls.threads), calls.blocking) == (branches, 0)
    assert elapsed < delay * 2.5, elapsed  # ~one call's time, not four (6 s)
    assert "graphrun-mcp" not in seen
    # One server, started once for the run, and stopped with it.
    [pid] = server_pids(store, run_id)
    assert wait_gone(pid)


def test_runs_on_one_loop_share_its_servers_until_it_stops(
    store: SqliteStore, llm: FakeLlm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker drives every run on its one loop: the servers start once for all."""
    config_dir = write_config(tmp_path / "_config")
    calls = Calls(monkeypatch)
    llm.default = ask_for_process_info(0)
    loaded = load_graph(map_agent(tmp_path, 1, 1))
    loop = EffectLoop("graphrun-test-worker")
    try:
        pids = []
        for _ in range(2):
            run_id = start_run(store, loaded, prompt="go")
            outcome = drive(
                Driver(store, run_id, RunOptions(config_dir=config_dir, effect_loop=loop))
            )
            assert outcome.status == "completed", outcome
            pids.append(server_pids(store, run_id))
        [first], [second] = pids
        assert first == second  # the same server served both runs
        assert not gone(first)  # the loop goes on: so does its server
        assert default_hub(config_dir, loop=loop) is default_hub(config_dir, loop=loop)
        assert set(calls.threads) == {"graphrun-test-worker"}
    finally:
        loop.stop()
    assert wait_gone(first)
    with pytest.raises(McpError, match="event loop has stopped"):
        default_hub(config_dir, loop=loop)


def test_a_tool_node_awaits_its_mcp_call_on_the_runs_loop(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_dir = write_config(tmp_path / "_config")
    calls = Calls(monkeypatch)
    root = tmp_path / "agent"
    root.mkdir()
    (root / "graph.yaml").write_text(TOOL_NODE)
    run_id = start_run(store, load_graph(root), prompt="go")

    outcome, seen = drive_watching(store, run_id, RunOptions(config_dir=config_dir))

    assert (outcome.status, outcome.output) == ("completed", "42")
    [finished] = [e for e in store.read(run_id) if isinstance(e, ToolFinished)]
    assert (finished.output, finished.error, finished.source) == (42, None, "mcp:calc")
    assert (calls.threads, calls.blocking) == ([f"graphrun-loop-{run_id[:8]}"], 0)
    assert "graphrun-mcp" not in seen


def test_an_interrupted_run_cancels_its_awaited_mcp_call_and_stops_the_server(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_dir = write_config(tmp_path / "_config")
    calls = Calls(monkeypatch)
    root = tmp_path / "agent"
    root.mkdir()
    slow = TOOL_NODE.replace("tool: mcp:calc/add", "tool: mcp:calc/process_info").replace(
        "params: {a: 40, b: 2}", "params: {delay: 30}"
    )
    (root / "graph.yaml").write_text(slow)
    run_id = start_run(store, load_graph(root), prompt="go")
    driver = Driver(store, run_id, RunOptions(config_dir=config_dir))
    outcome: list[RunOutcome] = []
    runner = threading.Thread(target=lambda: outcome.append(drive(driver)))
    runner.start()
    deadline = time.monotonic() + 20
    while calls.in_flight == 0:
        assert time.monotonic() < deadline, "the MCP call never started"
        time.sleep(0.02)
    servers = [
        p for p in psutil.Process().children(recursive=True) if SERVER in " ".join(p.cmdline())
    ]
    assert len(servers) == 1
    started = time.monotonic()
    driver.interrupt("SIGINT", "interrupted")
    runner.join(20)

    assert not runner.is_alive()
    assert time.monotonic() - started < 10  # not the 30 s the tool would take
    assert outcome[0].status == "interrupted", outcome[0]
    assert not [e for e in store.read(run_id) if isinstance(e, ToolFinished)]
    assert wait_gone(servers[0].pid)


def test_a_tool_node_with_an_mcp_tool_replays_without_the_server(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    config_dir = write_config(tmp_path / "_config")
    root = tmp_path / "adder"
    root.mkdir()
    (root / "graph.yaml").write_text(TOOL_NODE)

    res = graphrun("run", str(root), "go")

    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "42"
    run_id = graphrun.last_run()
    (config_dir / "functions" / "mcp.json").unlink()
    replayed = graphrun("replay", run_id)
    assert replayed.code == 0, replayed.stdout + replayed.stderr


@pytest.fixture
def bound(tmp_path: Path) -> Iterator[tuple[EffectLoop, Any]]:
    """A run-like loop and a toolbox whose MCP tools live on it."""
    config_dir = write_config(tmp_path / "_config")
    agent = tmp_path / "agent"
    agent.mkdir()
    loop = EffectLoop("graphrun-test-loop")
    try:
        box = load_toolbox(
            agent, ["mcp:calc"], mcp_servers=["calc"], config_dir=config_dir, loop=loop
        )
        yield loop, box
    finally:
        loop.stop()


def test_timeout_and_cancel_of_an_awaited_call_answer_as_the_blocking_path(
    bound: tuple[EffectLoop, Any],
) -> None:
    loop, box = bound
    pid = json.loads(box.call("calc_process_info", "{}").output)["pid"]

    def awaited(**kwargs: Any) -> tuple[str, bool]:
        result = loop.submit(box.call_async("calc_process_info", '{"delay": 30}', **kwargs)).result(
            20
        )
        return result.output, result.is_error

    def blocking(**kwargs: Any) -> tuple[str, bool]:
        result = box.call("calc_process_info", '{"delay": 30}', **kwargs)
        return result.output, result.is_error

    timed_out = ("tool 'process_info' on MCP server 'calc' timed out after 0.5 s", True)
    cancelled = ("tool 'process_info' on MCP server 'calc' was cancelled (node cancelled)", True)
    for call in (awaited, blocking):
        started = time.monotonic()
        assert call(timeout=0.5) == timed_out
        cancel = CancelToken()
        timer = threading.Timer(0.3, cancel.cancel, args=("node cancelled",))
        timer.start()
        try:
            assert call(cancel=cancel) == cancelled
        finally:
            timer.cancel()
        assert call(cancel=cancel) == ("tool 'process_info' was cancelled (node cancelled)", True)
        assert time.monotonic() - started < 10
    # The session survived them all: the same server answers.
    again = loop.submit(box.call_async("calc_process_info", "{}")).result(20)
    assert (json.loads(again.output)["pid"], again.is_error) == (pid, False)
    # The loop stopping (its tasks cancelled) stops the server too.
    loop.stop()
    assert wait_gone(pid)


def test_an_awaiting_task_cancelled_ends_its_call_and_the_loop_stops_the_server(
    bound: tuple[EffectLoop, Any],
) -> None:
    loop, box = bound
    future = loop.submit(box.call_async("calc_process_info", '{"delay": 30}'))
    time.sleep(0.5)
    future.cancel()  # the effect's task cancelled under it (the run ending)
    with pytest.raises(concurrent.futures.CancelledError):
        future.result(5)
    result = loop.submit(box.call_async("calc_process_info", "{}")).result(20)
    pid = json.loads(result.output)["pid"]
    loop.stop()
    assert wait_gone(pid)


def test_waiting_for_a_server_on_its_own_loop_is_refused_not_a_deadlock(
    tmp_path: Path,
) -> None:
    config_dir = write_config(tmp_path / "_config")
    loop = EffectLoop("graphrun-test-loop")
    try:
        hub = default_hub(config_dir, loop=loop)

        async def blocking_on_the_loop() -> Any:
            return hub.tools("calc")

        with pytest.raises(McpError, match="would wait for itself"):
            loop.submit(blocking_on_the_loop()).result(10)

        async def awaited() -> list[str]:
            return [tool.spec.name for tool in await hub.tools_async("calc")]

        assert loop.submit(awaited()).result(30) == ["calc_add", "calc_process_info", "calc_fail"]
        # The blocking API off the loop reaches the same session.
        assert next(t.spec.name for t in hub.tools("calc")) == "calc_add"
        assert hub.call_tool("calc", "add", {"a": 1, "b": 2}) == ("3", False)
        pid = json.loads(hub.call_tool("calc", "process_info", {})[0])["pid"]
    finally:
        loop.stop()
    assert wait_gone(pid)
