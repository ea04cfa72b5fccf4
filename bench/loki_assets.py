"""Run every agent of a Loki (or Coyote) ``assets/`` directory through graphrun, unchanged.

    python bench/loki_assets.py --assets /path/to/loki/assets [--agent NAME ...]

The assets are copied to a temporary config directory (nothing of Loki's is kept
or committed) with a ``config.yaml`` whose default model is a client pointing at
a local OpenAI-compatible server (tests/support/fake_llm.py on 127.0.0.1). Each
agent gets one turn: the model calls one of the bash tools it was offered —
``fs_write`` (writing a file) when the agent has it, else ``fs_ls``/``fs_read``/
``fs_cat``, else its first tool — then answers. A row per agent says whether the
run completed, which tool ran, and whether its side effect was observed (the
file written, or non-empty tool output). Agents that need the internet (web
search, Jira, ...) still run: only their tools' results differ.

``--offline-mcp`` replaces every server of ``functions/mcp.json`` by the test MCP
server (tests/support/mcp_server.py), for agents whose servers need the internet.

Exit 0 when every agent completed its turn and its tool really ran.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.fake_llm import FakeLlm, RecordedRequest, Reply, text, tool_calls  # noqa: E402

PREFERRED = ("fs_write", "execute_command", "fs_ls", "fs_read", "fs_cat", "get_current_time")


def _arguments(spec: dict[str, Any], scratch: Path) -> dict[str, Any]:
    params = spec.get("parameters") or {}
    args: dict[str, Any] = {}
    for name in params.get("required") or []:
        schema = (params.get("properties") or {}).get(name) or {}
        kind = schema.get("type")
        if "enum" in schema:
            args[name] = schema["enum"][0]
        elif kind == "integer" or kind == "number":
            args[name] = 1
        elif kind == "boolean":
            args[name] = True
        elif kind == "array":
            args[name] = ["x"]
        elif name == "command":
            args[name] = f"echo graphrun > {scratch / 'written.txt'} && echo wrote it"
        elif "path" in name or name in ("file", "dir", "directory"):
            args[name] = (
                str(scratch / "written.txt") if spec["name"] == "fs_write" else str(scratch)
            )
        else:
            args[name] = "written by graphrun"
    return args


def _variables(agent_dir: Path) -> dict[str, str]:
    """``<AGENT>_VARIABLES`` giving a value to each variable without a default (Loki
    would prompt for those)."""
    import yaml

    path = agent_dir / "config.yaml"
    if not path.is_file():
        return {}
    config = yaml.safe_load(path.read_text()) or {}
    missing = {
        v["name"]: f"graphrun-{v['name']}"
        for v in config.get("variables") or []
        if isinstance(v, dict) and "name" in v and v.get("default") is None
    }
    if not missing:
        return {}
    name = str(config.get("name") or agent_dir.name).upper().replace("-", "_")
    return {f"{name}_VARIABLES": json.dumps(missing)}


def run_agent(graphrun: list[str], config: Path, agent: str, scratch: Path) -> dict[str, Any]:
    chosen: dict[str, Any] = {}

    def answer(request: RecordedRequest) -> Reply:
        messages = request.body.get("messages") or []
        if any(m.get("role") == "tool" for m in messages):
            chosen["result"] = next(m for m in messages if m.get("role") == "tool")["content"]
            return text("done")
        tools = {t["function"]["name"]: t["function"] for t in request.body.get("tools") or []}
        if not tools:
            chosen["no_tools"] = True
            return text("done (no tools offered)")
        name = next((n for n in PREFERRED if n in tools), None)
        plain = [n for n in tools if not n.startswith(("mcp_", "user__", "todo__"))]
        if name is None and not plain:  # only MCP servers: search one, as Loki's prompts do
            name = next(n for n in tools if n.startswith("mcp_search_"))
            chosen["tool"] = name
            return tool_calls((name, {"query": "add two numbers"}))
        name = name or plain[0]
        chosen["tool"] = name
        return tool_calls((name, _arguments(tools[name], scratch)))

    with FakeLlm() as fake:
        fake.default = answer
        (config / ".env").write_text(f"LOKI_ASSETS_API_BASE={fake.url_openai}\n")
        env = {
            **os.environ,
            "GRAPHRUN_CONFIG_DIR": str(config),
            "GRAPHRUN_DB": str(scratch / "events.db"),
            "OPENAI_API_KEY": "sk-loki-assets-check",
        }
        env.pop("GRAPHRUN_AGENTS_DIR", None)
        env.update(_variables(config / "agents" / agent))
        proc = subprocess.run(
            [*graphrun, "run", agent, "Please do one small thing with your tools."],
            capture_output=True,
            text=True,
            env=env,
            timeout=180,
            cwd=scratch,
            stdin=subprocess.DEVNULL,
        )
    tool = chosen.get("tool")
    result = str(chosen.get("result", ""))
    failed = result.startswith(f"tool '{tool}'")  # graphrun's message for a failed tool
    if tool in ("fs_write", "execute_command"):
        effect = (scratch / "written.txt").is_file()
    else:
        effect = bool(result.strip()) and result.strip() != "DONE" and not failed
    if chosen.get("no_tools"):
        effect, result = True, "(the agent has no tools)"
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    return {
        "agent": agent,
        "exit": proc.returncode,
        "tool": tool,
        "effect": effect,
        "result": result[:300].replace("\n", " "),
        "error": last if proc.returncode else "",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assets", required=True, type=Path, help="Loki's assets directory")
    parser.add_argument("--agent", action="append", help="only these agents")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--offline-mcp",
        action="store_true",
        help="serve every mcp.json server with tests/support/mcp_server.py (no internet)",
    )
    options = parser.parse_args()
    graphrun = [sys.executable, "-m", "graphrun.cli"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="graphrun-loki-") as tmp:
        config = Path(tmp) / "config"
        shutil.copytree(options.assets, config, symlinks=True)
        (config / "config.yaml").write_text(
            "model: local:test-model\n"
            "clients:\n"
            "  - type: openai-compatible\n"
            "    name: local\n"
            "    api_base: '{{LOKI_ASSETS_API_BASE}}'\n"
        )
        mcp_json = config / "functions" / "mcp.json"
        if options.offline_mcp and mcp_json.is_file():
            servers = json.loads(mcp_json.read_text()).get("mcpServers") or {}
            stub = {"command": sys.executable, "args": [str(ROOT / "tests/support/mcp_server.py")]}
            mcp_json.write_text(json.dumps({"mcpServers": {name: stub for name in servers}}))
        agents = sorted(
            p.name
            for p in (config / "agents").iterdir()
            if p.is_dir() and not p.name.startswith(".")
        )
        for agent in options.agent or agents:
            scratch = Path(tmp) / "work" / agent
            scratch.mkdir(parents=True)
            rows.append(run_agent(graphrun, config, agent, scratch))
    if options.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            status = "ok " if row["exit"] == 0 and row["effect"] else "BAD"
            print(
                f"{status} {row['agent']:<20} exit={row['exit']} tool={row['tool']} "
                f"effect={row['effect']} {row['error'] or row['result']}"
            )
        good = sum(1 for r in rows if r["exit"] == 0 and r["effect"])
        print(f"{good}/{len(rows)} agents completed a turn with a tool that really ran")
    return 0 if all(r["exit"] == 0 and r["effect"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
