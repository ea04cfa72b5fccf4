"""Loki's built-in functions in LLM-loop agents, through the real CLI and a fake LLM.

A Loki-shaped configuration directory with an orchestrator that delegates
(``agent__spawn``/``agent__collect``), agents that ask the user, keep todos and
load skills. Children are real child runs with their own logs; a ``kill -9``
mid-delegation is resumed without re-running the child that finished.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GraphrunCli
from tests.support.fake_llm import FakeLlm, RecordedRequest, Reply, text, tool_calls

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
    results = _tool_results(fake_llm.requests[2])
    assert results[4] == {
        "skills": [{"name": "checklist", "description": "A review checklist", "loaded": False}]
    }
    assert results[5]["instructions"] == "CHECK EVERY EDGE CASE."
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


def test_on_a_terminal_the_question_is_asked_there(
    graphrun: GraphrunCli, fake_llm: FakeLlm, cfg: Path, tmp_path: Path
) -> None:
    import re
    import sys

    import pexpect

    fake_llm.script(tool_calls(("user__confirm", {"question": "Proceed now?"})), text("went on"))
    env = {k: v for k, v in graphrun.env(**_env(fake_llm, cfg)).items()}
    env.pop("GRAPHRUN_NO_TTY", None)
    env.update(TERM="xterm", OUT=str(tmp_path / "stdout.txt"))
    child = pexpect.spawn(
        "/bin/sh",
        [
            "-c",
            'exec "$@" >"$OUT"',
            "sh",
            sys.executable,
            "-m",
            "graphrun.cli",
            "run",
            "asker",
            "go",
        ],
        env=env,
        cwd=str(tmp_path),
        encoding="utf-8",
        timeout=30,
        dimensions=(30, 120),
    )
    try:
        while child.expect(["Proceed now", re.escape("\x1b[6n")]) != 0:
            child.send("\x1b[5;1R")  # answer cursor-position requests as a terminal does
        child.send("1\r")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert (tmp_path / "stdout.txt").read_text().strip() == "went on"
    assert _tool_results(fake_llm.requests[-1]) == [{"answer": "yes"}]
    received = [e for e in _events(graphrun, _root(graphrun)) if e["type"] == "HumanInputReceived"]
    assert [(e["answer"], e["channel"]) for e in received] == [("yes", "tty")]


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
    loaded, refused = _tool_results(fake_llm.requests[1])
    assert loaded["instructions"] == "CHECK EVERY EDGE CASE."
    assert refused == {"error": "Skill 'secret' is not enabled in this context"}
