"""Tool discovery (tools.py, tools.sh, global tools), whitelists and running tools."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from graphrun.actors.base import CancelToken
from graphrun.actors.llm.providers.base import ToolSpec
from graphrun.actors.tools.toolbox import (
    ToolError,
    discover_tools,
    load_toolbox,
    validate_whitelist,
)

TOOLS_PY = '''
from typing import List, Literal, Optional


def search(query: str, limit: int = 5, exact: bool = False) -> str:
    """Search the notes.

    Looks through every note.

    Args:
        query: What to look for,
            over two lines.
        limit (int): How many results.
        exact: Match whole words only.

    Returns:
        The matches.
    """
    return f"{query}:{limit}:{exact}"


def classify(
    mode: Literal["fast", "slow"],
    tags: list[str],
    ratio: float,
    note: Optional[str] = None,
    extra: int | None = None,
    ids: List[int] = (),
):
    """Classify something."""
    return {"mode": mode, "tags": tags, "ratio": ratio, "note": note}


def env_report():
    """Report the LLM_* environment and the working directory."""
    import os
    keys = sorted(k for k in os.environ if k.startswith("LLM_"))
    return {"cwd": os.getcwd(), **{k: os.environ[k] for k in keys}}


def noisy():
    """Print instead of returning."""
    print("from stdout")


def broken(reason: str):
    """Always fails."""
    raise RuntimeError(reason)


def sleepy(seconds: float):
    """Sleep, then answer."""
    import time
    time.sleep(seconds)
    return "woke"


def _helper():
    return 1
'''

TOOLS_SH = """#!/usr/bin/env bash
set -e
# @env LLM_OUTPUT=/dev/stdout The output path

# @cmd List files in a folder
# @option --dir! <PATH>        The folder
# @option --kind[file|dir]     What to list
#                              (files or folders)
# @option --pattern* <GLOB>    Patterns to match
# @option --depth <INT>        How deep
# @flag   -a --all             Include hidden files
list-files() {
    {
        echo "dir=$argc_dir kind=${argc_kind:-} all=${argc_all:-0} depth=${argc_depth:-}"
        echo "patterns=${argc_pattern[*]:-}"
        echo "cli=$cli"
    } >> "$LLM_OUTPUT"
}

# @cmd Say hello on stdout only
# @option --name=world Who to greet
greet() {
    echo "hello $argc_name"
}

# @cmd Fail loudly
fail() {
    echo "something broke" >&2
    exit 3
}

# @cmd Sleep in a child process
sleep_long() {
    sleep 30
}

_private() {
    echo never
}

cli="$*"  # the command line, which scripts built by Loki parse themselves

eval "$(argc --argc-eval "$0" "$@")"
"""

GLOBAL_SH = """#!/usr/bin/env bash
# @describe Get the current time
# @env LLM_OUTPUT=/dev/stdout The output path
# @option --zone <TZ> The time zone
main() {
    echo "time in ${argc_zone:-UTC}" >> "$LLM_OUTPUT"
}
eval "$(argc --argc-eval "$0" "$@")"
"""

GLOBAL_PY = '''
def run(city: str) -> str:
    """Get the weather for a city.

    Args:
        city: The city name
    """
    return f"sunny in {city}"


def helper():
    """Not a tool: global tool files expose only run."""
'''


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    tools = tmp_path / "config" / "functions" / "tools"
    tools.mkdir(parents=True)
    (tools / "get-time.sh").write_text(GLOBAL_SH)
    (tools / "weather.py").write_text(GLOBAL_PY)
    return tmp_path / "config"


@pytest.fixture
def agent_dir(config_dir: Path) -> Path:
    agent = config_dir / "agents" / "notes"
    agent.mkdir(parents=True)
    (agent / "tools.py").write_text(TOOLS_PY)
    (agent / "tools.sh").write_text(TOOLS_SH)
    return agent


def toolbox(agent_dir: Path, config_dir: Path, *names: str, **kwargs: object):
    return load_toolbox(
        agent_dir,
        list(names),
        global_tools=["get-time.sh", "weather.py"],
        config_dir=config_dir,
        **kwargs,  # type: ignore[arg-type]
    )


# --------------------------------------------------------------------------- #
# Discovery
# --------------------------------------------------------------------------- #


def test_discovers_every_source(agent_dir: Path, config_dir: Path) -> None:
    specs = discover_tools(
        agent_dir, global_tools=["get-time.sh", "weather.py"], config_dir=config_dir
    )
    assert {name: spec.source for name, spec in specs.items()} == {
        "get_time": "global:get-time.sh",
        "weather": "global:weather.py",
        "list_files": "tools.sh",
        "greet": "tools.sh",
        "fail": "tools.sh",
        "sleep_long": "tools.sh",
        "search": "tools.py",
        "classify": "tools.py",
        "env_report": "tools.py",
        "noisy": "tools.py",
        "broken": "tools.py",
        "sleepy": "tools.py",
    }


def test_python_tool_declaration(agent_dir: Path) -> None:
    specs = discover_tools(agent_dir)
    assert specs["search"] == ToolSpec(
        name="search",
        description="Search the notes.\n\nLooks through every note.",
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for, over two lines."},
                "limit": {"type": "integer", "description": "How many results."},
                "exact": {"type": "boolean", "description": "Match whole words only."},
            },
            "required": ["query"],
        },
        source="tools.py",
    )


def test_python_types_literal_optional_and_lists(agent_dir: Path) -> None:
    params = discover_tools(agent_dir)["classify"].parameters
    assert params == {
        "type": "object",
        "properties": {
            "mode": {"type": "string", "enum": ["fast", "slow"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "ratio": {"type": "number"},
            "note": {"type": "string"},
            "extra": {"type": "integer"},
            "ids": {"type": "array", "items": {"type": "integer"}},
        },
        "required": ["mode", "tags", "ratio"],
    }


def test_global_python_tool_is_run_named_after_file(agent_dir: Path, config_dir: Path) -> None:
    specs = discover_tools(agent_dir, global_tools=["weather.py"], config_dir=config_dir)
    assert specs["weather"].description == "Get the weather for a city."
    assert specs["weather"].parameters["properties"] == {
        "city": {"type": "string", "description": "The city name"}
    }
    assert "helper" not in specs


def test_argc_options_flags_required_multiple_choices(agent_dir: Path) -> None:
    spec = discover_tools(agent_dir)["list_files"]
    assert spec.description == "List files in a folder"
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "dir": {"type": "string", "description": "The folder"},
            "kind": {
                "type": "string",
                "description": "What to list (files or folders)",
                "enum": ["file", "dir"],
            },
            "pattern": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Patterns to match",
            },
            "depth": {"type": "integer", "description": "How deep"},
            "all": {"type": "boolean", "description": "Include hidden files"},
        },
        "required": ["dir"],
    }


def test_argc_root_command_is_one_tool_named_after_file(agent_dir: Path, config_dir: Path) -> None:
    spec = discover_tools(agent_dir, global_tools=["get-time.sh"], config_dir=config_dir)[
        "get_time"
    ]
    assert spec.description == "Get the current time"
    assert spec.parameters == {
        "type": "object",
        "properties": {"zone": {"type": "string", "description": "The time zone"}},
    }


def test_duplicate_names_name_both_sources(agent_dir: Path) -> None:
    (agent_dir / "tools.py").write_text(TOOLS_PY + '\n\ndef greet():\n    """Hi."""\n')
    with pytest.raises(ToolError) as info:
        discover_tools(agent_dir)
    assert str(info.value) == (
        "tool 'greet' is defined twice: in tools.sh and in tools.py (rename one of them)"
    )


def test_python_tool_without_docstring_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "tools.py").write_text("def bare(x: int):\n    return x\n")
    with pytest.raises(ToolError) as info:
        discover_tools(tmp_path)
    assert str(info.value) == (
        f"{tmp_path / 'tools.py'}:1: tool function 'bare' has no docstring "
        "(describe the tool in a docstring, or prefix helpers with '_')"
    )


def test_python_syntax_error_points_at_the_line(tmp_path: Path) -> None:
    (tmp_path / "tools.py").write_text('def ok():\n    """Fine."""\n\ndef broken(:\n')
    with pytest.raises(ToolError, match=r"tools\.py:4: cannot parse tool file"):
        discover_tools(tmp_path)


def test_cmd_without_function_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "tools.sh").write_text("# @cmd Orphan\n# @option --x\n")
    with pytest.raises(ToolError) as info:
        discover_tools(tmp_path)
    assert str(info.value) == (
        f"{tmp_path / 'tools.sh'}:1: `# @cmd` is not followed by a function "
        "(define the function right after its tags: `name() { ... }`)"
    )


def test_missing_global_tool(agent_dir: Path, config_dir: Path) -> None:
    with pytest.raises(ToolError) as info:
        discover_tools(agent_dir, global_tools=["nope.sh"], config_dir=config_dir)
    assert str(info.value) == (
        f"global tool 'nope.sh' not found in {config_dir / 'functions' / 'tools'} "
        "(global_tools entries are file names such as get_time.py or search.sh)"
    )


# --------------------------------------------------------------------------- #
# Whitelists
# --------------------------------------------------------------------------- #


def test_whitelist_selects_exactly_the_listed_tools(agent_dir: Path, config_dir: Path) -> None:
    box = toolbox(agent_dir, config_dir, "greet", "weather")
    assert [s.name for s in box.specs] == ["greet", "weather"]
    assert len(toolbox(agent_dir, config_dir)) == 0


def test_unknown_entry_suggests_the_closest_name(agent_dir: Path, config_dir: Path) -> None:
    with pytest.raises(ToolError) as info:
        toolbox(agent_dir, config_dir, "serch")
    assert str(info.value) == "unknown tool 'serch' in the tools whitelist (did you mean 'search'?)"


def test_validate_whitelist_reports_every_problem(agent_dir: Path, config_dir: Path) -> None:
    errors = validate_whitelist(
        agent_dir,
        ["greet", "wether", "zzz", "mcp:files"],
        global_tools=["weather.py"],
        config_dir=config_dir,
    )
    assert errors == [
        "unknown tool 'wether' in the tools whitelist (did you mean 'weather'?)",
        "unknown tool 'zzz' in the tools whitelist (known: broken, classify, env_report, fail, "
        "greet, list_files, noisy, search, sleep_long, sleepy, weather)",
        "unknown MCP server 'files' in tools entry 'mcp:files' (mcp_servers is empty)",
    ]


def test_validate_whitelist_reports_a_broken_tool_file(tmp_path: Path) -> None:
    (tmp_path / "tools.py").write_text("def f(:\n")
    [error] = validate_whitelist(tmp_path, ["f"])
    assert error.startswith(f"{tmp_path / 'tools.py'}:1: cannot parse tool file")


# --------------------------------------------------------------------------- #
# Running tools
# --------------------------------------------------------------------------- #


class _Awaited:
    """A toolbox whose calls are awaited (``call_async``) on a loop of their own,
    with one executor thread: as a run's loop calls it."""

    def __init__(self, box: Any) -> None:
        self.box = box

    def call(self, name: str, arguments: str, **kwargs: Any) -> Any:
        with ThreadPoolExecutor(max_workers=1) as executor:
            return asyncio.run(self.box.call_async(name, arguments, executor=executor, **kwargs))


@pytest.fixture(params=["blocking", "awaited"])
def via(request: pytest.FixtureRequest) -> Callable[[Any], Any]:
    """Each behaviour holds for a call that blocks and for one awaited on a loop."""
    return (lambda box: box) if request.param == "blocking" else _Awaited


def test_python_tool_writes_to_llm_output(
    agent_dir: Path, config_dir: Path, via: Callable[[Any], Any]
) -> None:
    box = via(toolbox(agent_dir, config_dir, "search", "classify"))
    result = box.call("search", json.dumps({"query": "cats", "exact": True}))
    assert (result.output, result.is_error, result.source) == ("cats:5:True", False, "tools.py")
    assert result.duration_ms > 0
    result = box.call("classify", '{"mode": "fast", "tags": ["a"], "ratio": 0.5}')
    assert json.loads(result.output) == {
        "mode": "fast",
        "tags": ["a"],
        "ratio": 0.5,
        "note": None,
    }


def test_python_tool_environment_and_cwd(
    agent_dir: Path,
    config_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    via: Callable[[Any], Any],
) -> None:
    # A tool runs where graphrun was invoked (as Loki runs it), not in the agent dir.
    invoked = tmp_path / "project"
    invoked.mkdir()
    monkeypatch.chdir(invoked)
    result = via(toolbox(agent_dir, config_dir, "env_report")).call("env_report", "{}")
    report = json.loads(result.output)
    output_file = report.pop("LLM_OUTPUT")
    assert output_file.startswith("/") and not Path(output_file).exists()  # removed after
    assert report == {
        "cwd": str(invoked.resolve()),
        "LLM_AGENT_CACHE_DIR": str(config_dir / "cache" / "notes"),
        "LLM_AGENT_DATA_DIR": str(agent_dir.resolve()),
        "LLM_AGENT_RAW_JSON": "{}",
        "LLM_TOOL_RAW_JSON": "{}",
        "LLM_PROMPT_UTILS_FILE": str(config_dir / "functions" / "utils" / "prompt-utils.sh"),
        "LLM_AGENT_FUNC": "env_report",
        "LLM_AGENT_NAME": "notes",
        "LLM_AGENT_ROOT_DIR": str(agent_dir.resolve()),
        "LLM_ROOT_DIR": str(config_dir),
        "LLM_TOOL_CACHE_DIR": str(config_dir / "cache" / "env_report"),
        "LLM_TOOL_NAME": "env_report",
    }


def test_stdout_is_the_fallback_when_llm_output_is_empty(
    agent_dir: Path, config_dir: Path, via: Callable[[Any], Any]
) -> None:
    box = via(toolbox(agent_dir, config_dir, "noisy", "greet"))
    assert box.call("noisy", "").output == "from stdout\n"
    assert box.call("greet", "{}").output == "hello world\n"  # the @option default
    assert box.call("greet", '{"name": "Ada"}').output == "hello Ada\n"


def test_python_tool_exception_is_an_error_result(
    agent_dir: Path, config_dir: Path, via: Callable[[Any], Any]
) -> None:
    result = via(toolbox(agent_dir, config_dir, "broken")).call("broken", '{"reason": "no disk"}')
    assert result.is_error
    assert result.output.startswith("tool 'broken' exited with code 1: Traceback")
    assert result.output.endswith("RuntimeError: no disk")


def test_bash_tool_gets_argc_variables_and_flags(
    agent_dir: Path, config_dir: Path, via: Callable[[Any], Any]
) -> None:
    box = via(toolbox(agent_dir, config_dir, "list_files"))
    args = {"dir": "/tmp/x y", "kind": "dir", "pattern": ["*.md", "it's"], "all": True}
    result = box.call("list_files", json.dumps({**args, "depth": 2}))
    assert result.is_error is False
    assert result.output == (
        "dir=/tmp/x y kind=dir all=1 depth=2\n"
        "patterns=*.md it's\n"
        "cli=list-files --dir /tmp/x y --kind dir --pattern *.md --pattern it's --depth 2 --all\n"
    )


def test_bash_global_tool_main(
    agent_dir: Path, config_dir: Path, via: Callable[[Any], Any]
) -> None:
    box = via(toolbox(agent_dir, config_dir, "get_time"))
    assert box.call("get_time", '{"zone": "CET"}').output == "time in CET\n"


def test_bash_argument_errors_go_back_to_the_model(
    agent_dir: Path, config_dir: Path, via: Callable[[Any], Any]
) -> None:
    box = via(toolbox(agent_dir, config_dir, "list_files"))
    cases = {
        "{}": "tool 'list_files': missing required argument 'dir'",
        '{"dir": "a", "kind": "pipe"}': (
            "tool 'list_files': argument 'kind' must be one of file, dir, got pipe"
        ),
        '{"dir": "a", "colour": 1}': (
            "tool 'list_files': unknown argument(s) colour (known: dir, kind, pattern, depth, all)"
        ),
        "[1]": "tool 'list_files': the arguments must be a JSON object, got: [1]",
    }
    for arguments, message in cases.items():
        result = box.call("list_files", arguments)
        assert (result.output, result.is_error) == (message, True)


def test_nonzero_exit_returns_stderr(
    agent_dir: Path, config_dir: Path, via: Callable[[Any], Any]
) -> None:
    result = via(toolbox(agent_dir, config_dir, "fail")).call("fail", "{}")
    assert (result.output, result.is_error) == (
        "tool 'fail' exited with code 3: something broke",
        True,
    )


def test_unknown_tool_call_is_an_error_result(
    agent_dir: Path, config_dir: Path, via: Callable[[Any], Any]
) -> None:
    result = via(toolbox(agent_dir, config_dir, "greet")).call("rm_rf", "{}")
    assert (result.output, result.is_error) == ("unknown tool 'rm_rf' (available: greet)", True)


def test_timeout_kills_the_process_group(
    agent_dir: Path, config_dir: Path, via: Callable[[Any], Any]
) -> None:
    box = via(toolbox(agent_dir, config_dir, "sleep_long", timeout=0.5))
    started = time.monotonic()
    result = box.call("sleep_long", "{}")
    assert time.monotonic() - started < 5
    assert (result.output, result.is_error) == (
        "tool 'sleep_long' timed out after 0.5 s and was killed",
        True,
    )


def test_cancel_kills_a_running_tool(
    agent_dir: Path, config_dir: Path, via: Callable[[Any], Any]
) -> None:
    box = via(toolbox(agent_dir, config_dir, "sleepy"))
    cancel = CancelToken()
    timer = threading.Timer(0.3, cancel.cancel, args=("run timed out",))
    timer.start()
    started = time.monotonic()
    try:
        result = box.call("sleepy", '{"seconds": 30}', cancel=cancel)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 5
    assert (result.output, result.is_error) == (
        "tool 'sleepy' was cancelled (run timed out)",
        True,
    )


def test_already_cancelled_token_runs_nothing(
    agent_dir: Path, config_dir: Path, via: Callable[[Any], Any]
) -> None:
    marker = agent_dir / "ran"
    (agent_dir / "tools.py").write_text(
        f'def touch():\n    """Touch."""\n    open({str(marker)!r}, "w").close()\n'
    )
    (agent_dir / "tools.sh").unlink()
    cancel = CancelToken()
    cancel.cancel("stop")
    result = via(load_toolbox(agent_dir, ["touch"])).call("touch", "{}", cancel=cancel)
    assert (result.output, result.is_error) == ("tool 'touch' was cancelled (stop)", True)
    assert not marker.exists()


def test_stdin_is_closed(tmp_path: Path, via: Callable[[Any], Any]) -> None:
    (tmp_path / "tools.py").write_text(
        'def read_stdin():\n    """Read stdin."""\n'
        "    import sys\n    return repr(sys.stdin.read())\n"
    )
    assert via(load_toolbox(tmp_path, ["read_stdin"])).call("read_stdin", "{}").output == "''"


def test_tool_runs_with_the_callers_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, via: Callable[[Any], Any]
) -> None:
    (tmp_path / "tools.sh").write_text(
        '# @describe Echo a variable\nmain() { echo "$GRAPHRUN_TOOLS_TEST"; }\n'
        'eval "$(argc --argc-eval "$0" "$@")"\n'
    )
    monkeypatch.setenv("GRAPHRUN_TOOLS_TEST", "inherited")
    # Without @cmd functions, tools.sh is one tool named after the file.
    assert via(load_toolbox(tmp_path, ["tools"])).call("tools", "{}").output == "inherited\n"


def test_a_global_tool_gets_the_agents_folder_as_root_and_its_dotenv(
    agent_dir: Path, config_dir: Path, monkeypatch: pytest.MonkeyPatch, via: Callable[[Any], Any]
) -> None:
    # As Loki's run-tool runs a global tool for an agent: root = the agent's folder.
    monkeypatch.delenv("SERVICE_TOKEN", raising=False)
    (config_dir / "functions" / "tools" / "gsecret.py").write_text(
        "import os\n\n\ndef run() -> str:\n"
        '    """Report the token and the root."""\n'
        "    token = os.environ.get('SERVICE_TOKEN', '<unset>')\n"
        "    return f\"{token} {os.environ['LLM_ROOT_DIR']}\"\n"
    )
    (agent_dir / ".env").write_text("SERVICE_TOKEN=from-the-agent\n")
    (config_dir / ".env").write_text("SERVICE_TOKEN=from-the-config\n")
    box = via(
        load_toolbox(agent_dir, ["gsecret"], global_tools=["gsecret.py"], config_dir=config_dir)
    )
    result = box.call("gsecret", "{}")
    assert result.output == f"from-the-agent {agent_dir.resolve()}"


def test_awaited_tool_processes_hold_no_thread(agent_dir: Path, config_dir: Path) -> None:
    # Six tools that each sleep 0.4 s, awaited at once with one executor thread:
    # their processes are watched from the loop, so they overlap.
    box = toolbox(agent_dir, config_dir, "sleepy")

    async def main() -> list[Any]:
        with ThreadPoolExecutor(max_workers=1) as executor:
            calls = [
                box.call_async("sleepy", '{"seconds": 0.4}', executor=executor) for _ in range(6)
            ]
            return list(await asyncio.gather(*calls))

    started = time.monotonic()
    results = asyncio.run(main())
    assert time.monotonic() - started < 6 * 0.4
    assert all(not r.is_error for r in results), results
