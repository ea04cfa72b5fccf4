"""Agent ``variables`` end to end: ``--var``, defaults, ``$<AGENT>_VARIABLES``, the
terminal prompt, the missing-variables error, recorded values on resume, child runs,
and ``LLM_AGENT_VAR_<NAME>`` in scripts and tools. Real CLI processes, real scripts."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GraphrunCli, write_agent
from tests.integration.test_human_nodes import events, of_type
from tests.integration.test_human_tty import ENTER, terminal  # noqa: F401 (fixture)
from tests.support.fake_llm import FakeLlm, text, tool_calls

pytestmark = pytest.mark.timeout(60)

# Prints the variables it sees (and whether they are in GRAPH_STATE) as JSON.
SHOW_VARS = """\
import json, os
state = json.loads(os.environ["GRAPH_STATE"])
print(json.dumps({
    "seen": {k[len("LLM_AGENT_VAR_"):]: v for k, v in sorted(os.environ.items())
             if k.startswith("LLM_AGENT_VAR_")},
    "in_state": sorted(k for k in ("project_dir", "mode") if k in state),
}))
"""

GRAPH = """\
name: vars
version: "1.0"
variables:
  - name: project_dir
    description: Project root
    default: "."
  - name: mode
    description: Run mode
start: show
nodes:
  show:
    type: script
    script: show.py
    next: done
  done:
    type: end
    output: "{{seen}} {{in_state}}"
"""


def vars_agent(root: Path, graph: str = GRAPH) -> Path:
    return write_agent(root, graph, {"show.py": SHOW_VARS})


def scripts(graphrun: GraphrunCli, run_id: str | None = None) -> list[dict[str, Any]]:
    """What the scripts saw, from the ScriptFinished events (oldest first)."""
    return [e["output"] for e in of_type(events(graphrun.db, run_id), "ScriptFinished")]


def started(graphrun: GraphrunCli, run_id: str | None = None) -> list[dict[str, Any]]:
    return of_type(events(graphrun.db, run_id), "RunStarted")


def test_presets_win_over_the_environment_and_defaults(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    agent = vars_agent(tmp_path / "vars")
    env = {"VARS_VARIABLES": json.dumps({"project_dir": "/from/env", "mode": "env"})}

    res = graphrun("run", str(agent), "--var", "mode=fast", "--var", "project_dir=/p", **env)

    assert res.code == 0, res.stderr
    (out,) = scripts(graphrun)
    assert out == {"seen": {"MODE": "fast", "PROJECT_DIR": "/p"}, "in_state": []}
    (first,) = started(graphrun)
    assert first["config"]["variables"] == {"project_dir": "/p", "mode": "fast"}
    # Not seeded into state (Loki): scripts read them from their environment.
    assert "mode" not in first["initial_state"]


def test_defaults_and_lokis_list_shape_of_the_environment(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    agent = vars_agent(tmp_path / "vars")

    res = graphrun("run", str(agent), "--var", "mode=slow")
    assert res.code == 0, res.stderr
    # Loki's list shape replaces the declarations: project_dir is no longer one.
    listed = [{"name": "mode", "description": "Run mode", "default": "listed"}]
    res2 = graphrun("run", str(agent), VARS_VARIABLES=json.dumps(listed))
    assert res2.code == 0, res2.stderr
    res3 = graphrun("run", str(agent), "--var", "mode=flag", VARS_VARIABLES=json.dumps(listed))
    assert res3.code == 0, res3.stderr

    assert [o["seen"] for o in scripts(graphrun)] == [
        {"MODE": "slow", "PROJECT_DIR": "."},
        {"MODE": "listed"},
        {"MODE": "flag"},
    ]


def test_missing_variables_are_one_error_and_nothing_is_recorded(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    graph = GRAPH.replace('    default: "."\n', "")
    agent = vars_agent(tmp_path / "vars", graph)

    res = graphrun("run", str(agent), GRAPHRUN_NO_TTY="1")

    assert res.code == 2
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert res.stderr.startswith(
        "error: the following agent variables are required: "
        "project_dir (Project root), mode (Run mode) (pass --var NAME=VALUE"
    )
    assert "$VARS_VARIABLES" in res.stderr
    assert graphrun("runs", "--json").json_lines() == []


def test_bad_var_flags_are_usage_errors(graphrun: GraphrunCli, tmp_path: Path) -> None:
    agent = vars_agent(tmp_path / "vars")

    bad = graphrun("run", str(agent), "--var", "mode")
    unknown = graphrun("run", str(agent), "--var", "mood=x", "--var", "mode=y")

    assert bad.code == 2 and bad.stderr.strip() == "error: --var expects NAME=VALUE, got 'mode'"
    assert unknown.code == 2
    assert unknown.stderr.strip() == (
        "error: --var mood: agent 'vars' declares no variable 'mood' "
        "(its variables: mode, project_dir)"
    )
    assert graphrun("runs", "--json").json_lines() == []


WAITING = """\
name: waits
version: "1.0"
variables:
  - name: mode
    description: Run mode
start: before
nodes:
  before:
    type: script
    script: show.py
    next: ask
  ask:
    type: input
    question: "Go on?"
    state_updates:
      answer: "{{input}}"
    next: after
  after:
    type: script
    script: show.py
    next: done
  done:
    type: end
    output: "{{answer}}"
"""


def test_a_resumed_run_keeps_the_values_it_began_with(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    agent = vars_agent(tmp_path / "waits", WAITING)
    listed = [{"name": "mode", "description": "Run mode", "default": "first"}]

    res = graphrun("run", str(agent), GRAPHRUN_NO_TTY="1", WAITS_VARIABLES=json.dumps(listed))
    assert res.code == 3, res.stderr
    run_id = graphrun.last_run()
    # Later, the environment says otherwise: the started run does not change.
    listed[0]["default"] = "later"
    res = graphrun("resume", run_id, "--answer", "ask=yes", WAITS_VARIABLES=json.dumps(listed))

    assert res.code == 0, res.stderr
    assert [o["seen"] for o in scripts(graphrun, run_id)] == [{"MODE": "first"}] * 2


def test_answer_and_fork_keep_the_recorded_values(graphrun: GraphrunCli, tmp_path: Path) -> None:
    agent = vars_agent(tmp_path / "waits", WAITING)

    res = graphrun("run", str(agent), "--var", "mode=given", GRAPHRUN_NO_TTY="1")
    assert res.code == 3, res.stderr
    run_id = graphrun.last_run()
    seq = next(e["seq"] for e in events(graphrun.db, run_id) if e["type"] == "NodeCompleted")
    res = graphrun("answer", run_id, "yes", "--as", "alice")
    assert res.code == 0, res.stderr
    forked = graphrun("fork", run_id, "--at", str(seq), "--answer", "ask=again")
    assert forked.code == 0, forked.stderr

    seen_all = [o["seen"] for o in scripts(graphrun)]
    assert seen_all == [{"MODE": "given"}] * 4


def test_a_terminal_asks_for_a_missing_variable(
    terminal: Any,  # noqa: F811
    graphrun: GraphrunCli,
    tmp_path: Path,
) -> None:
    agent = vars_agent(tmp_path / "vars")

    term = terminal("run", str(agent))
    term.expect(re.escape("mode (Run mode):"))
    term.child.send(ENTER)  # empty: refused
    term.expect("This field is required")
    term.expect(re.escape("mode (Run mode):"))
    term.child.send("typed" + ENTER)
    status, _out, screen = term.finish()

    assert status == 0, screen
    assert "Init agent variables" in screen
    assert "project_dir (" not in screen  # a default is never asked for
    (out,) = scripts(graphrun)
    assert out["seen"] == {"MODE": "typed", "PROJECT_DIR": "."}
    assert started(graphrun)[0]["config"]["variables"]["mode"] == "typed"


PARENT = """\
name: parent
version: "1.0"
variables:
  - name: mode
    description: Run mode
start: show
nodes:
  show:
    type: script
    script: show.py
    next: delegate
  delegate:
    type: agent
    agent: child
    prompt: "go"
    state_updates:
      child: "{{output}}"
    next: done
  done:
    type: end
    output: "{{child}}"
"""

CHILD = """\
name: child
version: "1.0"
variables:
  - name: mode
    description: Child mode
    default: child-default
start: show
nodes:
  show:
    type: script
    script: show.py
    next: done
  done:
    type: end
    output: "child done"
"""


def test_a_child_run_resolves_its_own_variables(graphrun: GraphrunCli, tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    vars_agent(agents / "child", CHILD)
    parent = vars_agent(tmp_path / "parent", PARENT)

    res = graphrun("run", str(parent), "--var", "mode=parent-flag", "--agents-dir", str(agents))

    assert res.code == 0, res.stderr
    runs = {r["graph_name"]: r["run_id"] for r in started(graphrun)}
    assert scripts(graphrun, runs["parent"])[0]["seen"] == {"MODE": "parent-flag"}
    assert scripts(graphrun, runs["child"])[0]["seen"] == {"MODE": "child-default"}
    child = started(graphrun, runs["child"])[0]
    assert child["config"] == {"variables": {"mode": "child-default"}}


def test_a_child_without_a_value_fails_its_node_and_is_not_prompted(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    agents = tmp_path / "agents"
    vars_agent(agents / "child", CHILD.replace("    default: child-default\n", ""))
    parent = vars_agent(tmp_path / "parent", PARENT)

    res = graphrun("run", str(parent), "--var", "mode=p", "--agents-dir", str(agents))

    assert res.code == 1
    assert "the following agent variables are required: mode (Child mode)" in res.stderr
    assert [r["graph_name"] for r in started(graphrun)] == ["parent"]


TOOLS = """\
#!/usr/bin/env bash
set -e
# @env LLM_OUTPUT=/dev/stdout The output path

# @cmd Tell where the project is
where() {
  echo "project=$LLM_AGENT_VAR_PROJECT_DIR mode=$LLM_AGENT_VAR_MODE" >> "$LLM_OUTPUT"
}
eval "$(argc --argc-eval "$0" "$@")"
"""

TOOL_GRAPH = """\
name: tooled
version: "1.0"
model: openai:gpt-test
variables:
  - name: project_dir
    description: Project root
    default: "."
  - name: mode
    description: Run mode
start: ask
nodes:
  ask:
    type: llm
    prompt: "Where?"
    tools: [where]
    state_updates:
      answer: "{{output}}"
    next: done
  done:
    type: end
    output: "{{answer}}"
"""


def test_a_tool_sees_the_runs_variables(
    graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    agent = write_agent(tmp_path / "tooled", TOOL_GRAPH, {"tools.sh": TOOLS})
    fake_llm.script(tool_calls(("where", {})), text("done"))

    res = graphrun(
        "run",
        str(agent),
        "--var",
        "mode=tool-mode",
        OPENAI_BASE_URL=fake_llm.url_openai,
        OPENAI_API_KEY="sk-test",
        TOOLED_VARIABLES=json.dumps({"project_dir": "/env/project"}),
    )

    assert res.code == 0, res.stderr
    (result,) = of_type(events(graphrun.db), "ToolCalled")
    assert result["result"].strip() == "project=/env/project mode=tool-mode"
    sent = fake_llm.requests[1].body["messages"][-1]["content"]
    assert "project=/env/project mode=tool-mode" in sent


def test_an_llm_loop_agent_takes_var_into_its_instructions(
    graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    agent = tmp_path / "needy"
    agent.mkdir()
    (agent / "config.yaml").write_text(
        "model: openai:gpt-test\n"
        'instructions: "Hello {{user_name}}"\n'
        "variables:\n"
        "  - name: user_name\n"
        "    description: Who you are\n",
        encoding="utf-8",
    )
    fake_llm.script(text("hi"))

    res = graphrun(
        "run",
        str(agent),
        "hi",
        "--var",
        "user_name=Ada",
        OPENAI_BASE_URL=fake_llm.url_openai,
        OPENAI_API_KEY="sk-test",
    )

    assert res.code == 0, res.stderr
    assert fake_llm.requests[0].body["messages"][0]["content"].startswith("Hello Ada\n\n## ")
    assert started(graphrun)[0]["config"]["variables"] == {"user_name": "Ada"}


def test_a_live_replay_against_a_changed_graph_keeps_the_recorded_values(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    agent = vars_agent(tmp_path / "vars")
    res = graphrun("run", str(agent), "--var", "mode=recorded")
    assert res.code == 0, res.stderr
    run_id = graphrun.last_run()
    # A changed script is performed anew; the environment now gives another mode.
    changed = vars_agent(tmp_path / "changed", GRAPH.replace("name: vars", "name: changed"))
    (changed / "show.py").write_text(
        SHOW_VARS.replace('"in_state"', '"changed": True, "in_state"'), encoding="utf-8"
    )
    listed = [{"name": "mode", "description": "Run mode", "default": "env"}]

    live = graphrun(
        "replay", run_id, "--graph", str(changed), "--live", CHANGED_VARIABLES=json.dumps(listed)
    )

    assert live.code == 1, live.stderr  # the script prints something else: diverged
    assert "performed 1 (show#1 (script changed))" in live.stderr
    new_runs = [r["run_id"] for r in started(graphrun) if r["run_id"] != run_id]
    assert scripts(graphrun, new_runs[0])[0]["seen"]["MODE"] == "recorded"
