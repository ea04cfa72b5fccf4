"""Bad LLM configuration is caught before a run starts: exit 2, nothing in the log."""

from __future__ import annotations

from pathlib import Path

ANTHROPIC_KEY = "sk-ant-preflight-5e6f7a8b9c"
TOOLS_PY = '''
def lookup_order(order_id: str) -> str:
    """Look up an order."""
    return order_id
'''


def _graph(model: str, *, tools: str = "", validate: bool = True) -> str:
    return f"""\
name: preflight
version: "1.0"
settings:
  validate_before_run: {"true" if validate else "false"}
start: first
nodes:
  first:
    type: llm
    model: anthropic:claude-test
    prompt: "hi"
    next: second
  second:
    type: llm
    model: {model}
    prompt: "hello"{tools}
    next: done
  done:
    type: end
    output: "ok"
"""


def _no_runs(graphrun) -> None:  # type: ignore[no-untyped-def]
    listed = graphrun("runs", "--json")
    assert listed.code == 0, listed.stderr
    assert listed.stdout.strip() == ""  # no RunStarted was appended


def _one_line_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_unknown_provider_is_rejected_before_the_run(graphrun, agent):
    root = agent(_graph("mistral:large"))
    result = graphrun("run", str(root), "x", ANTHROPIC_API_KEY=ANTHROPIC_KEY)
    assert result.code == 2
    line = _one_line_error(result.stderr)
    assert "graph.yaml:14 ($.nodes.second.model)" in line
    assert "unknown LLM provider or client 'mistral'" in line
    _no_runs(graphrun)


def test_unknown_client_is_rejected_even_without_validation(graphrun, agent):
    root = agent(_graph("ollama:llama3", validate=False))
    result = graphrun("run", str(root), "x", ANTHROPIC_API_KEY=ANTHROPIC_KEY)
    assert result.code == 2
    line = _one_line_error(result.stderr)
    assert "llm node 'second'" in line
    assert "unknown LLM provider or client 'ollama'" in line
    _no_runs(graphrun)


def test_configured_client_is_known(graphrun, agent, fake_llm, tmp_path: Path):
    config = tmp_path / "cfg"
    config.mkdir()
    (config / "config.yaml").write_text(
        "clients:\n"
        "  - type: openai-compatible\n"
        "    name: ollama\n"
        f"    api_base: {fake_llm.url_openai}\n"
        "    models:\n"
        "      - name: llama3\n"
        "        real_name: llama3.1:8b\n"
    )
    root = agent(_graph("ollama:llama3"))
    result = graphrun(
        "run", str(root), "x", "--config-dir", str(config),
        ANTHROPIC_BASE_URL=fake_llm.url_anthropic,
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert [r.body["model"] for r in fake_llm.requests] == ["claude-test", "llama3.1:8b"]
    assert "authorization" not in fake_llm.requests[1].headers  # a local server needs no key


def test_missing_key_is_named_never_echoed(graphrun, agent):
    # anthropic has its key; openai (official endpoint) has none
    root = agent(_graph("openai:gpt-4o-mini"))
    result = graphrun("run", str(root), "x", ANTHROPIC_API_KEY=ANTHROPIC_KEY)
    assert result.code == 2
    line = _one_line_error(result.stderr)
    assert "llm node 'second'" in line
    assert "OPENAI_API_KEY is not set" in line
    assert ANTHROPIC_KEY not in result.stderr + result.stdout
    _no_runs(graphrun)


def test_missing_key_for_the_graph_default_model(graphrun, agent):
    root = agent(
        """
        name: nokey
        version: "1.0"
        model: anthropic:claude-test
        start: a
        nodes:
          a: {type: llm, prompt: "hi", next: b}
          b: {type: llm, prompt: "again", next: done}
          done: {type: end, output: "ok"}
        """
    )
    result = graphrun("run", str(root), "x")
    assert result.code == 2
    line = _one_line_error(result.stderr)
    assert "llm nodes 'a', 'b'" in line
    assert "ANTHROPIC_API_KEY is not set" in line
    _no_runs(graphrun)


def test_unknown_tool_in_whitelist_names_node_and_line(graphrun, agent):
    root = agent(
        _graph("anthropic:claude-test", tools="\n    tools: [lookup_order, refund_order]"),
        {"tools.py": TOOLS_PY},
    )
    result = graphrun("run", str(root), "x", ANTHROPIC_API_KEY=ANTHROPIC_KEY)
    assert result.code == 2
    assert "Traceback" not in result.stderr
    line = _one_line_error(result.stderr)
    assert "graph.yaml:16 ($.nodes.second.tools)" in line
    assert "llm node 'second': unknown tool 'refund_order'" in line
    _no_runs(graphrun)
    validated = graphrun("validate", str(root))
    assert validated.code == 2
    assert "graph.yaml:16" in validated.stderr


def test_unknown_llm_replay_source_is_rejected(graphrun, agent):
    root = agent(_graph("openai:gpt-4o-mini"))
    missing = graphrun("run", str(root), "x", "--llm-replay", "no-such-run")
    assert missing.code == 2
    assert "no-such-run" in _one_line_error(missing.stderr)
    _no_runs(graphrun)
