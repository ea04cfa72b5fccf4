"""``retry:`` on effectful nodes: each attempt, its error and the delay are recorded;
replay reproduces them without waiting; kill -9 between attempts, then resume, goes
on with the attempts that are left."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.conftest import GraphrunCli, write_agent

GRAPH = """
    name: flaky
    version: "1.0"
    start: fetch
    nodes:
      fetch:
        type: script
        script: flaky.py
        retry:
          {{max_attempts: {attempts}, backoff: {backoff}, initial: {initial}, jitter: false{on}}}
        on_error:
          - {{default: true, to: gave_up}}
        next: done
      done: {{type: end, output: "got {{{{value}}}}"}}
      gave_up: {{type: end, output: "gave up: {{{{_error.message}}}}"}}
"""

# Fails (exit 1, or 3 when the prompt says so) until its count of runs reaches the
# prompt's number; the count lives in a file next to it.
FLAKY = """
    import json, os, pathlib, sys
    state = json.loads(os.environ["GRAPH_STATE"])
    succeed_at, _, code = state["initial_prompt"].partition(":")
    counter = pathlib.Path(__file__).with_name("count")
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    if n < int(succeed_at):
        print(f"attempt {n}: upstream unavailable", file=sys.stderr)
        sys.exit(int(code or 1))
    print(json.dumps({"value": n}))
"""


def _agent(tmp_path: Path, attempts: int = 3, backoff: str = "fixed", initial: float = 0.2,
           on: str = "") -> Path:  # fmt: skip
    graph = GRAPH.format(attempts=attempts, backoff=backoff, initial=initial, on=on)
    return write_agent(tmp_path / "flaky", graph, {"flaky.py": FLAKY})


def _events(graphrun: GraphrunCli, run_id: str) -> list[dict]:  # type: ignore[type-arg]
    return graphrun("events", run_id, "--json").json_lines()  # type: ignore[return-value]


def test_a_failed_attempt_is_tried_again_after_the_recorded_delay(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    root = _agent(tmp_path, initial=0.4)
    started = time.monotonic()
    result = graphrun("run", str(root), "3")
    took = time.monotonic() - started
    assert (result.code, result.stdout.strip()) == (0, "got 3"), result.stderr
    assert took >= 0.8  # two waits of 0.4 s
    assert "fetch attempt 1 failed" in result.stderr
    events = _events(graphrun, graphrun.last_run())
    retries = [e for e in events if e["type"] == "NodeRetrying"]
    assert [(e["attempt"], e["delay"]) for e in retries] == [(1, 0.4), (2, 0.4)]
    assert "attempt 1: upstream unavailable" in retries[0]["error"]
    scripts = [e for e in events if e["type"] == "ScriptFinished"]
    assert len(scripts) == 3
    assert retries[0]["ts"] + 0.4 <= scripts[1]["ts"] + 0.05


def test_exhausted_attempts_route_the_failure(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = _agent(tmp_path, attempts=2, initial=0.05)
    result = graphrun("run", str(root), "9")
    assert result.code == 0, result.stderr
    assert result.stdout.startswith("gave up: "), result.stdout
    assert "attempt 2: upstream unavailable" in result.stdout
    assert (root / "count").read_text() == "2"


def test_only_matching_errors_are_retried(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = _agent(tmp_path, initial=0.05, on=', on: ["code 3$|code 3:"]')
    result = graphrun("run", str(root), "9:1")
    assert result.stdout.startswith("gave up: "), result.stdout
    assert (root / "count").read_text() == "1"  # exit 1 is not in `on`
    (root / "count").unlink()
    events = _events(graphrun, graphrun.last_run())
    assert not [e for e in events if e["type"] == "NodeRetrying"]
    result = graphrun("run", str(root), "9:3")
    assert (root / "count").read_text() == "3", result.stderr  # exit 3 is


def test_exponential_backoff_is_capped_and_jitter_is_reproducible() -> None:
    from graphrun.runtime.graph.model import RetryPolicy
    from graphrun.runtime.nodes.retry import delay_for

    policy = RetryPolicy(initial=1, max=5, jitter=False)
    assert [delay_for(policy, n, "s") for n in (1, 2, 3, 4)] == [1, 2, 4, 5]
    jittered = RetryPolicy(initial=4, max=60)
    first = [delay_for(jittered, n, f"run:n:1:{n}") for n in (1, 2, 3)]
    assert first == [delay_for(jittered, n, f"run:n:1:{n}") for n in (1, 2, 3)]
    assert all(base / 2 <= d <= base for d, base in zip(first, (4, 8, 16), strict=True))
    assert len({delay_for(jittered, 1, f"run{i}:n:1:1") for i in range(20)}) > 10


def test_replay_reproduces_the_retries_without_waiting(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    root = _agent(tmp_path, initial=4)
    result = graphrun("run", str(root), "3")
    assert result.code == 0, result.stderr
    run_id = graphrun.last_run()
    started = time.monotonic()
    replayed = graphrun("replay", run_id)
    assert replayed.code == 0, replayed.stdout + replayed.stderr
    # The run itself waited 8 s (two retries 4 s apart); a replay that waited even
    # one of them would take 4 s more than its start-up, which is well under 4 s.
    assert time.monotonic() - started < 4
    changed = write_agent(
        tmp_path / "changed",
        GRAPH.format(attempts=3, backoff="fixed", initial=0.5, on=""),
        {"flaky.py": FLAKY},
    )
    diverged = graphrun("replay", run_id, "--graph", str(changed))
    assert diverged.code == 1, diverged.stdout + diverged.stderr


def test_kill_between_attempts_then_resume(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = _agent(tmp_path, attempts=3, initial=4)
    proc = graphrun.popen("run", str(root), "3")
    deadline = time.monotonic() + 30
    run_id = None
    while time.monotonic() < deadline:
        rows = graphrun("runs", "--json").json_lines()
        if rows:
            run_id = str(rows[0]["run_id"])  # type: ignore[index]
            if any(e["type"] == "NodeRetrying" for e in _events(graphrun, run_id)):
                break
        time.sleep(0.1)
    assert run_id is not None
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    killed_at = time.time()
    assert (root / "count").read_text() == "1"
    result = graphrun("resume", run_id)
    assert (result.code, result.stdout.strip()) == (0, "got 3"), result.stderr
    events = _events(graphrun, run_id)
    kinds = [e["type"] for e in events]
    assert kinds.count("NodeRetrying") == 2
    assert kinds.count("ScriptFinished") == 3
    assert "RunResumed" in kinds
    first = next(e for e in events if e["type"] == "NodeRetrying")
    second_attempt = [e for e in events if e["type"] == "ScriptFinished"][1]
    # The second attempt began no earlier than the first retry's delay allowed.
    assert second_attempt["ts"] >= first["ts"] + 4 - 0.05
    assert second_attempt["ts"] >= killed_at - 0.05


def test_validate_checks_the_policy(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = _agent(tmp_path, attempts=0, on=', on: ["(oops"]')
    result = graphrun("validate", str(root))
    assert result.code == 2
    f = root / "graph.yaml"
    assert (
        f"error: {f}:9 ($.nodes.fetch.retry.max_attempts): node 'fetch': retry.max_attempts "
        "must be at least 1"
    ) in result.stderr
    assert (
        "($.nodes.fetch.retry.on[0]): node 'fetch': retry.on[0] is not a regular expression"
    ) in result.stderr
    end = write_agent(
        tmp_path / "end",
        """
        name: e
        version: "1.0"
        start: e
        nodes:
          e: {type: end, retry: {max_attempts: 2}}
        """,
    )
    result = graphrun("validate", str(end))
    assert (
        f"warning: {end / 'graph.yaml'}:5 ($.nodes.e.retry): unknown field 'retry' in end node "
        "'e' (ignored)"
    ) in result.stderr


LLM_GRAPH = """
    name: asker
    version: "1.0"
    model: openai:gpt-test
    start: ask
    nodes:
      ask:
        type: llm
        prompt: "Say {{initial_prompt}}"
        retry: {max_attempts: 3, backoff: fixed, initial: 0.1, jitter: false, on: ["HTTP 4|400"]}
        state_updates: {answer: "{{output}}"}
        next: done
      done: {type: end, output: "said {{answer}}"}
"""


def test_an_llm_node_is_retried_and_replayed(
    graphrun: GraphrunCli, tmp_path: Path, fake_llm
) -> None:  # type: ignore[no-untyped-def]
    from tests.support.fake_llm import http_error, text

    root = write_agent(tmp_path / "asker", LLM_GRAPH)
    fake_llm.script(http_error(400, "bad gateway mood"), text("hello"))
    env = {"OPENAI_BASE_URL": fake_llm.url_openai, "OPENAI_API_KEY": "sk-test"}
    result = graphrun("run", str(root), "hi", **env)
    assert (result.code, result.stdout.strip()) == (0, "said hello"), result.stderr
    assert len(fake_llm.requests) == 2
    run_id = graphrun.last_run()
    retries = [e for e in _events(graphrun, run_id) if e["type"] == "NodeRetrying"]
    assert len(retries) == 1 and "bad gateway mood" in retries[0]["error"]
    replayed = graphrun("replay", run_id)
    assert replayed.code == 0, replayed.stdout + replayed.stderr
    assert len(fake_llm.requests) == 2  # replay serves both attempts from the log


def test_the_report_shows_each_failed_attempt(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = _agent(tmp_path, initial=0.05)
    assert graphrun("run", str(root), "2").code == 0
    out = tmp_path / "report.html"
    assert graphrun("report", graphrun.last_run(), "-o", str(out)).code == 0
    html = out.read_text()
    assert "attempt 1 failed: script exited with code 1: attempt 1: upstream unavailable" in html
    assert "tried again after 0.05 s" in html
