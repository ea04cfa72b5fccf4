"""Loki's built-in functions in LLM-loop agents, through the real CLI and a fake LLM.

A Loki-shaped configuration directory with an orchestrator that delegates
(``agent__spawn``/``agent__collect``), agents that ask the user, keep todos and
load skills. Children are real child runs with their own logs; a ``kill -9``
mid-delegation is resumed without re-running the child that finished.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, GraphrunCli
from tests.support.fake_llm import FakeLlm, RecordedRequest, Reply, text, tool_calls

MCP_SERVER = ROOT / "tests" / "support" / "mcp_server.py"

TOOLS_SH = """\
#!/usr/bin/env bash
set -e
# @env LLM_OUTPUT=/dev/stdout The output path

# @cmd Count the words of a text
# @option --text! The text
count_words() {
  echo "words: $(echo "$argc_text" | wc -w | tr -d ' ')" >> "$LLM_OUTPUT"
}
"""


def _agent(root: Path, name: str, config: str, tools: bool = False) -> None:
    folder = root / "agents" / name
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(textwrap.dedent(config).lstrip(), encoding="utf-8")
    if tools:
        (folder / "tools.sh").write_text(TOOLS_SH, encoding="utf-8")


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    root = tmp_path / "cfg"
    _agent(
        root,
        "boss",
        """\
        description: Delegates
        can_spawn_agents: true
        spawnable_agents: [helper, slow]
        instructions: BOSS delegates work.
        """,
    )
    _agent(
        root,
        "helper",
        """\
        description: Counts words
        instructions: HELPER counts words.
        """,
        tools=True,
    )
    _agent(root, "slow", "description: Takes its time\ninstructions: SLOW thinks.\n")
    _agent(
        root,
        "asker",
        """\
        instructions: ASKER asks with user__ask before answering.
        """,
    )
    _agent(
        root,
        "planner",
        """\
        auto_continue: true
        skills_enabled: true
        instructions: PLANNER keeps todos and loads skills.
        """,
    )
    skill = root / "skills" / "checklist"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\ndescription: A review checklist\n---\nCHECK EVERY EDGE CASE.\n", encoding="utf-8"
    )
    return root


def _env(fake: FakeLlm, cfg: Path) -> dict[str, str]:
    (cfg / "config.yaml").write_text(
        textwrap.dedent(
            f"""\
            model: local:gpt-local
            clients:
              - type: openai-compatible
                name: local
                api_base: {fake.url_openai}
                api_key: sk-test
                models:
                  - name: gpt-local
            """
        ),
        encoding="utf-8",
    )
    return {"GRAPHRUN_CONFIG_DIR": str(cfg), "GRAPHRUN_AGENTS_DIR": str(cfg / "agents")}


def _tool_results(request: RecordedRequest) -> list[dict[str, Any]]:
    out = []
    for message in request.body["messages"]:
        if message["role"] == "tool":
            try:
                out.append(json.loads(message["content"]))
            except ValueError:
                out.append({"text": message["content"]})
    return out


def _system(request: RecordedRequest) -> str:
    return str(request.body["messages"][0]["content"])


def delegating(slow_delay: float = 0.0) -> Any:
    """The fake model: boss spawns helper and slow, collects both, then answers."""

    def answer(request: RecordedRequest) -> Reply:
        system = _system(request)
        results = _tool_results(request)
        if "HELPER" in system:
            if not results:
                return tool_calls(("count_words", {"text": "one two three"}))
            return text(f"helper counted {results[-1]['text'].strip()}")
        if "SLOW" in system:
            return text("slow finished", delay=slow_delay)
        if "BOSS" in system:
            if not results:
                return tool_calls(
                    ("agent__spawn", {"agent": "helper", "prompt": "count"}),
                    ("agent__spawn", {"agent": "slow", "prompt": "think"}),
                )
            ids = [r["id"] for r in results if r.get("status") == "ok" and "id" in r]
            if len(results) == 2:
                return tool_calls(
                    *[("agent__collect", {"id": i}) for i in ids],
                )
            outputs = [r["output"] for r in results if r.get("status") == "completed"]
            return text("boss done: " + " | ".join(outputs))
        return text("?")

    return answer


def _root(graphrun: GraphrunCli) -> str:
    """The latest run that is not a child run."""
    rows = graphrun("runs", "--json").json_lines()
    return next(str(r["run_id"]) for r in rows if not r.get("parent_run_id"))  # type: ignore[union-attr]


def _events(graphrun: GraphrunCli, run_id: str) -> list[dict[str, Any]]:
    return graphrun("events", run_id, "--json").json_lines()  # type: ignore[return-value]


def test_an_orchestrator_delegates_through_spawn_and_collect(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    fake_llm.default = delegating()
    res = graphrun("run", "boss", "do it", **_env(fake_llm, cfg))

    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "boss done: helper counted words: 3 | slow finished"
    first = fake_llm.requests[0].body
    offered = [t["function"]["name"] for t in first["tools"]]
    assert offered[:6] == [
        "agent__spawn",
        "agent__check",
        "agent__collect",
        "agent__list_running",
        "agent__list_available",
        "agent__cancel",
    ]
    assert "agent__collect" in first["messages"][0]["content"]  # inject_spawn_instructions
    events = _events(graphrun, _root(graphrun))
    started = [e for e in events if e["type"] == "ChildRunStarted"]
    finished = [e for e in events if e["type"] == "ChildRunFinished"]
    assert [e["agent"] for e in started] == ["helper", "slow"]
    assert sorted(e["status"] for e in finished) == ["completed", "completed"]
    # Each child is a run of its own, linked to the parent, whose tool really ran.
    helper = next(e["child_run_id"] for e in started if e["agent"] == "helper")
    child = _events(graphrun, helper)
    assert child[0]["parent_run_id"] == _root(graphrun)
    tool = next(e for e in child if e["type"] == "ToolCalled")
    assert tool["result"].strip() == "words: 3" and not tool.get("is_error")
    # Replay serves the children from the log.
    replay = graphrun("replay", _root(graphrun))
    assert replay.code == 0, replay.stderr


def test_spawning_outside_the_whitelist_is_refused(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    fake_llm.script(
        tool_calls(("agent__spawn", {"agent": "asker", "prompt": "x"})),
        tool_calls(("agent__list_available", {})),
        text("ok"),
    )
    res = graphrun("run", "boss", "do it", **_env(fake_llm, cfg))
    assert res.code == 0, res.stderr
    refused = _tool_results(fake_llm.requests[1])[0]
    assert refused["status"] == "error"
    assert "not in this agent's `spawnable_agents` whitelist" in refused["message"]
    listed = _tool_results(fake_llm.requests[2])[1]
    assert listed == {
        "count": 2,
        "agents": [
            {"name": "helper", "description": "Counts words"},
            {"name": "slow", "description": "Takes its time"},
        ],
    }


def test_a_question_waits_and_answer_continues_it(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    fake_llm.script(
        tool_calls(("user__ask", {"question": "Which colour?", "options": ["red", "blue"]})),
        text("you chose it"),
    )
    env = _env(fake_llm, cfg)
    res = graphrun("run", "asker", "go", **env)
    assert res.code == 3, res.stderr
    run_id = _root(graphrun)
    waiting = [e for e in _events(graphrun, run_id) if e["type"] == "HumanInputRequested"]
    assert waiting[0]["question"] == "Which colour?"
    assert waiting[0]["options"] == ["red", "blue"]

    answered = graphrun("answer", run_id, "2", "--as", "ana", **env)
    assert answered.code == 0, answered.stderr
    assert answered.stdout.strip() == "you chose it"
    last = fake_llm.requests[-1]
    assert _tool_results(last) == [{"answer": "blue"}]
    assert len(fake_llm.requests) == 2  # the first call was served from the log
    types = [e["type"] for e in _events(graphrun, run_id)]
    assert types.count("HumanInputReceived") == 1 and types[-1] == "RunCompleted"
    replay = graphrun("replay", run_id)
    assert replay.code == 0, replay.stdout


def test_todos_and_skills(graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path) -> None:
    fake_llm.script(
        tool_calls(
            ("todo__init", {"goal": "ship"}),
            ("todo__add", {"task": "write"}),
            ("todo__add", {"task": "test"}),
            ("todo__done", {"id": 1}),
        ),
        tool_calls(("skill__list", {}), ("skill__load", {"name": "checklist"})),
        text("planned"),
    )
    res = graphrun("run", "planner", "plan", **_env(fake_llm, cfg))
    assert res.code == 0, res.stderr
    first = fake_llm.requests[0].body
    assert "todo__init" in first["messages"][0]["content"]  # inject_todo_instructions
    # A skill is installed: Loki's skills paragraph is appended (inject_skill_instructions).
    assert first["messages"][0]["content"].endswith(
        "## Skills\nSkills (documents with instructions for particular kinds of work) may be\n"
        "available. Call `skill__list` early to see which fit the task, `skill__load` the\n"
        "ones that do, and `skill__unload` them when their part of the work is done."
    )
    results = _tool_results(fake_llm.requests[2])
    assert results[4] == {
        "skills": [
            {
                "name": "checklist",
                "description": "A review checklist",
                "grants_tools": [],
                "grants_mcp_servers": [],
                "loaded": False,
            }
        ]
    }
    # As in Loki, the body is not the result: it joins the system prompt that follows.
    assert results[5] == {
        "status": "ok",
        "loaded": "checklist",
        "message": "Skill 'checklist' loaded",
    }
    assert "CHECK EVERY EDGE CASE." not in _system(fake_llm.requests[1])
    assert _system(fake_llm.requests[2]) == _system(fake_llm.requests[1]) + (
        "\n\nCHECK EVERY EDGE CASE."
    )
    shown = graphrun("show", _root(graphrun))
    assert shown.code == 0, shown.stderr
    assert "Goal: ship" in shown.stdout
    assert "✓ 1. write" in shown.stdout and "○ 2. test" in shown.stdout

    # The loaded skill is in the log: a changed skill document is a divergence.
    recording = cfg.parent / "recordings" / "planner.run.jsonl"
    exported = graphrun("export", _root(graphrun), "-o", str(recording))
    assert exported.code == 0, exported.stderr
    env = _env(fake_llm, cfg)
    assert graphrun("test", str(recording), **env).code == 0
    skill = cfg / "skills" / "checklist" / "SKILL.md"
    skill.write_text(skill.read_text().replace("EVERY EDGE CASE", "NOTHING"))
    changed = graphrun("test", str(recording), **env)
    assert changed.code == 1
    assert "skill 'checklist'" in changed.stdout and "changed since the run was recorded" in (
        changed.stdout
    )


def _runs(db: Path) -> dict[str, str]:
    with sqlite3.connect(db) as conn:
        return {r[0]: r[1] for r in conn.execute("select run_id, status from runs")}


def test_kill_9_mid_delegation_resumes_without_rerunning_the_finished_child(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    fake_llm.default = delegating(slow_delay=30.0)
    env = _env(fake_llm, cfg)
    proc = graphrun.popen("run", "boss", "do it", **env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        systems = [_system(r) for r in fake_llm.requests]
        if any("SLOW" in s for s in systems) and sum("HELPER" in s for s in systems) >= 2:
            statuses = _runs(graphrun.db)
            if list(statuses.values()).count("completed") >= 1:
                break
        time.sleep(0.1)
    else:
        proc.kill()
        proc.communicate(timeout=10)
        pytest.fail("the children never started")
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    helper_calls = sum("HELPER" in _system(r) for r in fake_llm.requests)
    slow_calls = sum("SLOW" in _system(r) for r in fake_llm.requests)
    assert (helper_calls, slow_calls) == (2, 1)

    fake_llm.default = delegating(slow_delay=0.0)
    resumed = graphrun("resume", _root(graphrun), **env)
    assert resumed.code == 0, resumed.stderr
    assert resumed.stdout.strip() == "boss done: helper counted words: 3 | slow finished"
    # The finished child was not re-run; the unfinished one was.
    assert sum("HELPER" in _system(r) for r in fake_llm.requests) == helper_calls
    assert sum("SLOW" in _system(r) for r in fake_llm.requests) == slow_calls + 1
    events = _events(graphrun, _root(graphrun))
    assert [e["type"] for e in events].count("ChildRunStarted") == 2


def test_max_agent_depth_stops_a_spawn_too_deep(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    _agent(
        cfg,
        "recur",
        """\
        can_spawn_agents: true
        max_agent_depth: 1
        instructions: RECUR spawns itself.
        """,
    )

    def answer(request: RecordedRequest) -> Reply:
        results = _tool_results(request)
        if not results:
            return tool_calls(("agent__spawn", {"agent": "recur", "prompt": "again"}))
        last = results[-1]
        if last.get("status") == "ok" and "id" in last:
            return tool_calls(("agent__collect", {"id": last["id"]}))
        if last.get("status") == "error":
            return text(f"child stopped: {last['message']}")
        return text(f"parent got: {last.get('output')}")

    fake_llm.default = answer
    res = graphrun("run", "recur", "go", **_env(fake_llm, cfg))
    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "parent got: child stopped: Max agent depth exceeded (2/1)"


def _on_a_terminal(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path, tmp_path: Path, *args: str
) -> Any:
    """``graphrun ARGS`` on a pseudo-terminal (its stdout to ``stdout.txt``), once it
    shows the question "Proceed now?"."""
    import re

    import pexpect

    env = {k: v for k, v in graphrun.env(**_env(fake_llm, cfg)).items()}
    env.pop("GRAPHRUN_NO_TTY", None)
    env.update(TERM="xterm", OUT=str(tmp_path / "stdout.txt"))
    command = ["-c", 'exec "$@" >"$OUT"', "sh", sys.executable, "-m", "graphrun.cli", *args]
    child = pexpect.spawn(
        "/bin/sh",
        command,
        env=env,
        cwd=str(tmp_path),
        encoding="utf-8",
        timeout=30,
        dimensions=(30, 120),
    )
    try:
        while child.expect(["Proceed now", re.escape(CPR_REQUEST)]) != 0:
            child.send(CPR_ANSWER)  # answer cursor-position requests as a terminal does
    except BaseException:
        child.close()
        raise
    return child


#: A terminal's cursor-position request, and the answer a terminal gives.
CPR_REQUEST, CPR_ANSWER = "\x1b[6n", "\x1b[5;1R"


def test_on_a_terminal_the_question_is_asked_there(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path, tmp_path: Path
) -> None:
    import pexpect

    fake_llm.script(tool_calls(("user__confirm", {"question": "Proceed now?"})), text("went on"))
    child = _on_a_terminal(graphrun, fake_llm, cfg, tmp_path, "run", "asker", "go")
    try:
        child.send("1\r")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert (tmp_path / "stdout.txt").read_text().strip() == "went on"
    assert _tool_results(fake_llm.requests[-1]) == [{"answer": "yes"}]
    received = [e for e in _events(graphrun, _root(graphrun)) if e["type"] == "HumanInputReceived"]
    assert [(e["answer"], e["channel"]) for e in received] == [("yes", "tty")]


def test_the_run_timeout_closes_a_question_an_llm_tool_asks_on_the_terminal(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path, tmp_path: Path
) -> None:
    # The question is part of the llm node's visit: the run's clock runs while it
    # is asked, and its timeout closes the prompt rather than waiting for a person.
    import re

    import pexpect

    folder = cfg / "agents" / "timed"
    folder.mkdir()
    (folder / "graph.yaml").write_text(
        textwrap.dedent(
            """\
            name: timed
            version: "1.0"
            start: ask
            settings: {timeout: 2}
            nodes:
              ask: {type: llm, prompt: go, tools: [user__confirm], next: done}
              done: {type: end, output: "{{ask}}"}
            """
        ),
        encoding="utf-8",
    )
    fake_llm.script(tool_calls(("user__confirm", {"question": "Proceed now?"})), text("went on"))
    child = _on_a_terminal(graphrun, fake_llm, cfg, tmp_path, "run", "timed")
    try:
        asked = time.monotonic()
        while child.expect([pexpect.EOF, re.escape(CPR_REQUEST)]) != 0:
            child.send(CPR_ANSWER)
        waited = time.monotonic() - asked
    finally:
        child.close()
    assert child.exitstatus == 1
    assert waited < 10, f"the question stayed {waited:.1f}s past a 2 s run timeout"
    assert (tmp_path / "stdout.txt").read_text() == ""
    events = _events(graphrun, _root(graphrun))
    assert not [e for e in events if e["type"] == "HumanInputReceived"]
    assert events[-1]["type"] == "RunFailed"
    assert "run timed out after 2s" in events[-1]["error"]
    assert len(fake_llm.requests) == 1  # the model was not asked again


def test_a_graph_node_with_skills_enabled_loads_its_skills(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    folder = cfg / "agents" / "reviewer"
    folder.mkdir()
    (folder / "graph.yaml").write_text(
        textwrap.dedent(
            """\
            name: reviewer
            version: "1.0"
            start: review
            skills_enabled: true
            nodes:
              review:
                type: llm
                prompt: "{{initial_prompt}}"
                enabled_skills: [checklist]
                skill_instructions: "SKILLS: load checklist first."
                state_updates: {answer: "{{output}}"}
                next: done
              done: {type: end, output: "{{answer}}"}
            """
        )
    )
    (cfg / "skills" / "secret").mkdir()
    (cfg / "skills" / "secret" / "SKILL.md").write_text("not for this node")
    fake_llm.script(
        tool_calls(("skill__load", {"name": "checklist"}), ("skill__load", {"name": "secret"})),
        text("reviewed"),
    )
    env = _env(fake_llm, cfg)
    assert graphrun("validate", "reviewer", **env).code == 0
    res = graphrun("run", "reviewer", "review it", **env)
    assert res.code == 0, res.stderr
    offered = [t["function"]["name"] for t in fake_llm.requests[0].body["tools"]]
    assert offered == ["skill__list", "skill__load", "skill__unload"]
    # The node has no instructions: its skill_instructions are its system prompt.
    assert _system(fake_llm.requests[0]) == "SKILLS: load checklist first."
    loaded, refused = _tool_results(fake_llm.requests[1])
    assert loaded == {"status": "ok", "loaded": "checklist", "message": "Skill 'checklist' loaded"}
    assert (
        _system(fake_llm.requests[1]) == "SKILLS: load checklist first.\n\nCHECK EVERY EDGE CASE."
    )
    assert refused == {"error": "Skill 'secret' is not enabled in this context"}


def _skills(delay_after_load: float = 0.0) -> Any:
    """The fake model of the planner: loads two skills, unloads one, loads the other
    again, then answers (the answer to the turn after the loads can be slow, to kill
    the run meanwhile)."""

    def answer(request: RecordedRequest) -> Reply:
        turn = len([m for m in request.body["messages"] if m["role"] == "assistant"])
        if turn == 0:
            return tool_calls(
                ("skill__load", {"name": "checklist"}), ("skill__load", {"name": "style"})
            )
        if turn == 1:
            return dataclasses.replace(
                tool_calls(("skill__unload", {"name": "checklist"})), delay=delay_after_load
            )
        if turn == 2:
            return tool_calls(("skill__load", {"name": "style"}))
        return text("done")

    return answer


def test_a_loaded_skill_is_in_the_system_prompt_until_unloaded(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    (cfg / "skills" / "style").mkdir()
    (cfg / "skills" / "style" / "SKILL.md").write_text(
        "---\nauto_unload: true\n---\nWRITE TERSELY.\n"
    )
    fake_llm.default = _skills()
    env = _env(fake_llm, cfg)
    res = graphrun("run", "planner", "plan", **env)
    assert res.code == 0, res.stderr
    # Loki's auto_unload is not honoured, and says so.
    assert "warning: skill 'style' sets auto_unload, which graphrun does not honour" in res.stderr
    base = _system(fake_llm.requests[0])
    assert "CHECK EVERY" not in base and "TERSELY" not in base
    # Loaded: each body after the agent's prompt, a blank line apart, in the order loaded.
    assert _system(fake_llm.requests[1]) == base + "\n\nCHECK EVERY EDGE CASE.\n\nWRITE TERSELY."
    # Unloaded, it leaves the prompt; loading one again is refused as in Loki.
    assert _tool_results(fake_llm.requests[2])[2] == {"status": "ok", "unloaded": "checklist"}
    assert _system(fake_llm.requests[2]) == base + "\n\nWRITE TERSELY."
    again = _tool_results(fake_llm.requests[3])[3]
    assert again == {"error": "Skill 'style' is already loaded"}
    assert _system(fake_llm.requests[3]) == base + "\n\nWRITE TERSELY."
    # What went into the prompt is recorded with the call.
    calls = [e for e in _events(graphrun, _root(graphrun)) if e["type"] == "ToolCalled"]
    assert [c.get("instructions") for c in calls] == [
        "CHECK EVERY EDGE CASE.",
        "WRITE TERSELY.",
        None,
        None,
    ]
    replay = graphrun("replay", _root(graphrun))
    assert replay.code == 0, replay.stdout + replay.stderr


def test_kill_9_after_a_skill_load_resumes_with_it_loaded(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    (cfg / "skills" / "style").mkdir()
    (cfg / "skills" / "style" / "SKILL.md").write_text("WRITE TERSELY.\n")
    fake_llm.default = _skills(delay_after_load=30.0)
    env = _env(fake_llm, cfg)
    proc = graphrun.popen("run", "planner", "plan", **env)
    deadline = time.monotonic() + 60
    while len(fake_llm.requests) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the loads were committed before the request went out
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    assert len(fake_llm.requests) == 2
    killed = fake_llm.requests[1].body
    fake_llm.requests.clear()

    # The document changes meanwhile: the resumed visit keeps the text it loaded.
    style = cfg / "skills" / "style" / "SKILL.md"
    style.write_text("WRITE AT LENGTH.\n")
    fake_llm.default = _skills()
    resumed = graphrun("resume", _root(graphrun), **env)
    assert resumed.code == 0, resumed.stderr
    assert resumed.stdout.strip() == "done"
    # The turn that had no answer is asked again, byte for byte.
    assert fake_llm.requests[0].body == killed
    assert _system(fake_llm.requests[0]).endswith("\n\nCHECK EVERY EDGE CASE.\n\nWRITE TERSELY.")
    assert _system(fake_llm.requests[1]).endswith("\n\nWRITE TERSELY.")
    assert "CHECK EVERY" not in _system(fake_llm.requests[1])
    # Replay reproduces every request; against today's document it is a divergence.
    recording = cfg.parent / "recordings" / "planner.run.jsonl"
    exported = graphrun("export", _root(graphrun), "-o", str(recording))
    assert exported.code == 0, exported.stderr
    changed = graphrun("test", str(recording), **env)
    assert changed.code == 1
    assert "skill 'style'" in changed.stdout
    style.write_text("WRITE TERSELY.\n")
    assert graphrun("test", str(recording), **env).code == 0
    replay = graphrun("replay", _root(graphrun))
    assert replay.code == 0, replay.stdout + replay.stderr


def test_a_loaded_skill_grants_its_tools_until_unloaded(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    tools_dir = cfg / "functions" / "tools"
    tools_dir.mkdir(parents=True)
    (tools_dir / "shout.sh").write_text(
        "#!/usr/bin/env bash\n# @describe Shout a text\n# @option --text! The text\n"
        'main() {\n  echo "$argc_text" | tr a-z A-Z >> "$LLM_OUTPUT"\n}\n'
        'eval "$(argc --argc-eval "$0" "$@")"\n',
        encoding="utf-8",
    )
    server = {"type": "stdio", "command": sys.executable, "args": [str(MCP_SERVER)]}
    (cfg / "functions" / "mcp.json").write_text(json.dumps({"mcpServers": {"local": server}}))
    (cfg / "skills" / "loud").mkdir()
    (cfg / "skills" / "loud" / "SKILL.md").write_text(
        "---\ndescription: Shouting\nenabled_tools: shout\nenabled_mcp_servers: [local]\n"
        "---\nSHOUT WHEN ASKED.\n"
    )
    (cfg / "skills" / "broken").mkdir()
    (cfg / "skills" / "broken" / "SKILL.md").write_text(
        "---\nenabled_tools: [no_such_tool]\n---\nNEVER LOADED.\n"
    )

    def answer(request: RecordedRequest) -> Reply:
        turn = len([m for m in request.body["messages"] if m["role"] == "assistant"])
        script = [
            tool_calls(("skill__load", {"name": "loud"}), ("skill__load", {"name": "broken"})),
            tool_calls(
                ("shout", {"text": "hello there"}),
                ("mcp_invoke_local", {"tool": "add", "arguments": {"a": 40, "b": 2}}),
            ),
            tool_calls(("skill__unload", {"name": "loud"})),
            tool_calls(("shout", {"text": "again"})),
        ]
        return script[turn] if turn < len(script) else text("done")

    fake_llm.default = answer
    env = _env(fake_llm, cfg)
    res = graphrun("run", "planner", "plan", **env)
    assert res.code == 0, res.stderr

    def offered(i: int) -> list[str]:
        return [t["function"]["name"] for t in fake_llm.requests[i].body["tools"]]

    assert "shout" not in offered(0)
    meta = ["mcp_search_local", "mcp_describe_local", "mcp_invoke_local"]
    assert offered(1) == [*offered(0), "shout", *meta]
    refused = _tool_results(fake_llm.requests[1])[1]
    assert refused["error"].startswith(
        "Loaded skill 'broken' but failed to offer the tools it grants: "
    )
    assert "NEVER LOADED" not in _system(fake_llm.requests[1])
    # The granted tool really ran; unloaded, it is gone again.
    assert _tool_results(fake_llm.requests[2])[-2:] == [{"text": "HELLO THERE\n"}, 42]
    assert offered(3) == offered(0)
    assert "unknown tool 'shout'" in fake_llm.requests[4].body["messages"][-1]["content"]
    calls = [e for e in _events(graphrun, _root(graphrun)) if e["type"] == "ToolCalled"]
    assert calls[0]["tools"] == ["shout", "mcp:local"]
    assert calls[2]["source"] == "global:shout.sh" and calls[3]["source"] == "mcp:local"
    replay = graphrun("replay", _root(graphrun))
    assert replay.code == 0, replay.stdout + replay.stderr


def _user_messages(request: RecordedRequest) -> list[str]:
    return [str(m["content"]) for m in request.body["messages"] if m["role"] == "user"]


def _continuing(delay_third: float = 0.0) -> Any:
    """The fake model of an auto_continue agent: makes two todos, then keeps stopping
    with one open (the third answer can be slow, to kill the run meanwhile)."""

    def answer(request: RecordedRequest) -> Reply:
        turn = len([m for m in request.body["messages"] if m["role"] == "assistant"])
        if turn == 0:
            return tool_calls(
                ("todo__init", {"goal": "ship"}),
                ("todo__add", {"task": "write"}),
                ("todo__add", {"task": "test"}),
                ("todo__done", {"id": 1}),
            )
        stops = len(_user_messages(request)) - 1  # the prompt, then one per continuation
        return text(f"stopped {stops}", delay=delay_third if stops == 1 else 0.0)

    return answer


def test_auto_continue_prompts_again_while_todos_are_open(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    _agent(
        cfg,
        "worker",
        """\
        auto_continue: true
        max_auto_continues: 2
        instructions: WORKER works through todos.
        """,
    )
    fake_llm.default = _continuing()
    env = _env(fake_llm, cfg)
    res = graphrun("run", "worker", "go", **env)
    assert res.code == 0, res.stderr
    assert "auto_continue" not in res.stderr  # implemented: no warning
    # The first answer, then two continuations (max_auto_continues), each answer kept.
    assert res.stdout.strip() == "stopped 0\nstopped 1\nstopped 2"
    assert len(fake_llm.requests) == 4
    prompt = _user_messages(fake_llm.requests[2])[-1]
    assert prompt.startswith("[auto-continue] You stopped while todos are still open.")
    assert prompt.endswith("Goal: ship\nProgress: 1/2 completed\n  ✓ 1. write\n  ○ 2. test")
    events = _events(graphrun, _root(graphrun))
    continued = [e for e in events if e["type"] == "LlmContinued"]
    assert [(e["reason"], e.get("count", 1)) for e in continued] == [("todos", 1), ("todos", 2)]
    assert continued[0]["prompt"] == prompt
    replay = graphrun("replay", _root(graphrun))
    assert replay.code == 0, replay.stderr
    listed = graphrun("events", _root(graphrun))
    assert "LlmContinued" in listed.stdout and "todos #2" in listed.stdout
    report = cfg.parent / "report.html"
    made = graphrun("report", _root(graphrun), "-o", str(report))
    assert made.code == 0, made.stderr
    assert "prompted again (todos, 2)" in report.read_text()


def test_kill_9_during_an_auto_continue_resumes_it_from_the_log(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    _agent(
        cfg,
        "worker",
        """\
        auto_continue: true
        max_auto_continues: 2
        continuation_prompt: KEEP GOING.
        instructions: WORKER works through todos.
        """,
    )
    fake_llm.default = _continuing(delay_third=30.0)
    env = _env(fake_llm, cfg)
    proc = graphrun.popen("run", "worker", "go", **env)
    deadline = time.monotonic() + 60
    while len(fake_llm.requests) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the continuation was committed before the request went out
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    assert len(fake_llm.requests) == 3
    fake_llm.requests.clear()

    fake_llm.default = _continuing()
    resumed = graphrun("resume", _root(graphrun), **env)
    assert resumed.code == 0, resumed.stderr
    assert resumed.stdout.strip() == "stopped 0\nstopped 1\nstopped 2"
    # Only the turn that had no answer is asked again, with the recorded continuation.
    assert len(fake_llm.requests) == 2
    assert _user_messages(fake_llm.requests[0])[-1].startswith("KEEP GOING.\n\nGoal: ship")
    continued = [e for e in _events(graphrun, _root(graphrun)) if e["type"] == "LlmContinued"]
    assert [e.get("count", 1) for e in continued] == [1, 2]


def test_a_model_that_stops_with_agents_running_is_sent_back(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    def answer(request: RecordedRequest) -> Reply:
        system = _system(request)
        if "SLOW" in system:
            return text("slow finished", delay=0.5)
        results = _tool_results(request)
        if not results:
            return tool_calls(("agent__spawn", {"agent": "slow", "prompt": "think"}))
        said = _user_messages(request)[-1]
        if said.startswith("[guardrail]") and len(results) == 1:
            return tool_calls(("agent__collect", {"id": results[0]["id"]}))
        if len(results) == 1:
            return text("I will wait for it to report back.")
        return text("boss got: " + results[-1]["output"])

    fake_llm.default = answer
    res = graphrun("run", "boss", "do it", **_env(fake_llm, cfg))
    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "I will wait for it to report back.\nboss got: slow finished"
    events = _events(graphrun, _root(graphrun))
    (guard,) = [e for e in events if e["type"] == "LlmContinued"]
    assert guard["reason"] == "pending_agents"
    assert "agent_slow_" in guard["prompt"] and "agent__collect" in guard["prompt"]


def test_a_spawned_agents_question_is_answered_by_its_parent(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    _agent(
        cfg,
        "chief",
        """\
        can_spawn_agents: true
        instructions: CHIEF delegates and answers questions.
        """,
    )

    def answer(request: RecordedRequest) -> Reply:
        system = _system(request)
        results = _tool_results(request)
        if "ASKER" in system:
            if not results:
                return tool_calls(
                    ("user__select", {"question": "Which colour?", "options": ["red", "blue"]})
                )
            return text(f"asker got {results[-1]['answer']}")
        if not results:
            return tool_calls(("agent__spawn", {"agent": "asker", "prompt": "ask"}))
        last = results[-1]
        if last.get("status") == "ok" and "id" in last:
            return tool_calls(("agent__collect", {"id": last["id"]}))
        if last.get("pending_escalations"):
            escalation = last["pending_escalations"][0]
            return tool_calls(
                (
                    "agent__reply_escalation",
                    {"escalation_id": escalation["escalation_id"], "reply": "blue"},
                )
            )
        if last.get("original_question"):
            spawned = next(r for r in results if "id" in r and r.get("status") == "ok")
            return tool_calls(("agent__collect", {"id": spawned["id"]}))
        return text("chief got: " + last["output"])

    fake_llm.default = answer
    # Even on a terminal a spawned agent asks its parent, never the person.
    res = graphrun("run", "chief", "go", **_env(fake_llm, cfg))
    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "chief got: asker got blue"
    pending = next(
        r for req in fake_llm.requests for r in _tool_results(req) if r.get("pending_escalations")
    )
    (escalation,) = pending["pending_escalations"]
    assert escalation["question"] == "[approval] Which colour?"
    assert escalation["options"] == ["red", "blue"]
    assert escalation["from_agent_name"] == "asker"
    events = _events(graphrun, _root(graphrun))
    child = next(e["child_run_id"] for e in events if e["type"] == "ChildRunStarted")
    (received,) = [e for e in _events(graphrun, child) if e["type"] == "HumanInputReceived"]
    assert (received["answer"], received["channel"], received["by"]) == (
        "blue",
        "agent",
        "agent:chief",
    )
    replay = graphrun("replay", _root(graphrun))
    assert replay.code == 0, replay.stdout


def test_agents_leave_each_other_messages(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    _agent(cfg, "listener", "instructions: LISTENER reads its inbox.\n")

    def answer(request: RecordedRequest) -> Reply:
        system = _system(request)
        results = _tool_results(request)
        if "LISTENER" in system:
            if not results:
                return dataclasses.replace(tool_calls(("agent__check_inbox", {})), delay=1.0)
            got = results[-1]
            return text("heard: " + "; ".join(m["payload"]["content"] for m in got["messages"]))
        if not results:
            return tool_calls(("agent__spawn", {"agent": "listener", "prompt": "listen"}))
        first = results[0]
        if len(results) == 1:
            return tool_calls(
                ("agent__send_message", {"id": first["id"], "message": "use tabs"}),
                ("agent__send_message", {"id": "agent_nobody_12345678", "message": "hi"}),
            )
        if len(results) == 3:
            return tool_calls(("agent__collect", {"id": first["id"]}))
        return text(results[-1]["output"])

    fake_llm.default = answer
    _agent(cfg, "hub", "can_spawn_agents: true\ninstructions: HUB coordinates.\n")
    res = graphrun("run", "hub", "go", **_env(fake_llm, cfg))
    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "heard: use tabs"
    # The hub's turn after it sent both (the listener's turns interleave with its own).
    sent, unknown = next(
        _tool_results(r)[1:]
        for r in fake_llm.requests
        if "HUB" in _system(r) and len(_tool_results(r)) == 3
    )
    assert sent["status"] == "ok"
    assert unknown["status"] == "error" and "No agent found" in unknown["message"]


def test_a_task_queue_starts_an_agent_when_its_task_is_unblocked(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    fake_llm.script(
        tool_calls(
            ("agent__task_create", {"subject": "explore"}),
            (
                "agent__task_create",
                {"subject": "count", "blocked_by": ["1"], "agent": "helper", "prompt": "go"},
            ),
            ("agent__task_list", {}),
            ("agent__task_complete", {"task_id": "1"}),
        ),
    )

    def rest(request: RecordedRequest) -> Reply:
        system = _system(request)
        results = _tool_results(request)
        if "HELPER" in system:
            if not results:
                return tool_calls(("count_words", {"text": "a b"}))
            return text("helper: " + results[-1]["text"].strip())
        if len(results) == 4:
            dispatched = results[3]["auto_dispatched"][0]
            return tool_calls(("agent__collect", {"id": dispatched["id"]}))
        return text("boss: " + results[-1]["output"])

    fake_llm.default = rest
    res = graphrun("run", "boss", "plan", **_env(fake_llm, cfg))
    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "boss: helper: words: 2"
    results = _tool_results(fake_llm.requests[1])
    assert results[0] == {"status": "ok", "task_id": "1"}
    assert results[1] == {"status": "ok", "task_id": "2", "auto_dispatch": True}
    listed = {t["id"]: (t["status"], t["blocked_by"]) for t in results[2]["tasks"]}
    assert listed == {"1": ("pending", []), "2": ("blocked", ["1"])}
    completed = results[3]
    assert completed["newly_runnable"][0]["id"] == "2"
    assert completed["auto_dispatched"][0]["agent"] == "helper"


def test_a_long_child_output_is_summarised_on_collect(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    _agent(
        cfg,
        "lead",
        """\
        can_spawn_agents: true
        summarization_threshold: 50
        instructions: LEAD delegates.
        """,
    )
    long = "finding " * 20

    def answer(request: RecordedRequest) -> Reply:
        system = _system(request)
        results = _tool_results(request)
        if "SLOW" in system:
            return text(long)
        if "condense the output of a sub-agent" in system:
            return text("SUMMARY: findings")
        if not results:
            return tool_calls(("agent__spawn", {"agent": "slow", "prompt": "think"}))
        if len(results) == 1:
            return tool_calls(("agent__collect", {"id": results[0]["id"]}))
        return text("lead got " + results[-1]["output"])

    fake_llm.default = answer
    res = graphrun("run", "lead", "go", **_env(fake_llm, cfg))
    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "lead got SUMMARY: findings"
    events = _events(graphrun, _root(graphrun))
    summary = [e for e in events if e["type"] == "LlmCalled" and e.get("purpose") == "summarize"]
    assert len(summary) == 1
    assert long.strip() in summary[0]["request"]["messages"][-1]["content"]
    (finished,) = [e for e in events if e["type"] == "ChildRunFinished"]
    assert finished["output"].strip() == long.strip()  # the full output stays in the log


def test_cancelling_a_spawned_agent_that_waits_for_a_reply_ends_its_run(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    _agent(cfg, "chief", "can_spawn_agents: true\ninstructions: CHIEF delegates.\n")

    def answer(request: RecordedRequest) -> Reply:
        results = _tool_results(request)
        if "ASKER" in _system(request):
            return tool_calls(("user__input", {"question": "Your name?"}))
        if not results:
            return tool_calls(("agent__spawn", {"agent": "asker", "prompt": "ask"}))
        last = results[-1]
        if "agents" in last or len(results) == 1:  # look again (a repeated call is refused)
            return tool_calls(("agent__check", {"id": results[0]["id"]}))
        if last.get("status") == "pending" and not last.get("pending_escalations"):
            return dataclasses.replace(tool_calls(("agent__list_running", {})), delay=0.2)
        if last.get("pending_escalations"):
            return tool_calls(("agent__cancel", {"id": results[0]["id"]}))
        return text(f"chief: {results[-1]['message']}")

    fake_llm.default = answer
    res = graphrun("run", "chief", "go", **_env(fake_llm, cfg))
    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "chief: Cancelled agent 'asker'."
    checked = next(
        r for req in fake_llm.requests for r in _tool_results(req) if r.get("pending_escalations")
    )
    # agent__check says so, and so does the next tool result after the question came.
    assert (
        checked.get("status") == "pending"
        or "agent__reply_escalation" in (checked["escalation_instruction"])
    )
    assert checked["pending_escalations"][0]["question"] == "[input] Your name?"
    child = next(
        e["child_run_id"]
        for e in _events(graphrun, _root(graphrun))
        if e["type"] == "ChildRunStarted"
    )
    assert _events(graphrun, child)[-1]["type"] == "RunCancelled"


def _escalating(slow_after_reply: float = 0.0) -> Any:
    """chief spawns asker, whose question it answers; asker's answer after the reply
    can be slow (to kill the run meanwhile)."""

    def answer(request: RecordedRequest) -> Reply:
        results = _tool_results(request)
        if "ASKER" in _system(request):
            if not results:
                return tool_calls(("user__input", {"question": "Your name?"}))
            return text(f"asker heard {results[-1]['answer']}", delay=slow_after_reply)
        if not results:
            return tool_calls(("agent__spawn", {"agent": "asker", "prompt": "ask"}))
        spawned, last = results[0], results[-1]
        if last.get("pending_escalations"):
            escalation = last["pending_escalations"][0]["escalation_id"]
            return tool_calls(
                ("agent__reply_escalation", {"escalation_id": escalation, "reply": "Ada"})
            )
        if last is spawned or last.get("original_question"):
            return tool_calls(("agent__collect", {"id": spawned["id"]}))
        return text("chief: " + last["output"])

    return answer


def test_kill_9_after_a_reply_resumes_the_child_with_it(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    _agent(cfg, "chief", "can_spawn_agents: true\ninstructions: CHIEF delegates.\n")
    fake_llm.default = _escalating(slow_after_reply=30.0)
    env = _env(fake_llm, cfg)
    proc = graphrun.popen("run", "chief", "go", **env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if sum("ASKER" in _system(r) for r in fake_llm.requests) >= 2:
            break
        time.sleep(0.05)
    else:
        proc.kill()
        proc.communicate(timeout=10)
        pytest.fail("the child never got the reply")
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)

    fake_llm.default = _escalating()
    fake_llm.requests.clear()
    resumed = graphrun("resume", _root(graphrun), **env)
    assert resumed.code == 0, resumed.stderr
    assert resumed.stdout.strip() == "chief: asker heard Ada"
    # The child asks nothing again: only its answer after the reply is requested again.
    asker = [r for r in fake_llm.requests if "ASKER" in _system(r)]
    assert len(asker) == 1 and _tool_results(asker[0]) == [{"answer": "Ada"}]
    root = _events(graphrun, _root(graphrun))
    child = next(e["child_run_id"] for e in root if e["type"] == "ChildRunStarted")
    types = [e["type"] for e in _events(graphrun, child)]
    assert types.count("HumanInputRequested") == 1 and types.count("HumanInputReceived") == 1
    assert [e["type"] for e in root].count("ChildRunStarted") == 1


def test_the_guardrail_cancels_agents_after_three_reminders(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path
) -> None:
    def answer(request: RecordedRequest) -> Reply:
        if "SLOW" in _system(request):
            return text("slow finished", delay=20.0)
        if not _tool_results(request):
            return tool_calls(("agent__spawn", {"agent": "slow", "prompt": "think"}))
        reminders = sum(1 for u in _user_messages(request) if u.startswith("[guardrail]"))
        return text(f"done waiting {reminders}")

    fake_llm.default = answer
    started = time.monotonic()
    res = graphrun("run", "boss", "do it", **_env(fake_llm, cfg))
    assert res.code == 0, res.stderr
    assert time.monotonic() - started < 15  # the slow agent was not waited for
    assert res.stdout.strip().splitlines() == [f"done waiting {n}" for n in range(4)]
    assert "cancelled agent_slow_" in res.stderr
    events = _events(graphrun, _root(graphrun))
    guards = [e for e in events if e["type"] == "LlmContinued"]
    assert [(e["reason"], e.get("count", 1)) for e in guards] == [
        ("pending_agents", 1),
        ("pending_agents", 2),
        ("pending_agents", 3),
    ]
    (finished,) = [e for e in events if e["type"] == "ChildRunFinished"]
    assert finished["status"] == "cancelled"
    child = _events(graphrun, finished["child_run_id"])
    assert child[-1]["type"] in ("RunCancelled", "RunInterrupted")
