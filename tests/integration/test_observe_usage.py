"""Token usage and cost in `show`, `runs --usage`, `logs --usage`; run budgets."""

from __future__ import annotations

import json

from tests.conftest import ROOT, GraphrunCli
from tests.support.fake_llm import FakeLlm, text

LLM_GRAPH = """
name: budgeted
version: "1.0"
model: openai:gpt-4o-mini
start: ask
settings:
  {settings}
nodes:
  ask:
    type: llm
    prompt: "Say hi to {{{{initial_prompt}}}}"
    state_updates: {{first: "{{{{output}}}}"}}
    next: again
  again:
    type: llm
    prompt: "Again"
    next: done
  done:
    type: end
    output: "{{{{first}}}}"
"""


def _graph(settings: str) -> str:
    return LLM_GRAPH.format(settings=settings)


def _recorded_usage(graphrun: GraphrunCli, run_id: str) -> tuple[int, int]:
    events = graphrun("events", run_id, "--json").json_lines()
    calls = [e for e in events if e["type"] == "LlmCalled"]  # type: ignore[index]
    inp = sum(e["usage"]["prompt_tokens"] for e in calls)  # type: ignore[index]
    out = sum(e["usage"]["completion_tokens"] for e in calls)  # type: ignore[index]
    return inp, out


def test_token_budget_fails_the_run_naming_the_budget(graphrun, agent, fake_llm: FakeLlm):
    fake_llm.script(text("hello", usage={"input": 120, "output": 30}), text("again"))
    path = agent(_graph("max_tokens: 100"))
    res = graphrun(
        "run", str(path), "Ada", OPENAI_BASE_URL=fake_llm.url_openai, OPENAI_API_KEY="sk-t"
    )
    assert res.code == 1, res.stderr
    assert len(fake_llm.requests) == 1  # the second node never ran
    run_id = graphrun.last_run()
    shown = graphrun("show", run_id, "--json").json()
    assert shown["status"] == "failed"  # type: ignore[index]
    assert shown["error"] == (  # type: ignore[index]
        "node 'ask': token budget exceeded: 150 tokens used, settings.max_tokens is 100"
    )
    assert "settings.max_tokens" in res.stderr


def test_cost_budget_uses_the_price_table_from_config(graphrun, agent, fake_llm: FakeLlm):
    config = graphrun.tmp_path / "_config"
    config.mkdir(exist_ok=True)
    (config / "config.yaml").write_text(
        "prices:\n  openai:gpt-4o-mini: {input_price: 1000, output_price: 2000}\n",
        encoding="utf-8",
    )
    fake_llm.script(text("hello", usage={"input": 100, "output": 50}), text("again"))
    path = agent(_graph("max_cost: 0.1"))
    res = graphrun(
        "run", str(path), "Ada", OPENAI_BASE_URL=fake_llm.url_openai, OPENAI_API_KEY="sk-t"
    )
    assert res.code == 1, res.stderr
    shown = graphrun("show", graphrun.last_run(), "--json").json()
    # 100 * 1000 / 1e6 + 50 * 2000 / 1e6 = 0.2 USD
    assert shown["error"] == (  # type: ignore[index]
        "node 'ask': cost budget exceeded: 0.200000 USD spent, settings.max_cost is 0.1 USD"
    )


def test_within_budget_completes(graphrun, agent, fake_llm: FakeLlm):
    fake_llm.script(text("hello", usage={"input": 10, "output": 5}), text("again"))
    path = agent(_graph("max_tokens: 1000"))
    res = graphrun(
        "run", str(path), "Ada", OPENAI_BASE_URL=fake_llm.url_openai, OPENAI_API_KEY="sk-t"
    )
    assert res.code == 0, res.stderr


def test_show_and_runs_usage_equal_the_recorded_usage(graphrun: GraphrunCli):
    res = graphrun("import", str(ROOT / "replays" / "research-desk.run.jsonl"))
    assert res.code == 0, res.stderr
    rows = graphrun("runs", "--json").json_lines()
    parent = next(r for r in rows if not r["parent_run_id"])  # type: ignore[index]
    child = next(r for r in rows if r["parent_run_id"])  # type: ignore[index]
    p_in, p_out = _recorded_usage(graphrun, parent["run_id"])  # type: ignore[index]
    c_in, c_out = _recorded_usage(graphrun, child["run_id"])  # type: ignore[index]
    assert p_in + p_out > 0 and c_in + c_out > 0

    shown = graphrun("show", parent["run_id"], "--json").json()  # type: ignore[index]
    assert shown["usage"]["input_tokens"] == p_in  # type: ignore[index]
    assert shown["usage"]["output_tokens"] == p_out  # type: ignore[index]
    assert shown["tree_usage"]["total_tokens"] == p_in + p_out + c_in + c_out  # type: ignore[index]
    per_node = sum(u["total_tokens"] for u in shown["node_usage"].values())  # type: ignore[index]
    assert per_node == p_in + p_out
    assert parent["tree_usage"] == shown["tree_usage"]  # type: ignore[index]
    assert child["usage"]["total_tokens"] == c_in + c_out  # type: ignore[index]

    table = graphrun("runs", "--usage").stdout.splitlines()
    assert table[0].split()[-5:] == ["BY", "TOKENS", "COST", "TREE", "TOKENS"]
    line = next(row for row in table if row.startswith(parent["run_id"]))  # type: ignore[index]
    assert line.split()[-3] == str(p_in + p_out)
    assert line.split()[-1] == str(p_in + p_out + c_in + c_out)

    text_show = graphrun("show", parent["run_id"]).stdout  # type: ignore[index]
    assert f"usage: {p_in + p_out} tokens ({p_in} in, {p_out} out)" in text_show
    total = p_in + p_out + c_in + c_out
    assert f"usage with child runs: {total} tokens" in text_show

    logs = graphrun("logs", parent["run_id"], "--usage", "--json").json()  # type: ignore[index]
    assert logs["usage"]["total_tokens"] == total  # type: ignore[index]


def test_runs_and_show_json_share_one_shape(graphrun: GraphrunCli):
    graphrun("import", str(ROOT / "replays" / "ticket-triage.run.jsonl"))
    row = graphrun("runs", "--json").json_lines()[0]
    shown = graphrun("show", row["run_id"], "--json").json()  # type: ignore[index]
    assert isinstance(row, dict) and isinstance(shown, dict)
    missing = set(row) - set(shown) - {"last_hash", "agent_dir"}
    assert not missing
    for key in ("run_id", "graph", "status", "parent_run_id", "waiting", "usage", "tree_usage"):
        assert json.dumps(row[key], sort_keys=True) == json.dumps(shown[key], sort_keys=True), key


PARALLEL_LLM = """
name: parallel-budget
version: "1.0"
model: openai:gpt-4o-mini
start: fan
settings:
  max_tokens: 100
nodes:
  fan:
    type: script
    script: scripts/fan.py
    next: [left, right]
  left:
    type: llm
    prompt: "left"
    state_updates: {l: "{{output}}"}
    next: join
  right:
    type: llm
    prompt: "right"
    state_updates: {r: "{{output}}"}
    next: join
  join:
    type: end
    output: "{{l}} {{r}}"
"""


def test_a_parallel_step_over_budget_fails_the_run(graphrun, agent, fake_llm: FakeLlm):
    fake_llm.script(
        text("one", usage={"input": 50, "output": 30}),
        text("two", usage={"input": 50, "output": 30}),
    )
    path = agent(PARALLEL_LLM, {"scripts/fan.py": "print('{}')\n"})
    res = graphrun(
        "run", str(path), "go", OPENAI_BASE_URL=fake_llm.url_openai, OPENAI_API_KEY="sk-t"
    )
    assert res.code == 1, res.stderr
    assert len(fake_llm.requests) == 2
    shown = graphrun("show", graphrun.last_run(), "--json").json()
    assert shown["error"] == (  # type: ignore[index]
        "token budget exceeded: 160 tokens used, settings.max_tokens is 100"
    )
    assert "join" not in [p["node"] for p in shown["path"]]  # type: ignore[index]
