"""MCP servers from ``functions/mcp.json`` as tools of llm nodes and LLM-loop agents.

The server is a real child process (tests/support/mcp_server.py) spoken to over stdio.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from tests.conftest import ROOT, GraphrunCli, write_agent
from tests.support.fake_llm import FakeLlm, text, tool_calls

SERVER = str(ROOT / "tests" / "support" / "mcp_server.py")


def write_mcp_json(config_dir: Path, servers: dict[str, dict]) -> None:  # type: ignore[type-arg]
    path = config_dir / "functions" / "mcp.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": servers}), encoding="utf-8")


def calc_server() -> dict[str, object]:
    return {
        "command": sys.executable,
        "args": [SERVER],
        "env": {"GRAPHRUN_TEST_VALUE": "from-json"},
    }


def llm_env(fake: FakeLlm) -> dict[str, str]:
    return {"OPENAI_BASE_URL": fake.url_openai, "OPENAI_API_KEY": "sk-test"}


def events(graphrun: GraphrunCli, run_id: str) -> list[dict]:  # type: ignore[type-arg]
    return graphrun("events", run_id, "--json").json_lines()  # type: ignore[return-value]


def loop_agent(root: Path, config: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text(textwrap.dedent(config).lstrip(), encoding="utf-8")
    return root


def test_loop_agent_calls_an_mcp_tool_and_the_log_shows_it(
    graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    config_dir = tmp_path / "_config"
    write_mcp_json(config_dir, {"calc": calc_server()})
    agent = loop_agent(
        tmp_path / "adder",
        """\
        model: openai:gpt-test
        instructions: |
          Add numbers with these tools:
          {{__tools__}}
        mcp_servers:
          - calc
        """,
    )
    fake_llm.script(
        tool_calls(
            ("mcp_invoke_calc", {"tool": "add", "arguments": {"a": 2, "b": 3}}),
            ("mcp_invoke_calc", {"tool": "process_info", "arguments": {}}),
        ),
        text("2 + 3 = 5"),
    )

    res = graphrun("run", str(agent), "What is 2 + 3?", **llm_env(fake_llm))

    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "2 + 3 = 5"
    first = fake_llm.requests[0].body
    offered = sorted(
        t["function"]["name"] for t in first["tools"] if "__" not in t["function"]["name"]
    )
    # As Loki offers a server to its agents: three meta-functions (next to its built-ins).
    assert offered == ["mcp_describe_calc", "mcp_invoke_calc", "mcp_search_calc"]
    assert "- mcp_search_calc: Find candidate tools by keywords" in first["messages"][0]["content"]
    called = [e for e in events(graphrun, graphrun.last_run()) if e["type"] == "ToolCalled"]
    assert [(e["name"], e["source"]) for e in called] == [
        ("mcp_invoke_calc", "mcp:calc"),
        ("mcp_invoke_calc", "mcp:calc"),
    ]
    assert called[0]["result"] == "5"
    info = json.loads(called[1]["result"])
    assert info["value"] == "from-json"  # the server got mcp.json's env
    assert not any(e.get("is_error") for e in called)
    assert "▸ tool: mcp_invoke_calc" in res.stderr


def test_graph_llm_node_with_an_mcp_whitelist_and_offline_replay(
    graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    config_dir = tmp_path / "_config"
    write_mcp_json(config_dir, {"calc": calc_server()})
    agent = write_agent(
        tmp_path / "sums",
        """\
        name: sums
        version: "1.0"
        model: openai:gpt-test
        mcp_servers: [calc]
        start: add
        nodes:
          add:
            type: llm
            prompt: "{{initial_prompt}}"
            tools: [mcp:calc]
            state_updates:
              answer: "{{output}}"
            next: done
          done:
            type: end
            output: "{{answer}}"
        """,
    )
    fake_llm.script(tool_calls(("calc_add", {"a": 40, "b": 2})), text("42"))

    res = graphrun("run", str(agent), "40 + 2?", **llm_env(fake_llm))

    assert res.code == 0, res.stderr
    run_id = graphrun.last_run()
    called = [e for e in events(graphrun, run_id) if e["type"] == "ToolCalled"]
    assert [(e["node_id"], e["name"], e["result"]) for e in called] == [("add", "calc_add", "42")]
    # No MCP server and no LLM are needed to replay the run.
    (config_dir / "functions" / "mcp.json").unlink()
    fake_llm.stop()
    replayed = graphrun("replay", run_id)
    assert replayed.code == 0, replayed.stdout + replayed.stderr
    assert replayed.stderr.startswith(f"ok: run {run_id}:")


def test_a_server_that_fails_to_start_is_a_clear_error_naming_it(
    graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    write_mcp_json(
        tmp_path / "_config",
        {"broken": {"command": sys.executable, "args": ["-c", "import sys; sys.exit('no luck')"]}},
    )
    agent = loop_agent(
        tmp_path / "user",
        "model: openai:gpt-test\ninstructions: Use tools.\nmcp_servers: [broken]\n",
    )

    res = graphrun("run", str(agent), "go", **llm_env(fake_llm))

    assert res.code == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: run ")
    assert "MCP server 'broken' failed to start" in last
    assert "no luck" in last  # the server's stderr says why
    assert "Traceback" not in res.stderr
    assert fake_llm.requests == []  # the model was never called without its tools


def test_unknown_mcp_servers_are_validation_errors(graphrun: GraphrunCli, tmp_path: Path) -> None:
    write_mcp_json(tmp_path / "_config", {"calc": calc_server()})
    graph_level = write_agent(
        tmp_path / "graphlevel",
        """\
        name: graphlevel
        version: "1.0"
        model: openai:gpt-test
        mcp_servers: [calc, clac2]
        start: done
        nodes:
          done:
            type: end
        """,
    )
    node_level = write_agent(
        tmp_path / "nodelevel",
        """\
        name: nodelevel
        version: "1.0"
        model: openai:gpt-test
        start: ask
        nodes:
          ask:
            type: llm
            prompt: hi
            tools: [mcp:search]
            next: done
          done:
            type: end
        """,
    )
    loop = loop_agent(tmp_path / "loop", "model: openai:gpt-test\nmcp_servers:\n  - github\n")

    graph_res = graphrun("validate", str(graph_level))
    node_res = graphrun("validate", str(node_level))
    loop_res = graphrun("run", str(loop), "hi")

    mcp_json = tmp_path / "_config" / "functions" / "mcp.json"
    assert graph_res.code == 2
    assert (
        f"graph.yaml:4 ($.mcp_servers[1]): MCP server 'clac2' is not configured in {mcp_json} "
        "(did you mean 'calc'?)"
    ) in graph_res.stderr
    assert node_res.code == 2
    assert "llm node 'ask': unknown MCP server 'search' in tools entry 'mcp:search'" in (
        node_res.stderr
    )
    assert loop_res.code == 2
    assert loop_res.stderr.startswith(f"error: {loop / 'config.yaml'}:2 ")
    assert "MCP server 'github' is not configured in mcp.json" in loop_res.stderr
