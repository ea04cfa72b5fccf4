"""Run every agent of a Loki (or Coyote) ``assets/`` directory through graphrun, unchanged.

    python bench/loki_assets.py --assets /path/to/loki/assets [--agent NAME ...] [--offline-mcp]

The assets are copied to a temporary config directory (nothing of Loki's is kept
or committed) with a ``config.yaml`` whose default model is a client pointing at
a local OpenAI-compatible server (tests/support/fake_llm.py on 127.0.0.1) and
whose ``rag_embedding_model`` is graphrun's offline embedder (``local:hash-384``).
Each agent runs once, in its own scratch directory (as Loki runs an agent in the
user's project). Each time the model is offered tools it calls one —
``fs_write``/``execute_command`` (writing ``written.txt``) when it has them, else
``fs_ls``/``fs_read``/``fs_cat``, else its first tool — then answers (with a
JSON value matching the schema when the node has an ``output_schema``).
Loki's built-ins are used as its prompts ask: ``skill__list`` then ``skill__load``
of the first skill listed; an orchestrator lists the agents it may spawn, spawns
(code-reviewer: file-reviewer; others: explore and coder, else the first listed)
and collects each (the row says which agents were collected, and how they ended).
Approval nodes are answered with their first option, input nodes with a line
(Loki would ask at the terminal). step-runner gets the plan repository its
README asks for (``plans/steps/01-first-step.md``).

A row per agent: the exit code, the tools that really ran (a result that is
neither graphrun's tool-failure message nor empty), the tools that only failed,
and the side effect observed (``written.txt`` written, or a tool's output).
Agents that need the internet (web search, Jira, ...) still run: only their
tools' results differ.

``--record DIR`` keeps the configuration and the projects in DIR and exports each
run to ``DIR/recordings/<agent>.run.jsonl`` (``graphrun test DIR/recordings``
then replays them, with or without the configuration directory).

``--offline-mcp`` serves every server of ``functions/mcp.json``, and every server
an agent names that mcp.json lacks (said in the row), with the test MCP server
(tests/support/mcp_server.py), for agents whose servers need the internet.
``--narration`` prints each run's narration and output.

Exit 0 when every agent completed and a tool of it really ran.
"""

from __future__ import annotations

import argparse
import contextlib
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

BUILTINS = ("user__", "todo__", "agent__", "skill__")
PREFERRED = (
    "fs_write",
    "execute_command",
    "fs_ls",
    "fs_read",
    "fs_cat",
    "get_current_time",
    "list_tables",
)


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


def _instance(schema: dict[str, Any]) -> Any:
    """The smallest value ``schema`` accepts (an llm node with ``output_schema``)."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties") or {}
        return {k: _instance(properties.get(k) or {}) for k in schema.get("required") or []}
    if kind == "array":
        return [_instance(schema.get("items") or {})] * int(schema.get("minItems") or 0)
    return {
        "string": "written by graphrun",
        "integer": 1,
        "number": 1,
        "boolean": False,
        "null": None,
    }.get(str(kind), "written by graphrun")


def _final(messages: list[dict[str, Any]]) -> str:
    """The model's last answer: a JSON value matching the schema graphrun put in the
    prompt (``Schema:`` and a JSON schema, for ``output_schema``), else plain text."""
    for message in reversed(messages):
        content = message.get("content")
        if isinstance(content, str) and "\nSchema:\n" in content:
            after = content.split("\nSchema:\n", 1)[1].lstrip()
            try:
                schema, _ = json.JSONDecoder().raw_decode(after)
            except ValueError:
                continue
            return json.dumps(_instance(schema))
    return "done"


def _mcp_servers(agent_dir: Path) -> list[str]:
    """The MCP servers an agent's graph.yaml or config.yaml names."""
    import yaml

    for name in ("graph.yaml", "config.yaml"):
        path = agent_dir / name
        if path.is_file():
            data = yaml.safe_load(path.read_text()) or {}
            return [str(s) for s in data.get("mcp_servers") or [] if isinstance(s, str)]
    return []


def _variables(agent_dir: Path, scratch: Path) -> dict[str, str]:
    """``<AGENT>_VARIABLES`` giving a value to each variable without a default (Loki
    would prompt for those); a ``dsn`` is a SQLite database made in ``scratch``."""
    import sqlite3

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
    if "dsn" in missing:
        database = scratch / "graphrun.db"
        with sqlite3.connect(database) as conn:
            conn.execute("create table if not exists notes (body text)")
            conn.execute("insert into notes values ('written by graphrun')")
        conn.close()
        missing["dsn"] = f"sqlite3:{database}"
    name = str(config.get("name") or agent_dir.name).upper().replace("-", "_")
    return {f"{name}_VARIABLES": json.dumps(missing)}


def _plan_repo(scratch: Path) -> None:
    """The plan repository step-runner's README asks for, in the project it is
    started in: ``plans/steps/NN-<slug>.md`` with frontmatter."""
    steps = scratch / "plans" / "steps"
    steps.mkdir(parents=True)
    (steps / "01-first-step.md").write_text(
        "---\nstep: 1\ntitle: First step\nstatus: pending\n---\n\n"
        "# First step\n\nWrite written.txt in the project.\n"
    )


#: What an agent expects to find in the project it is started in (Loki runs agents
#: from the project's directory; the bench runs each agent in its scratch dir).
PROJECTS = {"step-runner": _plan_repo}


def _answers(agent_dir: Path) -> list[str]:
    """``--answer`` options for a graph's approval and input nodes (Loki would ask
    at the terminal): each approval takes its first option, each input a line."""
    import yaml

    path = agent_dir / "graph.yaml"
    if not path.is_file():
        return []
    nodes = (yaml.safe_load(path.read_text()) or {}).get("nodes") or {}
    out = []
    for node_id, node in nodes.items():
        if not isinstance(node, dict):
            continue
        if node.get("type") == "approval" and node.get("options"):
            out += ["--answer", f"{node_id}={node['options'][0]}"]
        elif node.get("type") == "input":
            out += ["--answer", f"{node_id}=written by graphrun"]
    return out


def _ok(name: str, result: str) -> bool:
    """Whether a tool's result shows it really ran (graphrun's failure message is
    ``tool '<name>' ...``; an empty result reads ``DONE``)."""
    result = result.strip()
    return bool(result) and result != "DONE" and not result.startswith(f"tool '{name}'")


def _called(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], Any]]:
    """Every tool call of the conversation so far: (name, arguments, parsed result)."""
    results = {m.get("tool_call_id"): m.get("content") for m in messages if m.get("role") == "tool"}
    out = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            raw = results.get(call["id"])
            try:
                value = json.loads(raw) if isinstance(raw, str) else raw
            except ValueError:
                value = raw
            try:
                arguments = json.loads(call["function"].get("arguments") or "{}")
            except ValueError:
                arguments = {}
            out.append((call["function"]["name"], arguments, value))
    return out


def _builtin_step(messages: list[dict[str, Any]], tools: dict[str, Any]) -> Reply | None:
    """Loki's built-ins, as its prompts ask: list the skills and load the first one;
    an orchestrator lists the agents it may spawn, spawns (code-reviewer: file-reviewer;
    others: explore and coder, else the first listed), then collects each. None when
    there is nothing (more) of that to do."""
    called = _called(messages)
    names = [name for name, _, _ in called]
    if "skill__list" in tools and "skill__list" not in names:
        return tool_calls(("skill__list", {}))
    if "skill__load" in tools and "skill__load" not in names:
        listed = next((v for n, _, v in called if n == "skill__list"), None)
        skills = listed.get("skills") if isinstance(listed, dict) else None
        if skills:
            return tool_calls(("skill__load", {"name": skills[0]["name"]}))
    if "agent__spawn" not in tools:
        return None
    if "agent__list_available" not in names:
        return tool_calls(("agent__list_available", {}))
    if "agent__spawn" not in names:
        listed = next(v for n, _, v in called if n == "agent__list_available")
        available = [a["name"] for a in (listed or {}).get("agents") or []]
        system = str(messages[0].get("content") or "").lower() if messages else ""
        wanted = ["file-reviewer"] if "code review orchestrator" in system else ["explore", "coder"]
        chosen = [a for a in wanted if a in available] or available[:1]
        if not chosen:
            return None
        return tool_calls(
            *[
                (
                    "agent__spawn",
                    {"agent": a, "prompt": "Please do one small thing with your tools."},
                )
                for a in chosen
            ]
        )
    spawned = [
        v["id"] for n, _, v in called if n == "agent__spawn" and isinstance(v, dict) and "id" in v
    ]
    collected = {a.get("id") for n, a, _ in called if n == "agent__collect"}
    pending = [i for i in spawned if i not in collected]
    if pending:
        return tool_calls(*[("agent__collect", {"id": i}) for i in pending])
    return None


def _export(graphrun: list[str], env: dict[str, str], scratch: Path, target: Path) -> None:
    """Export the agent's run (the newest top-level one, with its child runs) to ``target``."""
    listed = subprocess.run(
        [*graphrun, "runs", "--json"], capture_output=True, text=True, env=env, cwd=scratch
    )
    rows = [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]
    top = next(r["run_id"] for r in rows if not r.get("parent_run_id"))
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([*graphrun, "export", top, "-o", str(target)], check=True, env=env, cwd=scratch)


def run_agent(
    graphrun: list[str], config: Path, agent: str, scratch: Path, record: Path | None = None
) -> dict[str, Any]:
    calls: list[tuple[str, str]] = []  # (tool, result) of every tool the model called
    offered: list[bool] = []  # per LLM request: were tools offered?
    if agent in PROJECTS:
        PROJECTS[agent](scratch)

    def answer(request: RecordedRequest) -> Reply:
        messages = request.body.get("messages") or []
        tools = {t["function"]["name"]: t["function"] for t in request.body.get("tools") or []}
        if messages and messages[-1].get("role") == "tool":
            asked = next(m for m in reversed(messages) if m.get("role") == "assistant")
            names = {c["id"]: c["function"]["name"] for c in asked.get("tool_calls") or []}
            for m in messages[messages.index(asked) + 1 :]:
                calls.append((names.get(m.get("tool_call_id"), "?"), str(m.get("content"))))
        builtin = _builtin_step(messages, tools)
        if builtin is not None:
            return builtin
        own = [n for n, _, _ in _called(messages) if not n.startswith(BUILTINS)]
        if messages and messages[-1].get("role") == "tool" and own:
            return text(_final(messages))
        offered.append(bool(tools))
        if not tools:
            return text(_final(messages))
        name = next((n for n in PREFERRED if n in tools), None)
        plain = [n for n in tools if not n.startswith(("mcp_", *BUILTINS))]
        if (
            name is None and not plain and any(n.startswith("mcp_search_") for n in tools)
        ):  # only MCP servers: search one, as Loki's prompts do
            name = next(n for n in tools if n.startswith("mcp_search_"))
            return tool_calls((name, {"query": "add two numbers"}))
        if name is None and not plain:
            return text(_final(messages))
        name = name or plain[0]
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
        env.update(_variables(config / "agents" / agent, scratch))
        prompt = "Please do one small thing with your tools."
        proc = subprocess.run(
            [*graphrun, "run", agent, prompt, *_answers(config / "agents" / agent)],
            capture_output=True,
            text=True,
            env=env,
            timeout=180,
            cwd=scratch,
            stdin=subprocess.DEVNULL,
        )
    if record is not None and proc.returncode == 0:
        _export(graphrun, env, scratch, record / f"{agent}.run.jsonl")
    delegated = []
    for name, result in calls:
        if name == "agent__collect":
            try:
                collected = json.loads(result)
            except ValueError:
                continue
            delegated.append(f"{collected.get('agent')}:{collected.get('exit_status')}")
    ran = sorted({name for name, result in calls if _ok(name, result)})
    failed = sorted({name for name, result in calls if not _ok(name, result)} - set(ran))
    written = (scratch / "written.txt").is_file()
    no_tools = bool(offered) and not any(offered) and not calls  # it asked the model
    effect = written or bool(ran) or no_tools
    if written:
        seen = f"{scratch.name}/written.txt written"
    elif ran:
        first = next(result for name, result in calls if name == ran[0])
        seen = f"{ran[0]} returned: {first.strip()[:80]!r}"
    elif no_tools:
        seen = "(the agent offers no tools)"
    else:
        seen = "; ".join(f"{n}: {r.strip()[:120]!r}" for n, r in calls[:2]) or "(no tool called)"
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    return {
        "agent": agent,
        "exit": proc.returncode,
        "tools_ran": ran,
        "tools_failed": failed,
        "effect": effect,
        "delegated": sorted(delegated),
        "seen": seen.replace("\n", " "),
        "error": last if proc.returncode else "",
        "narration": proc.stderr,
        "output": proc.stdout,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assets", required=True, type=Path, help="Loki's assets directory")
    parser.add_argument("--agent", action="append", help="only these agents")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--narration", action="store_true", help="print each run's narration and output"
    )
    parser.add_argument(
        "--offline-mcp",
        action="store_true",
        help="serve every mcp.json server with tests/support/mcp_server.py (no internet)",
    )
    parser.add_argument(
        "--record",
        type=Path,
        metavar="DIR",
        help="keep the config and projects in DIR and export each run to "
        "DIR/recordings/<agent>.run.jsonl (then: graphrun test DIR/recordings)",
    )
    options = parser.parse_args()
    graphrun = [sys.executable, "-m", "graphrun.cli"]
    rows = []
    added: list[str] = []
    with contextlib.ExitStack() as stack:
        if options.record is not None:
            options.record.mkdir(parents=True, exist_ok=True)
            tmp = str(options.record.resolve())
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="graphrun-loki-"))
        record = Path(tmp) / "recordings" if options.record is not None else None
        config = Path(tmp) / "config"
        shutil.copytree(options.assets, config, symlinks=True)
        (config / "config.yaml").write_text(
            "model: fake:test-model\n"
            "rag_embedding_model: local:hash-384\n"  # graphrun's offline embedder
            "clients:\n"
            "  - type: openai-compatible\n"
            "    name: fake\n"
            "    api_base: '{{LOKI_ASSETS_API_BASE}}'\n"
        )
        mcp_json = config / "functions" / "mcp.json"
        if options.offline_mcp and mcp_json.is_file():
            servers = json.loads(mcp_json.read_text()).get("mcpServers") or {}
            named = {s for d in (config / "agents").iterdir() for s in _mcp_servers(d)}
            added = sorted(named - set(servers))
            stub = {"command": sys.executable, "args": [str(ROOT / "tests/support/mcp_server.py")]}
            mcp_json.write_text(
                json.dumps({"mcpServers": {name: stub for name in [*servers, *added]}})
            )
        agents = sorted(
            p.name
            for p in (config / "agents").iterdir()
            if p.is_dir() and not p.name.startswith(".")
        )
        for agent in options.agent or agents:
            scratch = Path(tmp) / "work" / agent
            scratch.mkdir(parents=True)
            row = run_agent(graphrun, config, agent, scratch, record)
            missing = sorted(set(_mcp_servers(config / "agents" / agent)) & set(added))
            row["note"] = f"not in mcp.json, stubbed: {', '.join(missing)}" if missing else ""
            rows.append(row)
    if options.narration:
        for row in rows:
            print(f"== {row['agent']} (exit {row['exit']})\n{row['narration']}{row['output']}")
    if options.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            status = "ok " if row["exit"] == 0 and row["effect"] else "BAD"
            ran = ",".join(row["tools_ran"]) or "-"
            failed = f" failed={','.join(row['tools_failed'])}" if row["tools_failed"] else ""
            print(
                f"{status} {row['agent']:<18} exit={row['exit']} ran={ran}{failed} "
                f"effect={row['effect']}: {row['error'] or row['seen']}"
                + (f" [{row['note']}]" if row.get("note") else "")
                + (f" delegated={','.join(row['delegated'])}" if row["delegated"] else "")
            )
        good = sum(1 for r in rows if r["exit"] == 0 and r["effect"])
        print(f"{good}/{len(rows)} agents completed a turn with a tool that really ran")
    return 0 if all(r["exit"] == 0 and r["effect"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
