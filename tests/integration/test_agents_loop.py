"""LLM-loop agents (Loki's config.yaml) run directly, through the real CLI and a fake LLM."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import GraphrunCli
from tests.support.fake_llm import FakeLlm, text, tool_calls

WEATHER_TOOLS = """\
#!/usr/bin/env bash
set -e
# @env LLM_OUTPUT=/dev/stdout The output path

# @cmd Get the weather for a city
# @option --city! The city
get_weather() {
  echo "sunny in $argc_city" >> "$LLM_OUTPUT"
}

# @cmd Generates instructions for the agent dynamically
_instructions() {
  echo "Dynamic rules for {{mood}} answers on {{__os__}}." >> "$LLM_OUTPUT"
}
eval "$(argc --argc-eval "$0" "$@")"
"""


def write_loop_agent(root: Path, config: str, files: dict[str, str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text(textwrap.dedent(config).lstrip(), encoding="utf-8")
    for name, body in (files or {}).items():
        (root / name).write_text(body, encoding="utf-8")
    return root


def llm_env(fake: FakeLlm) -> dict[str, str]:
    return {"OPENAI_BASE_URL": fake.url_openai, "OPENAI_API_KEY": "sk-test"}


WEATHER_CONFIG = """\
    name: weather
    description: Answers weather questions
    version: 1
    model: openai:gpt-test
    temperature: 0.2
    top_p: 0.9
    agent_session: temp
    auto_continue: false
    instructions: |
      You are {{mood}}. OS={{__os__}} family={{__os_family__}} cwd={{__cwd__}} now={{__now__}}
      Tools:
      {{__tools__}}
    variables:
      - name: mood
        description: How to sound
        default: cheerful
      - name: unit
        description: Temperature unit
        default: celsius
    conversation_starters:
      - What is the weather in Oslo?
"""


def test_loop_agent_runs_a_tool_loop_to_a_final_answer(
    graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    agents = tmp_path / "agents"
    write_loop_agent(agents / "weather", WEATHER_CONFIG, {"tools.sh": WEATHER_TOOLS})
    fake_llm.script(tool_calls(("get_weather", {"city": "Oslo"})), text("Sunny in Oslo."))

    res = graphrun(
        "run", "weather", "Weather in Oslo?", "--agents-dir", str(agents), **llm_env(fake_llm)
    )

    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "Sunny in Oslo."
    first = fake_llm.requests[0].body
    system = first["messages"][0]["content"]
    assert system.startswith("You are cheerful. OS=")
    assert f"cwd={graphrun.tmp_path}" in system
    assert "{{" not in system
    assert "- get_weather: Get the weather for a city" in system
    assert "_instructions" not in system  # private functions are not tools
    assert first["temperature"] == 0.2 and first["top_p"] == 0.9
    # The agent's tool, then what Loki gives every agent: teammate messages, questions
    # to the user, skills.
    assert [t["function"]["name"] for t in first["tools"]] == [
        "get_weather",
        "agent__send_message",
        "agent__check_inbox",
        "user__select",
        "user__confirm",
        "user__input",
        "user__checkbox",
        "skill__list",
        "skill__load",
        "skill__unload",
    ]
    assert first["messages"][1] == {"role": "user", "content": "Weather in Oslo?"}
    second = fake_llm.requests[1].body["messages"]
    assert second[-1]["content"].strip() == "sunny in Oslo"
    # Fields graphrun does not implement are accepted, each warned about once.
    assert res.stderr.count("'agent_session' is not supported") == 1
    assert "auto_continue" not in res.stderr  # false: nothing to offer, nothing to warn about
    events = graphrun("events", graphrun.last_run(), "--json").json_lines()
    types = [e["type"] for e in events]  # type: ignore[index]
    assert types.count("LlmCalled") == 2 and "ToolCalled" in types
    assert types[-1] == "RunCompleted"


def test_variables_from_the_environment_override_defaults(
    graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    agent = write_loop_agent(tmp_path / "weather", WEATHER_CONFIG, {"tools.sh": WEATHER_TOOLS})
    fake_llm.script(text("ok"))

    res = graphrun(
        "run",
        str(agent),
        "hi",
        WEATHER_VARIABLES=json.dumps({"mood": "grumpy"}),
        **llm_env(fake_llm),
    )

    assert res.code == 0, res.stderr
    assert fake_llm.requests[0].body["messages"][0]["content"].startswith("You are grumpy.")


def test_bad_variables_env_and_missing_variables_are_clear_errors(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    agent = write_loop_agent(
        tmp_path / "needy",
        """\
        model: openai:gpt-test
        instructions: "Hello {{user_name}}"
        variables:
          - name: user_name
            description: Who you are
        """,
    )

    missing = graphrun("run", str(agent), "hi")
    bad = graphrun("run", str(agent), "hi", NEEDY_VARIABLES="[1, 2]")

    assert missing.code == 2
    assert missing.stderr.strip() == (
        "error: the following agent variables are required: user_name (Who you are) "
        "(pass --var NAME=VALUE, give them a default, or set $NEEDY_VARIABLES)"
    )
    assert bad.code == 2
    assert bad.stderr.strip() == "error: $NEEDY_VARIABLES must be a JSON object"


def test_dynamic_instructions_come_from_the_instructions_function(
    graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    agent = write_loop_agent(
        tmp_path / "weather",
        WEATHER_CONFIG.replace("    agent_session: temp\n", "    dynamic_instructions: true\n"),
        {"tools.sh": WEATHER_TOOLS},
    )
    fake_llm.script(text("ok"))

    res = graphrun("run", str(agent), "hi", **llm_env(fake_llm))

    assert res.code == 0, res.stderr
    system = fake_llm.requests[0].body["messages"][0]["content"]
    assert system.startswith("Dynamic rules for cheerful answers on ")
    assert "{{" not in system
    assert "dynamic_instructions" not in res.stderr  # implemented, so not warned about


def test_dynamic_instructions_from_python_tools(
    graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    agent = write_loop_agent(
        tmp_path / "pyagent",
        """\
        model: openai:gpt-test
        dynamic_instructions: true
        """,
        {
            "tools.py": 'def _instructions():\n    return "Generated by Python."\n\n'
            "def shout(word: str) -> str:\n"
            '    """Shout a word.\n\n    Args:\n        word: The word\n    """\n'
            "    return word.upper()\n"
        },
    )
    fake_llm.script(text("ok"))

    res = graphrun("run", str(agent), "hi", **llm_env(fake_llm))

    assert res.code == 0, res.stderr
    body = fake_llm.requests[0].body
    system = body["messages"][0]["content"]
    # Loki appends how to message teammates and ask the user to every agent's instructions.
    assert system.startswith("Generated by Python.\n\n## Messages between agents")
    assert body["tools"][0]["function"]["name"] == "shout"


def test_dynamic_instructions_without_the_function_is_an_error(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    agent = write_loop_agent(
        tmp_path / "nodyn", "model: openai:gpt-test\ndynamic_instructions: true\n"
    )

    res = graphrun("run", str(agent), "hi")

    assert res.code == 2
    assert "sets dynamic_instructions but defines no _instructions function" in res.stderr
    assert "Traceback" not in res.stderr


def test_config_problems_point_at_config_yaml(graphrun: GraphrunCli, tmp_path: Path) -> None:
    agent = write_loop_agent(
        tmp_path / "broken",
        """\
        name: broken
        model: openai:gpt-test
        temperature: hot
        """,
    )

    res = graphrun("run", str(agent), "hi")

    assert res.code == 2
    assert res.stderr.strip() == (
        f"error: {agent / 'config.yaml'}:3 ($.temperature): agent 'broken': "
        "expected float | null, got str"
    )


@pytest.mark.parametrize("how", ["flag", "env"])
def test_loki_config_dir_supplies_agents_tools_and_clients(
    graphrun: GraphrunCli,
    fake_llm: FakeLlm,
    tmp_path: Path,
    how: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loki = tmp_path / "loki"
    tools_dir = loki / "functions" / "tools"
    tools_dir.mkdir(parents=True)
    (tools_dir / "get_time.sh").write_text(
        "#!/usr/bin/env bash\n# @describe Get the current time\n"
        'main() {\n  echo "noon" >> "$LLM_OUTPUT"\n}\n'
        'eval "$(argc --argc-eval "$0" "$@")"\n',
        encoding="utf-8",
    )
    (loki / "config.yaml").write_text(
        "clients:\n  - type: openai-compatible\n    name: local\n"
        f"    api_base: {fake_llm.url_openai}\n    models:\n      - name: small\n"
        "        real_name: served-model\n",
        encoding="utf-8",
    )
    write_loop_agent(
        loki / "agents" / "clock",
        """\
        model: local:small
        instructions: Tell the time.
        global_tools:
          - get_time.sh
        """,
    )
    fake_llm.script(tool_calls(("get_time", {})), text("It is noon."))
    monkeypatch.delenv("GRAPHRUN_CONFIG_DIR")

    if how == "flag":
        res = graphrun("run", "clock", "time?", "--loki-dir", str(loki))
    else:
        res = graphrun("run", "clock", "time?", LOKI_CONFIG_DIR=str(loki))

    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "It is noon."
    assert fake_llm.requests[0].body["model"] == "served-model"
    assert fake_llm.requests[1].body["messages"][-1]["content"].strip() == "noon"
