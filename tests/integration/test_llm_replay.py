"""Recorded LLM runs: ``--llm-replay RUN|FILE`` and ``graphrun replay`` with no server."""

from __future__ import annotations

from tests.support.fake_llm import http_error, text, tool_calls

GRAPH = """
name: recorded
version: "1.0"
model: anthropic:claude-test
start: outline
nodes:
  outline:
    type: llm
    instructions: "You plan short talks."
    prompt: "Outline a talk about {{initial_prompt}}"
    max_attempts: 2
    tools: [word_count]
    state_updates:
      plan: "{{output}}"
    next: title
  title:
    type: llm
    model: openai:gpt-test
    temperature: 0.7
    prompt: "Title for: {{plan}}"
    output_schema:
      type: object
      properties: {title: {type: string}}
      required: [title]
    next: done
  done:
    type: end
    output: "{{title}}\\n{{plan}}"
"""

TOOLS_PY = '''
def word_count(text: str) -> int:
    """Count words."""
    return len(text.split())
'''

EXPECTED = "Wasm Beyond the Browser\n1. WASI 2. Edge 3. Plugins"


def _record(graphrun, agent, fake_llm) -> tuple[str, object]:  # type: ignore[no-untyped-def]
    root = agent(GRAPH, {"tools.py": TOOLS_PY}, name="recorded")
    fake_llm.script(
        http_error(429, "rate limit", retry_after=0),
        tool_calls(("word_count", {"text": "WASI Edge Plugins"})),
        text("1. WASI 2. Edge 3. Plugins"),
        text("Title: Wasm Beyond the Browser"),  # not JSON: the extractor runs
        text('{"title": "Wasm Beyond the Browser"}'),
    )
    result = graphrun(
        "run", str(root), "WebAssembly outside the browser",
        ANTHROPIC_BASE_URL=fake_llm.url_anthropic, ANTHROPIC_API_KEY="sk-ant-r",
        OPENAI_BASE_URL=fake_llm.url_openai, OPENAI_API_KEY="sk-r",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert result.stdout.strip() == EXPECTED
    assert len(fake_llm.requests) == 5
    fake_llm.stop()  # from here on nothing answers
    return graphrun.last_run(), root


def test_llm_replay_from_run_and_file_offline(graphrun, agent, fake_llm):
    run_id, root = _record(graphrun, agent, fake_llm)
    # no base URLs, no keys: only the recording answers
    again = graphrun("run", str(root), "WebAssembly outside the browser", "--llm-replay", run_id)
    assert again.code == 0, again.stderr
    assert again.stdout.strip() == EXPECTED

    exported = graphrun("export", run_id, "-o", "rec.run.jsonl")
    assert exported.code == 0, exported.stderr
    from_file = graphrun(
        "run", str(root), "WebAssembly outside the browser", "--llm-replay", "rec.run.jsonl"
    )
    assert from_file.code == 0, from_file.stderr
    assert from_file.stdout.strip() == EXPECTED

    # configured for other servers (a proxy prefix, another port): still the recording
    elsewhere = graphrun(
        "run", str(root), "WebAssembly outside the browser", "--llm-replay", "rec.run.jsonl",
        OPENAI_BASE_URL="http://127.0.0.1:9/proxy/openai/v1",
        ANTHROPIC_BASE_URL="http://127.0.0.1:9/proxy/anthropic",
    )  # fmt: skip
    assert elsewhere.code == 0, elsewhere.stderr
    assert elsewhere.stdout.strip() == EXPECTED


def test_llm_replay_unmatched_request_names_the_node(graphrun, agent, fake_llm):
    run_id, root = _record(graphrun, agent, fake_llm)
    result = graphrun("run", str(root), "Rust on microcontrollers", "--llm-replay", run_id)
    assert result.code == 1
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: run ")
    assert last.count("node 'outline'") == 1
    assert "no recorded LLM response matches POST /v1/messages (model 'claude-test')" in last
    assert "differs in messages" in last


def test_replay_of_an_llm_run_with_the_server_stopped(graphrun, agent, fake_llm):
    run_id, _ = _record(graphrun, agent, fake_llm)
    result = graphrun("replay", run_id)
    assert result.code == 0, result.stderr
    assert f"ok: run {run_id}" in result.stderr
    assert "reproduced; run completed" in result.stderr
