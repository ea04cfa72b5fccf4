"""A Loki-shaped configuration directory (tests/data/loki) runs unchanged.

Tools are written as Loki's are (no argc dispatch line, ``source
"$LLM_PROMPT_UTILS_FILE"``), clients use ``{{NAME}}`` keys and Loki's other client
types, the agents name no model. Everything runs for real: the CLI in a
subprocess, bash tools, an OpenAI-compatible server on 127.0.0.1.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from graphrun.actors.tools.toolbox import load_toolbox
from graphrun.eventstore import redaction
from tests.conftest import GraphrunCli
from tests.support.fake_llm import FakeLlm, text, tool_calls

DATA = Path(__file__).resolve().parents[1] / "data" / "loki"
KEY = "sk-loki-test-0123456789abcdef"


@pytest.fixture
def loki_dir(tmp_path: Path) -> Path:
    target = tmp_path / "loki"
    shutil.copytree(DATA, target)
    return target


@pytest.fixture(autouse=True)
def _forget_secrets():  # type: ignore[no-untyped-def]
    yield
    redaction.clear()


def test_a_tool_without_the_argc_line_really_runs(loki_dir: Path, tmp_path: Path) -> None:
    agent = loki_dir / "agents" / "writer"
    box = load_toolbox(agent, ["fs_write"], global_tools=["fs_write.sh"], config_dir=loki_dir)
    target = tmp_path / "out" / "hello.txt"
    result = box.call("fs_write", json.dumps({"path": str(target), "contents": "hi there"}))
    assert (result.is_error, result.output.strip()) == (
        False,
        f"The file contents were written to: {target}",
    )
    assert target.read_text() == "hi there"
    # A second write goes through guard_operation: AUTO_CONFIRM lets it through.
    result = box.call("fs_write", json.dumps({"path": str(target), "contents": "again"}))
    assert not result.is_error and target.read_text() == "again"


def test_a_tool_whose_function_never_runs_is_an_error(loki_dir: Path) -> None:
    agent = loki_dir / "agents" / "writer"
    box = load_toolbox(agent, ["stops_early"], global_tools=["stops_early.sh"], config_dir=loki_dir)
    result = box.call("stops_early", "{}")
    assert result.is_error
    assert result.output == (
        "tool 'stops_early': stops_early.sh ended without calling its function 'main' "
        "(does the script exit before its end?)"
    )


def test_agent_tools_get_lokis_environment(loki_dir: Path, tmp_path: Path) -> None:
    agent = loki_dir / "agents" / "writer"
    box = load_toolbox(agent, ["append_line", "where_am_i"], config_dir=loki_dir)
    project = tmp_path / "project"
    project.mkdir()
    env = {"WRITER_VARIABLES": json.dumps({"project_dir": str(project)})}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        result = box.call("append_line", json.dumps({"path": "notes.md", "line": "one"}))
        assert (result.is_error, result.output.strip()) == (False, "appended to notes.md")
        assert (project / "notes.md").read_text() == "one\n"
        result = box.call("where_am_i", "{}")
    assert result.output.splitlines() == [
        f"project={project}",
        "helper from functions/bin: ping",
    ]


def test_tools_get_no_keys_and_dotenv_values(loki_dir: Path) -> None:
    (loki_dir / ".env").write_text("FROM_DOTENV=yes\nANTHROPIC_API_KEY=sk-ant-dotenv-123456\n")
    agent = loki_dir / "agents" / "writer"
    box = load_toolbox(agent, ["show_env"], global_tools=["show_env.sh"], config_dir=loki_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", KEY)
        mp.setenv("LOKI_TEST_API_KEY", KEY)
        result = box.call("show_env", "{}")
    lines = set(result.output.splitlines())
    assert "FROM_DOTENV=yes" in lines
    assert "AUTO_CONFIRM=true" in lines
    assert f"LLM_PROMPT_UTILS_FILE={loki_dir}/functions/utils/prompt-utils.sh" in lines
    assert f"LLM_AGENT_DATA_DIR={agent.resolve()}" in lines
    assert "LLM_AGENT_VAR_PROJECT_DIR=." in lines
    assert KEY not in result.output
    assert "sk-ant-dotenv-123456" not in result.output
    assert not any(line.startswith(("OPENAI_API_KEY=", "ANTHROPIC_API_KEY=")) for line in lines)


def run_env(fake: FakeLlm, loki_dir: Path) -> dict[str, str]:
    # The client's api_base and key come from {{NAME}}: the key from the
    # environment, the base URL from the config dir's .env.
    (loki_dir / ".env").write_text(f"LOKI_TEST_API_BASE={fake.url_openai}\n")
    return {
        "GRAPHRUN_CONFIG_DIR": str(loki_dir),
        "GRAPHRUN_AGENTS_DIR": str(loki_dir / "agents"),
        "LOKI_TEST_API_KEY": KEY,
        "OPENAI_API_KEY": KEY,
    }


def test_loop_agent_runs_unchanged_with_the_default_model(
    loki_dir: Path, tmp_path: Path, fake_llm: FakeLlm, graphrun: GraphrunCli
) -> None:
    target = tmp_path / "written.txt"
    fake_llm.script(
        tool_calls(("fs_write", {"path": str(target), "contents": "from the model"})),
        tool_calls(("show_env", {})),
        text(f"done; the key is {KEY}"),
    )
    result = graphrun("run", "writer", "write the file", **run_env(fake_llm, loki_dir))
    assert result.code == 0, result.stderr
    assert target.read_text() == "from the model"
    first = fake_llm.requests[0]
    assert first.body["model"] == "gpt-local"  # config.yaml's model:
    assert first.headers["authorization"] == f"Bearer {KEY}"
    # The key is in no event, export or narration, even though the model echoed it.
    assert result.stdout.strip() == "done; the key is ***"
    assert KEY not in result.stderr
    exported = graphrun("export", graphrun.last_run())
    assert exported.code == 0 and KEY not in exported.stdout
    assert '"type":"LlmCalled"' in exported.stdout.replace(" ", "")
    tool_results = [r for r in fake_llm.requests[2].body["messages"] if r["role"] == "tool"]
    assert KEY not in json.dumps(tool_results)


def test_graph_agent_without_a_model_uses_the_agent_model_variable(
    loki_dir: Path, tmp_path: Path, fake_llm: FakeLlm, graphrun: GraphrunCli
) -> None:
    target = tmp_path / "scribe.txt"
    fake_llm.script(
        tool_calls(("fs_write", {"path": str(target), "contents": "scribed"})),
        text("written"),
    )
    env = run_env(fake_llm, loki_dir) | {"SCRIBE_MODEL": "local:scribe-model"}
    result = graphrun("run", "scribe", "go", **env)
    assert result.code == 0, result.stderr
    assert (result.stdout.strip(), target.read_text()) == ("written", "scribed")
    assert fake_llm.requests[0].body["model"] == "scribe-model"
    # The model chosen is part of the recorded graph: replay needs no environment.
    replayed = graphrun("replay", graphrun.last_run(), "--config-dir", str(loki_dir))
    assert replayed.code == 0, replayed.stderr


def test_an_unsupported_client_is_an_error_only_when_used(
    loki_dir: Path, fake_llm: FakeLlm, graphrun: GraphrunCli
) -> None:
    env = run_env(fake_llm, loki_dir) | {"WRITER_MODEL": "vertex:gemini-pro"}
    result = graphrun("run", "writer", "hi", **env)
    assert result.code == 2
    assert "client 'vertex' has type 'vertexai', which graphrun cannot call" in result.stderr
    assert "Traceback" not in result.stderr


def test_script_nodes_get_lokis_environment_and_no_keys(
    loki_dir: Path, fake_llm: FakeLlm, graphrun: GraphrunCli
) -> None:
    result = graphrun("run", "scripted", **run_env(fake_llm, loki_dir))
    assert result.code == 0, result.stderr
    agent = loki_dir / "agents" / "scripted"
    assert result.stdout.strip() == (
        f"root={loki_dir} data={agent.resolve()} confirm=true keys=0 helper from functions/bin: hi"
    )


def test_scripts_and_tools_run_where_graphrun_was_started(
    loki_dir: Path, tmp_path: Path, fake_llm: FakeLlm, graphrun: GraphrunCli
) -> None:
    # Loki's step-runner resolves its ``project_dir: '.'`` in a script and its tools
    # write relative paths: both mean the user's project (the directory the run was
    # started in, here tmp_path), never the agent directory.
    agent = loki_dir / "agents" / "stepper"
    failed = graphrun("run", "stepper", "go", **run_env(fake_llm, loki_dir))
    assert failed.code == 0, failed.stderr
    assert failed.stdout.strip() == f"STEP_FAILED no plan at {tmp_path}/plans/next.md"
    assert fake_llm.requests == []

    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "next.md").write_text("write the notes")
    fake_llm.script(
        tool_calls(("fs_write", {"path": "notes/step.md", "contents": "step done"})),
        text("wrote notes/step.md"),
    )
    result = graphrun("run", "stepper", "go", **run_env(fake_llm, loki_dir))
    assert result.code == 0, result.stderr
    assert result.stdout.strip() == "wrote notes/step.md"
    prompt = fake_llm.requests[0].body["messages"][-1]["content"]
    assert prompt == f"Carry out this plan in {tmp_path}: write the notes"
    assert (tmp_path / "notes" / "step.md").read_text() == "step done"
    assert not (agent / "notes").exists()


def test_a_tool_that_names_a_key_gets_it_and_never_shows_it(loki_dir: Path) -> None:
    tool = loki_dir / "functions" / "tools" / "calls_api.sh"
    tool.write_text(
        "#!/usr/bin/env bash\n"
        "# @describe Calls an API with the OpenAI key.\n"
        "# @env OPENAI_API_KEY! The key\n"
        'main() { echo "key length ${#OPENAI_API_KEY}: $OPENAI_API_KEY" >> "$LLM_OUTPUT"; }\n'
    )
    agent = loki_dir / "agents" / "writer"
    box = load_toolbox(agent, ["calls_api"], global_tools=["calls_api.sh"], config_dir=loki_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", KEY)
        result = box.call("calls_api", "{}")
    assert (result.is_error, result.output.strip()) == (False, f"key length {len(KEY)}: ***")


def test_a_key_in_the_base_urls_userinfo_is_not_recorded(
    tmp_path: Path, fake_llm: FakeLlm, graphrun: GraphrunCli
) -> None:
    agent = tmp_path / "ask"
    agent.mkdir()
    (agent / "graph.yaml").write_text(
        'name: ask\nversion: "1.0"\nmodel: openai:gpt-test\nstart: a\nnodes:\n'
        '  a:\n    type: llm\n    prompt: "{{initial_prompt}}"\n'
        '    state_updates:\n      answer: "{{output}}"\n    next: done\n'
        '  done:\n    type: end\n    output: "{{answer}}"\n'
    )
    url = fake_llm.url_openai.replace("http://", "http://proxyuser:pw-in-url-98765@")
    result = graphrun("run", str(agent), "hi", OPENAI_BASE_URL=url, OPENAI_API_KEY=KEY)
    assert result.code == 0, result.stderr
    exported = graphrun("export", graphrun.last_run())
    assert "pw-in-url-98765" not in exported.stdout and KEY not in exported.stdout
    assert "proxyuser:***@127.0.0.1" in exported.stdout
