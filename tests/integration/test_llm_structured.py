"""output_schema on llm nodes through ``graphrun run``: fast path, extractor, merging."""

from __future__ import annotations

import json

from tests.support.fake_llm import text

SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"type": "string"},
        "items": {"type": "array", "items": {"type": "string"}},
        "priority": {"type": "string", "enum": ["low", "medium", "high"]},
    },
    "required": ["action", "items", "priority"],
}

GRAPH = f"""
name: structured
version: "1.0"
model: openai:gpt-test
start: extract
nodes:
  extract:
    type: llm
    instructions: "You are a task parser."
    prompt: 'Parse this task description: "{{{{initial_prompt}}}}"'
    output_schema: {json.dumps(SCHEMA)}
    fallback: unparsed
    state_updates:
      priority: "urgent-{{{{output.priority}}}}"
      first: "{{{{items[0]}}}}"
      failure: "{{{{output}}}}"
    next: done
  unparsed:
    type: end
    output: "could not parse: {{{{failure}}}}"
  done:
    type: end
    output: "{{{{action}}}} {{{{items}}}} {{{{priority}}}} first={{{{first}}}}"
"""


def _run(graphrun, agent, fake_llm, *replies):  # type: ignore[no-untyped-def]
    fake_llm.script(*replies)
    return graphrun(
        "run", str(agent(GRAPH)), "Buy milk and eggs, urgent",
        OPENAI_BASE_URL=fake_llm.url_openai, OPENAI_API_KEY="sk-x",
    )  # fmt: skip


def test_fast_path_merges_and_explicit_updates_win(graphrun, agent, fake_llm):
    result = _run(
        graphrun,
        agent,
        fake_llm,
        text('{"action": "buy", "items": ["milk", "eggs"], "priority": "high"}'),
    )
    assert result.code == 0, result.stderr
    # action/items auto-merged; priority set by both: the explicit state_update wins
    assert result.stdout.strip() == 'buy ["milk","eggs"] urgent-high first=milk'
    assert len(fake_llm.requests) == 1  # no extractor call


def test_malformed_json_is_repaired_by_the_extractor(graphrun, agent, fake_llm):
    result = _run(
        graphrun,
        agent,
        fake_llm,
        text('Sure! {"action": "buy", "items": ["milk", "eggs"], priority: high'),
        text('{"action": "buy", "items": ["milk", "eggs"], "priority": "high"}'),
    )
    assert result.code == 0, result.stderr
    assert result.stdout.strip() == 'buy ["milk","eggs"] urgent-high first=milk'
    _main, extract = fake_llm.requests
    system = extract.body["messages"][0]
    assert system["role"] == "system"
    assert system["content"].endswith("Schema:\n" + json.dumps(SCHEMA, indent=2))
    # the extractor sees the model's reply, and no sampling settings
    assert extract.body["messages"][1] == {
        "role": "user",
        "content": 'Sure! {"action": "buy", "items": ["milk", "eggs"], priority: high',
    }
    events = graphrun("events", graphrun.last_run(), "--json").json_lines()
    purposes = [e.get("purpose", "main") for e in events if e["type"] == "LlmCalled"]  # type: ignore[union-attr,index]
    assert purposes == ["main", "extract"]


def test_extractor_failure_routes_to_fallback(graphrun, agent, fake_llm):
    result = _run(
        graphrun,
        agent,
        fake_llm,
        text("I think you should buy milk."),
        text('{"action": "buy"}'),  # extractor: misses required keys
        text('{"action": "buy", "items": "milk", "priority": "high"}'),  # repair: wrong type
    )
    assert result.code == 0, result.stderr
    assert len(fake_llm.requests) == 3
    assert result.stdout.strip() == (
        "could not parse: LLM node failed: structured output extraction failed: "
        "output does not match the schema at $.items: 'milk' is not of type 'array'"
    )
    repair = fake_llm.requests[2].body["messages"]
    assert repair[-2] == {"role": "assistant", "content": '{"action": "buy"}'}
    assert repair[-1]["content"].startswith("That reply cannot be used:")
