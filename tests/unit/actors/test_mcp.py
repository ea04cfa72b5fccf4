"""MCP servers as tools, against a real server process over stdio."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphrun.actors.base import CancelToken
from graphrun.actors.tools.mcp import McpError, McpHub, load_mcp_config, mcp_tool_name
from graphrun.actors.tools.toolbox import ToolError, load_toolbox, validate_whitelist

SERVER = Path(__file__).resolve().parents[2] / "support" / "mcp_server.py"


def write_config(config_dir: Path, servers: dict[str, dict[str, object]]) -> Path:
    functions = config_dir / "functions"
    functions.mkdir(parents=True, exist_ok=True)
    (functions / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
    return config_dir


def stdio(**extra: object) -> dict[str, object]:
    return {"command": sys.executable, "args": [str(SERVER)], **extra}


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, McpHub]]:
    """One server, started once for the tests that only call it."""
    config_dir = write_config(
        tmp_path_factory.mktemp("config"),
        {"t": stdio(env={"GRAPHRUN_TEST_VALUE": "{{GRAPHRUN_MCP_SECRET}}"})},
    )
    os.environ["GRAPHRUN_MCP_SECRET"] = "s3cret"
    os.environ["GRAPHRUN_MCP_INHERITED"] = "from parent"
    hub = McpHub.from_config_dir(config_dir)
    try:
        yield config_dir, hub
    finally:
        hub.close()
        del os.environ["GRAPHRUN_MCP_SECRET"], os.environ["GRAPHRUN_MCP_INHERITED"]


def box(shared: tuple[Path, McpHub], *entries: str, **kwargs: object):
    config_dir, hub = shared
    agent = config_dir / "agent"
    agent.mkdir(exist_ok=True)
    return load_toolbox(
        agent,
        list(entries),
        mcp_servers=["t"],
        config_dir=config_dir,
        hub=hub,
        **kwargs,  # type: ignore[arg-type]
    )


def test_server_shorthand_lists_all_tools(shared: tuple[Path, McpHub]) -> None:
    specs = box(shared, "mcp:t").specs
    assert [(s.name, s.source) for s in specs] == [
        ("t_add", "mcp:t"),
        ("t_process_info", "mcp:t"),
        ("t_fail", "mcp:t"),
    ]
    add = specs[0]
    assert add.description == "Add two integers."
    assert add.parameters["properties"]["a"]["type"] == "integer"
    assert add.parameters["required"] == ["a", "b"]


def test_single_function_by_remote_or_exposed_name(shared: tuple[Path, McpHub]) -> None:
    assert [s.name for s in box(shared, "add").specs] == ["t_add"]
    assert [s.name for s in box(shared, "t_fail").specs] == ["t_fail"]


def test_call_returns_text(shared: tuple[Path, McpHub]) -> None:
    result = box(shared, "mcp:t").call("t_add", '{"a": 2, "b": 3}')
    assert (result.output, result.is_error, result.source) == ("5", False, "mcp:t")


def test_error_result(shared: tuple[Path, McpHub]) -> None:
    result = box(shared, "mcp:t").call("t_fail", '{"message": "disk full"}')
    assert result.is_error
    assert "disk full" in result.output


def test_placeholders_and_full_environment(shared: tuple[Path, McpHub]) -> None:
    toolbox = box(shared, "process_info")
    substituted = json.loads(toolbox.call("t_process_info", "{}").output)
    assert substituted["value"] == "s3cret"
    inherited = json.loads(
        toolbox.call("t_process_info", '{"env_name": "GRAPHRUN_MCP_INHERITED"}').output
    )
    assert inherited["value"] == "from parent"
    assert inherited["pid"] == substituted["pid"]  # one session per server, reused


def test_bad_arguments_go_back_to_the_model(shared: tuple[Path, McpHub]) -> None:
    result = box(shared, "add").call("t_add", "not json")
    assert result.is_error
    assert result.output.startswith("tool 't_add': the arguments are not valid JSON")


def test_call_timeout_and_cancel(shared: tuple[Path, McpHub]) -> None:
    toolbox = box(shared, "process_info")
    started = time.monotonic()
    result = toolbox.call("t_process_info", '{"delay": 30}', timeout=0.5)
    assert (result.output, result.is_error) == (
        "tool 'process_info' on MCP server 't' timed out after 0.5 s",
        True,
    )
    cancel = CancelToken()
    timer = threading.Timer(0.3, cancel.cancel, args=("node cancelled",))
    timer.start()
    try:
        result = toolbox.call("t_process_info", '{"delay": 30}', cancel=cancel)
    finally:
        timer.cancel()
    assert (result.output, result.is_error) == (
        "tool 'process_info' on MCP server 't' was cancelled (node cancelled)",
        True,
    )
    assert time.monotonic() - started < 10
    # The session survives both.
    assert toolbox.call("t_process_info", "{}").is_error is False


def test_unknown_server_entries(shared: tuple[Path, McpHub]) -> None:
    config_dir, _hub = shared
    errors = validate_whitelist(
        config_dir / "agent",
        ["mcp:tt", "mcp:other"],
        mcp_servers=["t", "other"],
        config_dir=config_dir,
    )
    assert errors == [
        "unknown MCP server 'tt' in tools entry 'mcp:tt' (did you mean 't'?)",
        "MCP server 'other' is not configured in mcp.json",
    ]


def test_unknown_function_suggests_mcp_names(shared: tuple[Path, McpHub]) -> None:
    with pytest.raises(ToolError) as info:
        box(shared, "t_ad")
    assert str(info.value) == "unknown tool 't_ad' in the tools whitelist (did you mean 't_add'?)"


def test_close_leaves_no_process(tmp_path: Path) -> None:
    config_dir = write_config(tmp_path, {"t": stdio()})
    hub = McpHub.from_config_dir(config_dir)
    [_add, info, _fail] = hub.tools("t")
    pid = json.loads(info.call("{}", cancel=None, timeout=10).output)["pid"]
    assert not gone(pid)
    hub.close()
    assert gone(pid)
    hub.close()  # idempotent
    with pytest.raises(McpError, match="the MCP hub is closed"):
        hub.tools("t")
    result = info.call("{}", cancel=None, timeout=10)
    assert (result.output, result.is_error) == (
        "tool 'process_info' on MCP server 't' failed: the MCP hub is closed",
        True,
    )


def test_function_on_two_servers_is_ambiguous(tmp_path: Path) -> None:
    config_dir = write_config(tmp_path, {"a": stdio(), "b": stdio()})
    with McpHub.from_config_dir(config_dir) as hub:
        errors = validate_whitelist(
            tmp_path,
            ["add"],
            mcp_servers=["a", "b"],
            config_dir=config_dir,
            hub=hub,
            start_mcp=True,
        )
        assert errors == [
            "tool 'add' is ambiguous: it is offered by mcp:a as 'a_add', mcp:b as 'b_add' "
            "(name the one you mean)"
        ]
        box = load_toolbox(
            tmp_path, ["b_add"], mcp_servers=["a", "b"], config_dir=config_dir, hub=hub
        )
        assert box.call("b_add", '{"a": 1, "b": 1}').output == "2"


def test_validation_does_not_start_servers_by_default(tmp_path: Path) -> None:
    config_dir = write_config(tmp_path, {"t": {"command": "/nonexistent/graphrun-mcp"}})
    assert (
        validate_whitelist(
            tmp_path, ["anything", "mcp:t"], mcp_servers=["t"], config_dir=config_dir
        )
        == []
    )


def test_missing_command_names_server_and_command(tmp_path: Path) -> None:
    config_dir = write_config(
        tmp_path, {"broken": {"command": "/nonexistent/graphrun-mcp", "args": ["--stdio"]}}
    )
    with McpHub.from_config_dir(config_dir) as hub, pytest.raises(ToolError) as info:
        load_toolbox(
            tmp_path, ["mcp:broken"], mcp_servers=["broken"], config_dir=config_dir, hub=hub
        )
    message = str(info.value)
    assert message.startswith(
        "MCP server 'broken' failed to start (command: /nonexistent/graphrun-mcp --stdio): "
    )
    assert "No such file or directory" in message


def test_server_that_exits_at_once(tmp_path: Path) -> None:
    script = "import sys; print('bad token', file=sys.stderr); sys.exit(1)"
    config_dir = write_config(
        tmp_path, {"dies": {"command": sys.executable, "args": ["-c", script]}}
    )
    with (
        McpHub.from_config_dir(config_dir, start_timeout=10) as hub,
        pytest.raises(McpError) as info,
    ):
        hub.tools("dies")
    message = str(info.value)
    assert message.startswith(f"MCP server 'dies' failed to start (command: {sys.executable} -c ")
    assert message.endswith("; stderr: bad token")


def test_missing_placeholder_variable(tmp_path: Path) -> None:
    config_dir = write_config(tmp_path, {"t": stdio(env={"TOKEN": "{{GRAPHRUN_UNSET_VAR}}"})})
    with McpHub.from_config_dir(config_dir, environ={}) as hub, pytest.raises(McpError) as info:
        hub.tools("t")
    assert str(info.value) == (
        "MCP server 't' uses {{GRAPHRUN_UNSET_VAR}} but the environment variable "
        "GRAPHRUN_UNSET_VAR is not set (export GRAPHRUN_UNSET_VAR=... before running)"
    )


def test_config_errors(tmp_path: Path) -> None:
    assert load_mcp_config(tmp_path) == {}
    write_config(tmp_path, {"x": {"args": []}})
    with pytest.raises(McpError) as info:
        load_mcp_config(tmp_path)
    assert str(info.value) == (
        f"{tmp_path / 'functions' / 'mcp.json'} ($.mcpServers.x): an MCP server needs exactly "
        "one of 'command' (stdio) or 'url' (HTTP)"
    )
    (tmp_path / "functions" / "mcp.json").write_text("{nope")
    with pytest.raises(McpError, match=r"mcp\.json: cannot read MCP configuration"):
        load_mcp_config(tmp_path)


def test_tool_names_are_sanitised() -> None:
    assert mcp_tool_name("pubmed-search", "search_articles") == "pubmed-search_search_articles"
    assert mcp_tool_name("my server", "get.item/v2") == "my_server_get_item_v2"
    long = mcp_tool_name("s" * 40, "t" * 40)
    assert len(long) == 64
    assert long.startswith("s" * 40 + "_" + "t" * 14 + "_")
    assert long != mcp_tool_name("s" * 40, "t" * 41)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_streamable_http_server(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(SERVER), "--http", str(port)],
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
                assert time.monotonic() < deadline, "the HTTP MCP server did not start"
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/mcp"
        config_dir = write_config(tmp_path, {"web": {"url": url, "headers": {"X-Key": "k"}}})
        with McpHub.from_config_dir(config_dir) as hub:
            toolbox = load_toolbox(
                tmp_path, ["mcp:web"], mcp_servers=["web"], config_dir=config_dir, hub=hub
            )
            assert [s.name for s in toolbox.specs] == ["web_add", "web_process_info", "web_fail"]
            result = toolbox.call("web_add", '{"a": 40, "b": 2}')
            assert (result.output, result.is_error, result.source) == ("42", False, "mcp:web")
            assert toolbox.call("web_fail", '{"message": "nope"}').is_error
    finally:
        server.terminate()
        server.wait(10)
