"""MCP as Loki configures it: stdio, streamable HTTP and SSE servers, Loki's ``env``
value types, servers started in parallel, Loki's meta-functions, keys withheld.

Every server is a real one (tests/support/mcp_server.py, the ``mcp`` SDK's own
servers) on 127.0.0.1; the model is the fake OpenAI server; the CLI runs in a
subprocess.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphrun.actors.tools.mcp import McpHub, load_mcp_config
from graphrun.actors.tools.toolbox import load_toolbox
from graphrun.eventstore import redaction
from tests.conftest import ROOT, GraphrunCli, write_agent
from tests.support.fake_llm import FakeLlm, text, tool_calls

SERVER = str(ROOT / "tests" / "support" / "mcp_server.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(flag: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, SERVER, flag, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"the {flag} MCP server did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/{'sse' if flag == '--sse' else 'mcp'}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    yield from serve("--http")


@pytest.fixture(scope="module")
def sse_url() -> Iterator[str]:
    yield from serve("--sse")


@pytest.fixture(autouse=True)
def _forget_secrets() -> Iterator[None]:
    yield
    redaction.clear()


def write_mcp(config_dir: Path, servers: dict[str, object]) -> Path:
    path = config_dir / "functions" / "mcp.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": servers}), encoding="utf-8")
    return config_dir


def three_servers(http_url: str, sse_url: str) -> dict[str, object]:
    return {
        "local": {
            "type": "stdio",
            "command": sys.executable,
            "args": [SERVER],
            "env": {"GRAPHRUN_TEST_VALUE": True, "MCP_NUMBER": 42},
        },
        "web": {"type": "http", "url": http_url},
        "stream": {"type": "sse", "url": sse_url, "headers": {"X-Test": "1"}},
    }


def test_lokis_env_value_types_and_bad_types(tmp_path: Path) -> None:
    config_dir = write_mcp(
        tmp_path, {"a": {"type": "stdio", "command": "x", "env": {"B": False, "N": 1.5}}}
    )
    assert dict(load_mcp_config(config_dir)["a"].env) == {"B": "false", "N": "1.5"}
    write_mcp(tmp_path, {"a": {"type": "sse", "command": "x"}})
    with pytest.raises(Exception) as caught:
        load_mcp_config(config_dir)
    assert str(caught.value) == (
        f"{config_dir / 'functions' / 'mcp.json'} ($.mcpServers.a): an MCP server of type "
        "'sse' needs 'url' and no 'command'"
    )


def test_three_transports_direct_and_meta(tmp_path: Path, http_url: str, sse_url: str) -> None:
    config_dir = write_mcp(tmp_path, three_servers(http_url, sse_url))
    servers = ["local", "web", "stream"]
    with McpHub.from_config_dir(config_dir) as hub:
        started = time.monotonic()
        box = load_toolbox(
            tmp_path,
            ["mcp:local", "mcp:web", "mcp:stream"],
            mcp_servers=servers,
            config_dir=config_dir,
            hub=hub,
        )
        assert time.monotonic() - started < 30
        for server in servers:
            result = box.call(f"{server}_add", '{"a": 40, "b": 2}')
            assert (result.output, result.is_error, result.source) == ("42", False, f"mcp:{server}")
        info = json.loads(box.call("local_process_info", "{}").output)
        assert info["value"] == "true"  # a JSON boolean reaches the server as Loki sends it
        meta = load_toolbox(
            tmp_path,
            ["mcp_search_stream", "mcp_describe_stream", "mcp_invoke_stream"],
            mcp_servers=servers,
            config_dir=config_dir,
            hub=hub,
        )
        found = json.loads(meta.call("mcp_search_stream", '{"query": "add integers"}').output)
        assert found[0] == {"name": "add", "server": "stream", "description": "Add two integers."}
        described = json.loads(meta.call("mcp_describe_stream", '{"tool": "add"}').output)
        assert described["properties"]["arguments"]["required"] == ["a", "b"]
        called = meta.call("mcp_invoke_stream", '{"tool": "add", "arguments": {"a": 1, "b": 2}}')
        assert (called.output, called.is_error) == ("3", False)
        missing = meta.call("mcp_describe_stream", '{"tool": "nope"}')
        assert missing.is_error and missing.output.startswith("nope not found in stream")


def test_stdio_servers_get_no_keys_unless_named(tmp_path: Path) -> None:
    key = "sk-mcp-secret-0123456789"
    servers = {
        "plain": {"type": "stdio", "command": sys.executable, "args": [SERVER]},
        "named": {
            "type": "stdio",
            "command": sys.executable,
            "args": [SERVER],
            "env": {"GRAPHRUN_TEST_VALUE": "{{OPENAI_API_KEY}}"},
        },
    }
    config_dir = write_mcp(tmp_path, servers)
    environ = {"OPENAI_API_KEY": key, "PATH": "/usr/bin:/bin"}
    with McpHub.from_config_dir(config_dir, environ=environ) as hub:
        box = load_toolbox(
            tmp_path,
            ["plain_process_info", "named_process_info"],
            mcp_servers=["plain", "named"],
            config_dir=config_dir,
            hub=hub,
        )
        plain = box.call("plain_process_info", '{"env_name": "OPENAI_API_KEY"}').output
        named = box.call("named_process_info", '{"env_name": "GRAPHRUN_TEST_VALUE"}').output
    assert json.loads(plain)["value"] is None
    assert json.loads(named)["value"] == "***"  # it got the key; the result never holds it


LOOP_AGENT = """\
    model: openai:gpt-test
    instructions: |
      Use the servers:
      {{__tools__}}
    mcp_servers: [local, web, stream]
"""


def test_loop_agent_gets_meta_functions_recorded_and_replayed(
    graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path, http_url: str, sse_url: str
) -> None:
    config_dir = write_mcp(tmp_path / "_config", three_servers(http_url, sse_url))
    agent = tmp_path / "mathy"
    agent.mkdir()
    (agent / "config.yaml").write_text(textwrap.dedent(LOOP_AGENT), encoding="utf-8")
    fake_llm.script(
        tool_calls(("mcp_search_web", {"query": "add"})),
        tool_calls(
            ("mcp_invoke_local", {"tool": "add", "arguments": {"a": 1, "b": 1}}),
            ("mcp_invoke_web", {"tool": "add", "arguments": {"a": 2, "b": 2}}),
            ("mcp_invoke_stream", {"tool": "add", "arguments": {"a": 3, "b": 3}}),
        ),
        text("2, 4, 6"),
    )
    env = {"OPENAI_BASE_URL": fake_llm.url_openai, "OPENAI_API_KEY": "sk-test-abcdef"}
    res = graphrun("run", str(agent), "add things", **env)
    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "2, 4, 6"
    first = fake_llm.requests[0].body
    offered = [t["function"]["name"] for t in first["tools"]]
    assert offered[:9] == [  # then Loki's built-ins
        f"{prefix}_{server}"
        for server in ("local", "web", "stream")
        for prefix in ("mcp_search", "mcp_describe", "mcp_invoke")
    ]
    assert (
        "- mcp_invoke_web: Invoke the specified tool on the web MCP server."
        in (first["messages"][0]["content"])
    )
    run_id = graphrun.last_run()
    called = [
        e for e in graphrun("events", run_id, "--json").json_lines() if e["type"] == "ToolCalled"
    ]
    assert [(e["name"], e["result"]) for e in called[1:]] == [
        ("mcp_invoke_local", "2"),
        ("mcp_invoke_web", "4"),
        ("mcp_invoke_stream", "6"),
    ]
    # Replayed from the log: no server, no model.
    (config_dir / "functions" / "mcp.json").unlink()
    fake_llm.stop()
    replayed = graphrun("replay", run_id)
    assert replayed.code == 0, replayed.stdout + replayed.stderr


def test_graph_llm_node_lists_and_calls_tools_of_three_transports(
    graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path, http_url: str, sse_url: str
) -> None:
    write_mcp(tmp_path / "_config", three_servers(http_url, sse_url))
    agent = write_agent(
        tmp_path / "sums",
        """\
        name: sums
        version: "1.0"
        model: openai:gpt-test
        temperature: 0.3
        mcp_servers: [local, web, stream]
        start: add
        nodes:
          add:
            type: llm
            prompt: "{{initial_prompt}}"
            tools: [mcp:local, mcp:web, mcp:stream]
            state_updates:
              answer: "{{output}}"
            next: done
          done:
            type: end
            output: "{{answer}}"
        """,
    )
    fake_llm.script(
        tool_calls(("local_add", {"a": 1, "b": 2}), ("stream_add", {"a": 3, "b": 4})),
        text("3 and 7"),
    )
    env = {"OPENAI_BASE_URL": fake_llm.url_openai, "OPENAI_API_KEY": "sk-test-abcdef"}
    res = graphrun("run", str(agent), "sum", **env)
    assert res.code == 0, res.stderr
    offered = sorted(t["function"]["name"] for t in fake_llm.requests[0].body["tools"])
    assert offered == sorted(
        f"{s}_{t}" for s in ("local", "web", "stream") for t in ("add", "process_info", "fail")
    )
    run_id = graphrun.last_run()
    called = [
        e for e in graphrun("events", run_id, "--json").json_lines() if e["type"] == "ToolCalled"
    ]
    assert [(e["name"], e["result"]) for e in called] == [("local_add", "3"), ("stream_add", "7")]
    fake_llm.stop()
    replayed = graphrun("replay", run_id)
    assert replayed.code == 0, replayed.stdout + replayed.stderr


def test_a_loki_layout_agent_sees_mcp_servers_as_lokis_meta_functions(
    tmp_path: Path, http_url: str
) -> None:
    # <config>/agents/<name> next to <config>/functions: Loki's layout, Loki's offer.
    config_dir = write_mcp(tmp_path / "config", {"web": {"type": "http", "url": http_url}})
    agent = write_agent(config_dir / "agents" / "helper", "name: helper\n")
    other = write_agent(tmp_path / "elsewhere" / "helper", "name: helper\n")
    with McpHub.from_config_dir(config_dir) as hub:
        loki = load_toolbox(agent, ["mcp:web"], mcp_servers=["web"], config_dir=config_dir, hub=hub)
        assert sorted(spec.name for spec in loki.specs) == [
            "mcp_describe_web",
            "mcp_invoke_web",
            "mcp_search_web",
        ]
        called = loki.call("mcp_invoke_web", '{"tool": "add", "arguments": {"a": 1, "b": 2}}')
        assert (called.output, called.is_error) == ("3", False)
        direct = load_toolbox(
            other, ["mcp:web"], mcp_servers=["web"], config_dir=config_dir, hub=hub
        )
        assert "web_add" in [spec.name for spec in direct.specs]
