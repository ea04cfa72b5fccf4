"""Parallel graphs for real: `next` lists, super-steps, reducers, `map`, concurrency caps.

The worked scenarios of Loki's parallel format, each driven in-process against a real
SQLite file with real script subprocesses; expected results as specified (with
graphrun's decisions where they differ).
"""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphrun.eventstore.events import (
    BranchesMerged,
    NodeEntered,
    ScriptFinished,
    StepStarted,
)
from graphrun.eventstore.fold import fold
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine.driver import Driver, RunOptions, RunOutcome, drive, start_run
from graphrun.runtime.graph.loader import load_graph
from tests.support.fake_llm import text


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "events.db")
    yield s
    s.close()


def agent(tmp_path: Path, graph: str, scripts: dict[str, str]) -> Path:
    root = tmp_path / "agent"
    (root / "scripts").mkdir(parents=True, exist_ok=True)
    (root / "graph.yaml").write_text(textwrap.dedent(graph))
    for name, body in scripts.items():
        (root / "scripts" / name).write_text(textwrap.dedent(body))
    return root


def run(store: SqliteStore, root: Path, prompt: str = "") -> RunOutcome:
    run_id = start_run(store, load_graph(root), prompt=prompt)
    return drive(Driver(store, run_id, RunOptions()))


def emit(value: object) -> str:
    return f"import json\nprint(json.dumps({value!r}))\n"


DIAMOND = """
    name: diamond
    version: "1.0"
    start: fan
    {reducers}
    nodes:
      fan:
        type: script
        script: scripts/fan.py
        state_updates: {{}}
        next: [right, left]
      left:
        type: script
        script: scripts/left.py
        state_updates: {{}}
        next: join
      right:
        type: script
        script: scripts/right.py
        state_updates: {{}}
        next: join
      join:
        type: end
        output: "{{{{hits}}}}"
"""
DIAMOND_SCRIPTS = {
    "fan.py": emit({}),
    "left.py": emit({"hits": "L"}),
    "right.py": emit({"hits": "R"}),
}


def test_diamond_with_append_merges_in_node_id_order(store: SqliteStore, tmp_path: Path) -> None:
    root = agent(tmp_path, DIAMOND.format(reducers="reducers: {hits: append}"), DIAMOND_SCRIPTS)
    outcome = run(store, root)
    assert outcome.status == "completed", outcome.error
    assert json.loads(outcome.output or "") == ["L", "R"]
    events = store.read(outcome.run_id)
    steps = [e for e in events if isinstance(e, StepStarted)]
    assert [s.frontier for s in steps] == [["left", "right"]]
    merged = [e for e in events if isinstance(e, BranchesMerged)]
    assert merged[0].writes == {"left": {"hits": "L"}, "right": {"hits": "R"}}
    assert merged[0].merged == {"hits": ["L", "R"]}
    assert merged[0].reducers == {"hits": "append"}
    assert merged[0].targets == ["join"]
    entered = [e.node_id for e in events if isinstance(e, NodeEntered)]
    assert entered.count("join") == 1
    # Each branch's effect is tagged with its branch.
    assert {e.branch for e in events if isinstance(e, ScriptFinished)} == {"", "left", "right"}


def test_two_writers_without_a_reducer_fail_naming_the_key(
    store: SqliteStore, tmp_path: Path
) -> None:
    root = agent(tmp_path, DIAMOND.format(reducers=""), DIAMOND_SCRIPTS)
    outcome = run(store, root)
    assert outcome.status == "failed"
    assert "Key 'hits' was written by 2 parallel branches" in (outcome.error or "")
    assert "no reducer declared" in (outcome.error or "")


def test_two_ends_in_one_step_is_an_error(store: SqliteStore, tmp_path: Path) -> None:
    graph = """
        name: two-ends
        version: "1.0"
        start: fan
        nodes:
          fan: {type: script, script: scripts/fan.py, next: [end_b, end_a]}
          end_a: {type: end, output: a}
          end_b: {type: end, output: b}
    """
    outcome = run(store, agent(tmp_path, graph, {"fan.py": emit({})}))
    assert outcome.status == "failed"
    assert "multiple End targets (end_a, end_b)" in (outcome.error or "")


def test_end_beside_a_running_branch_ends_with_its_own_output(
    store: SqliteStore, tmp_path: Path
) -> None:
    graph = """
        name: end-beside
        version: "1.0"
        start: fan
        initial_state: {n: 1}
        nodes:
          fan: {type: script, script: scripts/fan.py, next: [finish, more]}
          finish: {type: end, output: "n={{n}}"}
          more: {type: script, script: scripts/more.py, state_updates: {}, next: never}
          never: {type: end, output: never}
    """
    outcome = run(store, agent(tmp_path, graph, {"fan.py": emit({}), "more.py": emit({"n": 2})}))
    assert outcome.status == "completed", outcome.error
    assert outcome.output == "n=1"  # rendered inside the End's branch, before the merge
    assert fold(store.read(outcome.run_id)).state["n"] == 2  # more's writes were merged


def test_uneven_branches_make_the_join_fire_twice(store: SqliteStore, tmp_path: Path) -> None:
    graph = """
        name: uneven
        version: "1.0"
        start: fan
        reducers: {trail: append}
        nodes:
          fan: {type: script, script: scripts/fan.py, next: [a, b]}
          a: {type: script, script: scripts/a.py, state_updates: {}, next: join}
          b: {type: script, script: scripts/b.py, state_updates: {}, next: b2}
          b2: {type: script, script: scripts/b2.py, state_updates: {}, next: join}
          join: {type: script, script: scripts/join.py, state_updates: {}, next: done}
          done: {type: end, output: "{{trail}}"}
    """
    scripts = {
        "fan.py": emit({}),
        "a.py": emit({"trail": "a"}),
        "b.py": emit({"trail": "b"}),
        "b2.py": emit({"trail": "b2"}),
        "join.py": emit({"trail": "join"}),
    }
    outcome = run(store, agent(tmp_path, graph, scripts))
    assert outcome.status == "completed", outcome.error
    events = store.read(outcome.run_id)
    frontiers = [e.frontier for e in events if isinstance(e, StepStarted)]
    assert frontiers == [["a", "b"], ["b2", "join"], ["done", "join"]]
    # `done` renders from the state after step 3: join's second write is not in it.
    assert json.loads(outcome.output or "") == ["a", "b", "b2", "join"]


def test_sequential_writes_go_through_reducers(store: SqliteStore, tmp_path: Path) -> None:
    graph = """
        name: seq-concat
        version: "1.0"
        start: a
        reducers: {log: concat, n: sum}
        initial_state: {n: 5}
        nodes:
          a: {type: script, script: scripts/a.py, next: b}
          b: {type: script, script: scripts/b.py, next: done}
          done: {type: end, output: "{{log}}|{{n}}"}
    """
    scripts = {"a.py": emit({"log": "one", "n": 5}), "b.py": emit({"log": "two", "n": 2})}
    outcome = run(store, agent(tmp_path, graph, scripts))
    assert outcome.status == "completed", outcome.error
    # `n: 5` written back unchanged is no write (sum stays 5), then +2.
    assert outcome.output == "one\ntwo|7"


MAP = """
    name: mapper
    version: "1.0"
    start: m
    initial_state: {{items: {items}}}
    nodes:
      m:
        type: map
        over: "{{{{items}}}}"
        as: item
        branch: double
        collect_into: doubled
        max_concurrency: {cap}
        next: done
      double:
        type: script
        script: scripts/double.py
        state_updates: {{}}
      done:
        type: end
        output: "{{{{doubled}}}}"
"""
DOUBLE = """
    import json, os, sys, time
    state = json.loads(os.environ["GRAPH_STATE"])
    item = state["item"]
    if item == "boom":
        sys.exit(1)
    time.sleep(0.05 * (3 - item) if isinstance(item, int) and item < 3 else 0)
    print(json.dumps({"output": item * 2}))
"""


def test_map_collects_in_input_order(store: SqliteStore, tmp_path: Path) -> None:
    root = agent(tmp_path, MAP.format(items="[1, 2, 3]", cap=3), {"double.py": DOUBLE})
    outcome = run(store, root)
    assert outcome.status == "completed", outcome.error
    assert json.loads(outcome.output or "") == [2, 4, 6]
    branches = sorted(e.branch for e in store.read(outcome.run_id) if isinstance(e, ScriptFinished))
    assert branches == ["m[0]", "m[1]", "m[2]"]


def test_map_over_an_empty_list(store: SqliteStore, tmp_path: Path) -> None:
    outcome = run(store, agent(tmp_path, MAP.format(items="[]", cap=2), {"double.py": DOUBLE}))
    assert outcome.status == "completed", outcome.error
    assert outcome.output == "[]"


def test_map_over_a_string_fails(store: SqliteStore, tmp_path: Path) -> None:
    root = agent(tmp_path, MAP.format(items='"a,b"', cap=2), {"double.py": DOUBLE})
    outcome = run(store, root)
    assert outcome.status == "failed"
    assert "must resolve to an array, got string" in (outcome.error or "")


def test_map_one_failing_item_fails_the_map_after_all_ran(
    store: SqliteStore, tmp_path: Path
) -> None:
    root = agent(tmp_path, MAP.format(items='[5, 6, "boom", 7, 8]', cap=5), {"double.py": DOUBLE})
    outcome = run(store, root)
    assert outcome.status == "failed"
    assert "map node 'm': sub-branch [2] failed" in (outcome.error or "")
    assert len([e for e in store.read(outcome.run_id) if isinstance(e, ScriptFinished)]) == 5


SLEEPY = """
    name: sleepy
    version: "1.0"
    start: fan
    settings: {{max_concurrency: {cap}}}
    reducers: {{done: append}}
    nodes:
      fan: {{type: script, script: scripts/fan.py, next: [a, b, c]}}
      a: {{type: script, script: scripts/sleep.py, state_updates: {{}}, next: join}}
      b: {{type: script, script: scripts/sleep.py, state_updates: {{}}, next: join}}
      c: {{type: script, script: scripts/sleep.py, state_updates: {{}}, next: join}}
      join: {{type: end, output: "{{{{done}}}}"}}
"""
# Sleeps 1 s, and writes down when it ran (a file per process, beside the script).
SLEEP = """\
import json, os, pathlib, time
began = time.time()
time.sleep(1)
marks = pathlib.Path(__file__).with_name("marks")
marks.mkdir(exist_ok=True)
(marks / str(os.getpid())).write_text(f"{began} {time.time()}")
print(json.dumps({'done': 1}))
"""


def _intervals(root: Path) -> list[tuple[float, float]]:
    """When each sleep.py process ran, in the order they began."""
    marks = root / "scripts" / "marks"
    spans = [tuple(map(float, f.read_text().split())) for f in marks.iterdir()]
    return sorted(spans)  # type: ignore[arg-type]


def test_branches_run_concurrently(store: SqliteStore, tmp_path: Path) -> None:
    root = agent(tmp_path, SLEEPY.format(cap=8), {"fan.py": emit({}), "sleep.py": SLEEP})
    outcome = run(store, root)
    assert outcome.status == "completed", outcome.error
    assert outcome.output == "[1,1,1]"
    spans = _intervals(root)
    # All three were asleep at once: the last began before the first ended.
    assert len(spans) == 3 and max(b for b, _ in spans) < min(e for _, e in spans), spans


def test_max_concurrency_one_runs_branches_one_at_a_time(
    store: SqliteStore, tmp_path: Path
) -> None:
    root = agent(tmp_path, SLEEPY.format(cap=1), {"fan.py": emit({}), "sleep.py": SLEEP})
    outcome = run(store, root)
    assert outcome.status == "completed", outcome.error
    spans = _intervals(root)
    # One after another: each began after the one before it ended.
    assert len(spans) == 3, spans
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(2)), spans


def test_a_parallel_run_replays_without_performing_anything(
    store: SqliteStore, tmp_path: Path
) -> None:
    from graphrun.runtime.replay.divergence import replay_events

    root = agent(tmp_path, MAP.format(items="[1, 2, 3]", cap=3), {"double.py": DOUBLE})
    outcome = run(store, root)
    assert outcome.status == "completed", outcome.error
    (root / "scripts" / "double.py").write_text("raise SystemExit('must not run')\n")
    result = replay_events(store.read(outcome.run_id))
    assert result.ok, result.divergence and result.divergence.format()
    assert result.final is not None and result.final.output == "[2,4,6]"

    root2 = agent(
        tmp_path / "d", DIAMOND.format(reducers="reducers: {hits: append}"), DIAMOND_SCRIPTS
    )
    outcome2 = run(store, root2)
    result2 = replay_events(store.read(outcome2.run_id))
    assert result2.ok, result2.divergence and result2.divergence.format()
    assert result2.final is not None and result2.final.output == outcome2.output


MARKED = """
    name: marked
    version: "1.0"
    start: fan
    reducers: {{seen: append}}
    nodes:
      fan: {{type: script, script: scripts/fan.py, next: [fast, slow]}}
      fast: {{type: script, script: scripts/mark.py, state_updates: {{}}, next: join}}
      slow: {{type: script, script: scripts/slow.py, state_updates: {{}}, next: join}}
      join: {{type: end, output: "{{{{seen}}}}"}}
"""
MARK = """
    import json, os, sys
    state = json.loads(os.environ["GRAPH_STATE"])
    with open(os.environ["MARKS"], "a") as f:
        f.write("fast\\n")
    print(json.dumps({"seen": "fast"}))
"""
SLOW = """
    import json, os, time
    with open(os.environ["MARKS"], "a") as f:
        f.write("slow-start\\n")
    time.sleep(float(os.environ.get("SLOW", "0")))
    print(json.dumps({"seen": "slow"}))
"""


def test_kill_mid_step_then_resume_reruns_only_the_unfinished_branch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 while one branch has finished and the other still runs."""
    import os
    import signal
    import subprocess
    import sys

    root = agent(tmp_path, MARKED.format(), {"fan.py": emit({}), "mark.py": MARK, "slow.py": SLOW})
    db = tmp_path / "events.db"
    marks = tmp_path / "marks"
    env = {**os.environ, "MARKS": str(marks), "SLOW": "30", "GRAPHRUN_DB": str(db)}
    cmd = [sys.executable, "-m", "graphrun.cli", "run", str(root)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    store = SqliteStore(db) if db.exists() else None
    while True:
        assert time.monotonic() < deadline, "the fast branch never finished"
        if db.exists():
            store = store or SqliteStore(db)
            runs = store.runs(limit=1)
            if runs:
                done = [
                    e
                    for e in store.read(runs[0].run_id)
                    if isinstance(e, ScriptFinished) and e.branch == "fast"
                ]
                # The slow branch's script has started too (on a busy machine it
                # may start after the fast one has finished).
                if done and marks.exists() and "slow-start" in marks.read_text().split():
                    break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    assert store is not None
    run_id = store.runs(limit=1)[0].run_id
    assert marks.read_text().splitlines().count("fast") == 1
    env["SLOW"] = "0"
    resumed = subprocess.run(
        [sys.executable, "-m", "graphrun.cli", "resume", run_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == ["fast", "slow"]
    lines = marks.read_text().splitlines()
    assert lines.count("fast") == 1  # the completed branch was not performed again
    assert lines.count("slow-start") == 2  # the in-flight one was
    events = store.read(run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    store.close()


EVERY_FEATURE = """
    name: every-feature
    version: "1.0"
    model: openai:gpt-test
    reasoning_effort: low
    inject_skill_instructions: false  # Loki's skill hint switch: acts, no warning
    colour: blue                    # unknown to graphrun and Loki alike: a warning
    variables:
      - {name: region, description: Where to look, default: north}
    settings: {max_concurrency: 2}
    reducers: {notes: append, total: sum, seen: merge}
    start: seed
    nodes:
      seed:
        type: script
        script: scripts/seed.py
        next: [count, ask_model]
      count:
        type: script
        script: scripts/count.py
        state_updates: {}
        next: each
      ask_model:
        type: llm
        prompt: "Name one river in {{region_hint}}"
        state_updates: {notes: "{{output}}"}
        next: each
      each:
        type: map
        over: "{{items}}"
        as: item
        branch: double
        collect_into: doubled
        max_concurrency: 3
        next: done
      double:
        type: script
        script: scripts/double.py
        state_updates: {}
      done:
        type: end
        output: "{{doubled}}|{{total}}|{{notes}}|{{seen}}"
"""
EVERY_SCRIPTS = {
    "seed.py": """
        import json, os
        region = os.environ.get("LLM_AGENT_VAR_REGION", "?")
        print(json.dumps({"items": [1, 2, 3, 4], "region_hint": region, "total": 1}))
    """,
    "count.py": emit({"total": 4, "notes": "counted", "seen": {"count": True}}),
    "double.py": DOUBLE,
}


def test_a_graph_with_every_parallel_feature_validates_and_runs(
    store: SqliteStore, tmp_path: Path
) -> None:
    from graphrun.runtime.graph.validate import Check, validate
    from tests.support.fake_llm import FakeLlm, text

    root = agent(tmp_path, EVERY_FEATURE, EVERY_SCRIPTS)
    found = validate(Check(load_graph(root), deep=False))
    assert [d.rule for d in found if d.severity == "error"] == []
    rules = {d.rule for d in found}
    assert "unknown-field" in rules and "not-implemented" not in rules

    with FakeLlm() as fake:
        fake.script(text("Glomma"))
        import os

        saved = {k: os.environ.get(k) for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY")}
        os.environ["OPENAI_BASE_URL"] = fake.url_openai
        os.environ["OPENAI_API_KEY"] = "sk-x"
        try:
            outcome = run(store, root)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        body = fake.requests[0].body
    assert outcome.status == "completed", outcome.error
    doubled, total, notes, seen = (outcome.output or "").split("|")
    assert json.loads(doubled) == [2, 4, 6, 8]
    assert total == "5"  # 1 + 4 through `sum`
    assert json.loads(notes) == ["Glomma", "counted"]  # node-id order: ask_model < count
    assert json.loads(seen) == {"count": True}
    assert "north" in body["messages"][-1]["content"]  # the variable's default reached it
    assert body.get("reasoning_effort") is None  # gpt-test takes none


def test_fork_inside_a_super_step_performs_only_the_unfinished_branch(graphrun) -> None:
    """`fork --at` a seq between two branches' results: the new run keeps the finished
    branch's recorded result and performs only the other one."""
    root = Path(__file__).resolve().parents[2]
    replay = root / "replays" / "source-survey.run.jsonl"
    assert (
        graphrun("import", str(replay), "--agent-dir", str(root / "examples/source-survey")).code
        == 0
    )
    run_id = graphrun("runs", "--json").json_lines()[0]["run_id"]
    events = graphrun("events", run_id, "--json").json_lines()
    summarized = next(
        e["seq"] for e in events if e["type"] == "LlmResult" and e.get("branch") == "summarize"
    )
    checked = next(
        e["seq"] for e in events if e["type"] == "ScriptFinished" and e.get("branch") == "check"
    )
    at = min(summarized, checked)  # one branch done, the other not yet
    forked = graphrun("fork", run_id, "--at", str(at), "--llm-replay", str(replay))
    assert forked.code == 0, forked.stderr
    assert "resumed (at: super-step 1 (check, summarize))" in forked.stderr
    new_id = graphrun.last_run()
    new_events = graphrun("events", new_id, "--json").json_lines()
    after = [e for e in new_events if e["seq"] > at]
    redone = {e.get("branch") for e in after if e["type"] in ("ScriptFinished", "LlmResult")}
    assert redone == ({"check"} if at == summarized else {"summarize"})
    original_output = next(e["output"] for e in events if e["type"] == "RunCompleted")
    assert new_events[-1]["type"] == "RunCompleted"
    assert new_events[-1]["output"] == original_output


def test_regression_against_a_changed_branch_reruns_only_that_branch(
    graphrun, fake_llm, tmp_path: Path
) -> None:
    """`replay --graph` reports the changed prompt of one branch of a step; `--live`
    performs that branch's call only and reuses every other recorded effect."""
    import shutil

    root = Path(__file__).resolve().parents[2]
    replay = root / "replays" / "source-survey.run.jsonl"
    changed = tmp_path / "changed"
    shutil.copytree(root / "examples" / "source-survey", changed)
    graph = changed / "graph.yaml"
    graph.write_text(graph.read_text().replace("in one paragraph:", "in one short paragraph:"))
    assert (
        graphrun("import", str(replay), "--agent-dir", str(root / "examples/source-survey")).code
        == 0
    )
    run_id = graphrun("runs", "--json").json_lines()[0]["run_id"]

    checked = graphrun("replay", run_id, "--graph", str(changed))
    assert checked.code == 1
    assert "node 'summarize'" in checked.stdout and "+Summarise these findings" in checked.stdout

    fake_llm.default = lambda request: text("A shorter summary.")
    live = graphrun(
        "replay", run_id, "--graph", str(changed), "--live", "--json",
        OPENAI_BASE_URL=fake_llm.url_openai, OPENAI_API_KEY="sk-x",
    )  # fmt: skip
    report = json.loads(live.stdout)["live"]
    assert report["status"] == "completed"
    assert report["output"].startswith("A shorter summary.")
    assert report["performed"] == ["summarize#1@summarize (request changed)"]
    assert len(report["reused"]) == 6  # plan, four map items, check
    assert len(fake_llm.requests) == 1
