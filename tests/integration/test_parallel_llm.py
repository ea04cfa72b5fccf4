"""A super-step's live LLM calls, as tasks on the HTTP client's event loop.

A map (or fan-out) of ``llm`` nodes without tools runs each visit as a task on the
client's loop, not on a thread of its own. These drive such maps against a real
HTTP server on 127.0.0.1 (``tests/support/fake_llm.py``) and a real SQLite log:
the calls overlap, retries wait between attempts, a node's timeout and an interrupt
abort the requests in flight, structured output is extracted, and an llm node with
tools still runs its tools. Each finished call is recorded once, whatever happens
to the others.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from graphrun.eventstore.events import LlmCalled, LlmResult, RunResumed, ToolCalled
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine.driver import Driver, RunOptions, RunOutcome, drive, start_run
from graphrun.runtime.graph.loader import load_graph
from tests.conftest import GraphrunCli
from tests.support.fake_llm import (
    FakeLlm,
    FakeToolCall,
    RecordedRequest,
    Reply,
    http_error,
    last_user_text,
    text,
    tool_calls,
)

MAP = """\
name: fan-llm
version: "1.0"
model: openai:gpt-test
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
{extra}
  done:
    type: end
    output: "{{{{answers}}}}"
"""


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


def agent(tmp_path: Path, items: list[Any], *, cap: int = 8, extra: str = "") -> Path:
    root = tmp_path / "agent"
    root.mkdir(exist_ok=True)
    (root / "graph.yaml").write_text(
        MAP.format(items=json.dumps(items), cap=cap, extra=extra.rstrip("\n"))
    )
    return root


def start(store: SqliteStore, root: Path) -> str:
    return start_run(store, load_graph(root), prompt="go")


def run(store: SqliteStore, root: Path) -> tuple[str, RunOutcome]:
    run_id = start(store, root)
    return run_id, drive(Driver(store, run_id, RunOptions(config_dir=root / "no-config")))


def answer_after(gate: threading.Barrier) -> Any:
    """A reply function that answers only once ``gate.parties`` requests are in at once."""

    def reply(request: RecordedRequest) -> Reply:
        gate.wait()
        return text(f"echo: {last_user_text(request.body)}")

    return reply


def test_a_map_of_llm_calls_has_them_in_flight_at_once(
    store: SqliteStore, llm: FakeLlm, tmp_path: Path
) -> None:
    # The server answers nobody until four requests are waiting together: with one
    # call at a time the barrier breaks (after 10 s) and the calls fail.
    gate = threading.Barrier(4, timeout=10)
    threads: set[str] = set()

    def reply(request: RecordedRequest) -> Reply:
        threads.update(t.name for t in threading.enumerate())
        return answer_after(gate)(request)

    llm.default = reply
    run_id, outcome = run(store, agent(tmp_path, ["a", "b", "c", "d"], cap=4))
    assert outcome.status == "completed", outcome.error
    # The calls were tasks on the run's loop: no executor thread was started.
    assert f"graphrun-loop-{run_id[:8]}" in threads
    assert not [name for name in threads if name.startswith(f"graphrun-{run_id[:8]}")]
    assert json.loads(outcome.output or "") == [
        "echo: item a",
        "echo: item b",
        "echo: item c",
        "echo: item d",
    ]
    events = store.read(run_id)
    calls = [e for e in events if isinstance(e, LlmCalled)]
    assert sorted(e.branch for e in calls) == ["fan[0]", "fan[1]", "fan[2]", "fan[3]"]
    assert all(e.error is None and e.status == 200 for e in calls)
    assert len([e for e in events if isinstance(e, LlmResult)]) == 4


def test_the_map_cap_holds_for_calls_on_the_event_loop(
    store: SqliteStore, llm: FakeLlm, tmp_path: Path
) -> None:
    in_flight = 0
    most = 0
    lock = threading.Lock()

    def reply(request: RecordedRequest) -> Reply:
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        time.sleep(0.05)
        with lock:
            in_flight -= 1
        return text(f"echo: {last_user_text(request.body)}")

    llm.default = reply
    _, outcome = run(store, agent(tmp_path, list(range(9)), cap=2))
    assert outcome.status == "completed", outcome.error
    assert most == 2
    assert len(llm.requests) == 9


def test_a_transient_error_is_retried_inside_a_map(
    store: SqliteStore, llm: FakeLlm, tmp_path: Path
) -> None:
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def reply(request: RecordedRequest) -> Reply:
        prompt = last_user_text(request.body)
        with lock:
            seen[prompt] = seen.get(prompt, 0) + 1
            first = seen[prompt] == 1
        if prompt == "item b" and first:
            return http_error(429, "slow down", retry_after=0.2)
        return text(f"echo: {prompt}")

    llm.default = reply
    extra = "    max_attempts: 3\n"
    run_id, outcome = run(store, agent(tmp_path, ["a", "b", "c"], extra=extra))
    assert outcome.status == "completed", outcome.error
    assert json.loads(outcome.output or "") == ["echo: item a", "echo: item b", "echo: item c"]
    b = [e for e in store.read(run_id) if isinstance(e, LlmCalled) and e.branch == "fan[1]"]
    assert [(e.attempt, e.status) for e in b] == [(1, 429), (2, 200)]
    assert b[0].transient and "HTTP 429" in (b[0].error or "")


def test_a_node_timeout_aborts_its_request_and_fails_the_map(
    store: SqliteStore, llm: FakeLlm, tmp_path: Path
) -> None:
    def reply(request: RecordedRequest) -> Reply:
        prompt = last_user_text(request.body)
        return text(f"echo: {prompt}", delay=30.0 if prompt == "item slow" else 0.0)

    llm.default = reply
    extra = "    timeout: 0.5\n"
    started = time.monotonic()
    run_id, outcome = run(store, agent(tmp_path, ["fast", "slow"], extra=extra))
    took = time.monotonic() - started
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert "sub-branch [1] failed: LLM node failed: timed out after 0.5s (node timeout)" in (
        outcome.error
    )
    assert took < 15, "the slow request was waited for instead of aborted"
    events = store.read(run_id)
    slow = [e for e in events if isinstance(e, LlmCalled) and e.branch == "fan[1]"]
    assert len(slow) == 1 and "node timeout" in (slow[0].error or "")
    fast = [e for e in events if isinstance(e, LlmResult) and e.branch == "fan[0]"]
    assert fast and fast[0].text == "echo: item fast"


def test_an_interrupt_aborts_the_calls_in_flight_and_resume_makes_only_those(
    store: SqliteStore, llm: FakeLlm, tmp_path: Path
) -> None:
    hold = threading.Event()
    arrived = threading.Semaphore(0)

    def reply(request: RecordedRequest) -> Reply:
        prompt = last_user_text(request.body)
        if prompt != "item a":
            arrived.release()
            hold.wait(30)  # held until the run is interrupted
        return text(f"echo: {prompt}")

    llm.default = reply
    root = agent(tmp_path, ["a", "b", "c"])
    run_id = start(store, root)
    driver = Driver(store, run_id, RunOptions(config_dir=root / "no-config"))
    outcome: list[RunOutcome] = []
    thread = threading.Thread(target=lambda: outcome.append(drive(driver)))
    thread.start()
    for _ in range(2):
        assert arrived.acquire(timeout=20), "the held calls never reached the server"
    deadline = time.monotonic() + 20
    while not any(isinstance(e, LlmResult) and e.branch == "fan[0]" for e in store.read(run_id)):
        assert time.monotonic() < deadline, "the finished call was never committed"
        time.sleep(0.02)
    driver.interrupt("SIGINT", "interrupted (test)")
    thread.join(20)
    assert not thread.is_alive(), "the interrupt did not abort the calls in flight"
    hold.set()
    assert outcome[0].status == "interrupted"
    results = [e.branch for e in store.read(run_id) if isinstance(e, LlmResult)]
    assert results == ["fan[0]"]  # the aborted calls left no result
    llm.reset()
    resumed = drive(Driver(store, run_id, RunOptions(config_dir=root / "no-config")))
    assert resumed.status == "completed", resumed.error
    assert json.loads(resumed.output or "") == ["echo: item a", "echo: item b", "echo: item c"]
    assert sorted(last_user_text(r.body) for r in llm.requests) == ["item b", "item c"]
    events = store.read(run_id)
    assert sum(isinstance(e, RunResumed) for e in events) == 1
    results = sorted(e.branch for e in events if isinstance(e, LlmResult))
    assert results == ["fan[0]", "fan[1]", "fan[2]"]


def test_structured_output_is_extracted_inside_a_map(
    store: SqliteStore, llm: FakeLlm, tmp_path: Path
) -> None:
    def reply(request: RecordedRequest) -> Reply:
        messages = request.body["messages"]
        prompt = last_user_text(request.body)
        if any(m["role"] == "system" for m in messages):  # the extractor
            return text(json.dumps({"size": prompt.count("x")}))
        size = int(re.search(r"item (\d+)", prompt).group(1))  # type: ignore[union-attr]
        return text("it is size " + "x" * size)

    llm.default = reply
    extra = (
        "    output_schema:\n"
        "      type: object\n"
        "      properties: {size: {type: integer}}\n"
        "      required: [size]\n"
        "    output_key: parsed\n"
    )
    root = agent(tmp_path, [1, 2, 3], extra=extra)
    graph = (
        (root / "graph.yaml")
        .read_text()
        .replace(
            'output: "{{answers}}"',
            'output: "{{answers[0].size}}{{answers[1].size}}{{answers[2].size}}"',
        )
    )
    (root / "graph.yaml").write_text(graph)
    run_id, outcome = run(store, root)
    assert outcome.status == "completed", outcome.error
    assert outcome.output == "123"
    purposes = sorted(e.purpose for e in store.read(run_id) if isinstance(e, LlmCalled))
    assert purposes == ["extract"] * 3 + ["main"] * 3


def test_an_llm_node_with_tools_in_a_map_runs_its_tools(
    store: SqliteStore, llm: FakeLlm, tmp_path: Path
) -> None:
    def reply(request: RecordedRequest) -> Reply:
        messages = request.body["messages"]
        if messages[-1]["role"] == "tool":
            return text(f"tool said {messages[-1]['content'].strip()}")
        item = last_user_text(request.body).split()[-1]
        return tool_calls(FakeToolCall("shout", {"word": item}))

    llm.default = reply
    root = agent(tmp_path, ["a", "b"], extra="    tools: [shout]\n")
    (root / "tools.py").write_text(
        "def shout(word: str) -> str:\n"
        '    """Shout a word.\n\n    Args:\n        word: The word.\n    """\n'
        "    return word.upper()\n"
    )
    run_id, outcome = run(store, root)
    assert outcome.status == "completed", outcome.error
    assert json.loads(outcome.output or "") == ["tool said A", "tool said B"]
    ran = sorted(
        (e.branch, e.result.strip()) for e in store.read(run_id) if isinstance(e, ToolCalled)
    )
    assert ran == [("fan[0]", "A"), ("fan[1]", "B")]


def test_kill_9_mid_map_then_resume_asks_only_the_unanswered_calls(
    llm: FakeLlm, tmp_path: Path, graphrun: GraphrunCli
) -> None:
    """A real crash: the process dies while one call is in flight on the event loop;
    the answered calls were committed and are never asked again."""
    import signal

    arrived = threading.Event()
    hold = threading.Event()

    def reply(request: RecordedRequest) -> Reply:
        prompt = last_user_text(request.body)
        if prompt == "item c" and not hold.is_set():
            arrived.set()
            hold.wait(30)
        return text(f"echo: {prompt}")

    llm.default = reply
    root = agent(tmp_path, ["a", "b", "c"])
    config = str(tmp_path / "cfg")
    proc = graphrun.popen("run", str(root), GRAPHRUN_CONFIG_DIR=config)
    try:
        assert arrived.wait(30), "the held call never reached the server"
        store = SqliteStore(graphrun.db)
        deadline = time.monotonic() + 30
        while True:
            run_id = store.runs(limit=1)[0].run_id
            done = {e.branch for e in store.read(run_id) if isinstance(e, LlmResult)}
            if done == {"fan[0]", "fan[1]"}:
                break
            assert time.monotonic() < deadline, f"the answered calls were not committed: {done}"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        hold.set()
    llm.reset()
    resumed = graphrun("resume", run_id, GRAPHRUN_CONFIG_DIR=config)
    assert resumed.code == 0, resumed.stderr
    assert resumed.json() == ["echo: item a", "echo: item b", "echo: item c"]
    assert [last_user_text(r.body) for r in llm.requests] == ["item c"]
    events = store.read(run_id)
    assert sorted(e.branch for e in events if isinstance(e, LlmResult)) == [
        "fan[0]",
        "fan[1]",
        "fan[2]",
    ]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    store.close()
