"""Script nodes for real: subprocesses, GRAPH_STATE / GRAPH_STATE_FILE, tolerant failure.

Runs are driven in-process (the library the CLI calls) against a real SQLite file;
each script is a real ``bash`` / ``python3`` / ``npx tsx`` process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from graphrun.eventstore.events import NodeCompleted, ScriptFinished
from graphrun.eventstore.fold import fold
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine.decider import state_json
from graphrun.runtime.engine.driver import Driver, RunOptions, RunOutcome, drive, start_run
from graphrun.runtime.graph.loader import load_graph


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "events.db")
    yield s
    s.close()


def run(store: SqliteStore, agent_dir: Path, prompt: str = "", **overrides: Any) -> RunOutcome:
    loaded = load_graph(agent_dir)
    run_id = start_run(store, loaded, prompt=prompt, overrides=overrides)
    return drive(Driver(store, run_id, RunOptions()))


def scripts_of(store: SqliteStore, run_id: str) -> list[ScriptFinished]:
    return [e for e in store.read(run_id) if isinstance(e, ScriptFinished)]


ONE_SCRIPT = """
    name: one
    version: "1.0"
    start: s
    nodes:
      s:
        type: script
        script: {script}
        fallback: failed
        next: done
        state_updates:
          seen: "{{{{missing_in_state}}}}{{{{initial_prompt}}}}"
      failed:
        type: end
        output: "failed: {{{{_error.message}}}}"
      done:
        type: end
        output: "{{{{result}}}}"
"""


def test_next_loop_runs_to_its_end_node(store: SqliteStore, agent: Any) -> None:
    root = agent(
        """
        name: loop
        version: "1.0"
        start: step
        initial_state: {n: 0}
        nodes:
          step:
            type: script
            script: scripts/step.py
          done:
            type: end
            output: "counted to {{n}}"
        """,
        {
            "scripts/step.py": """
                import json, os
                n = json.loads(os.environ["GRAPH_STATE"])["n"] + 1
                print(json.dumps({"n": n, "_next": "done" if n == 6 else "step"}))
            """
        },
    )
    outcome = run(store, root)
    assert (outcome.status, outcome.output) == ("completed", "counted to 6")
    finished = scripts_of(store, outcome.run_id)
    assert [e.visit for e in finished] == [1, 2, 3, 4, 5, 6]
    assert finished[0].script_hash.startswith("sha256:")
    assert finished[0].input_hash.startswith("sha256:")
    assert fold(store.read(outcome.run_id)).state["n"] == 6


@pytest.mark.parametrize("size", ["inline", "at-limit", "file"])
def test_state_inline_up_to_32_kib_else_a_file(store: SqliteStore, agent: Any, size: str) -> None:
    root = agent(
        ONE_SCRIPT.format(script="scripts/env.py"),
        {
            "scripts/env.py": """
                import json, os
                inline = os.environ.get("GRAPH_STATE")
                path = os.environ.get("GRAPH_STATE_FILE")
                state = json.loads(inline) if inline is not None else json.load(open(path))
                print(json.dumps({"result": json.dumps({
                    "inline": inline is not None, "file": path, "keys": sorted(state),
                    "bytes": len((inline or open(path).read()).encode())})}))
            """
        },
    )
    base = {"initial_prompt": "", "pad": ""}
    overhead = len(state_json(base).encode())
    pad = {"inline": 10, "at-limit": 32 * 1024 - overhead, "file": 32 * 1024 - overhead + 1}[size]
    outcome = run(store, root, pad="é" * (pad // 2) + "x" * (pad % 2))
    assert outcome.status == "completed", outcome.error
    seen = json.loads(outcome.output or "")
    assert seen["keys"] == ["initial_prompt", "pad"]
    if size == "file":
        assert not seen["inline"] and seen["file"]
        assert seen["bytes"] == 32 * 1024 + 1
        # The temp file is gone once the run is over.
        assert not Path(seen["file"]).exists()
    else:
        assert seen["inline"] and seen["file"] is None
        assert seen["bytes"] <= 32 * 1024
    if size == "at-limit":
        assert seen["bytes"] == 32 * 1024


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            "import sys; sys.stderr.write('bad thing\\n'); sys.exit(3)",
            "script exited with code 3: bad thing",
        ),
        ("print('not json')", "script output is not valid JSON (Expecting value at line 1)"),
        ("print('[1, 2]')", "script output must be a JSON object, got list"),
        ("print('\"text\"')", "script output must be a JSON object, got str"),
        ("print('')", "script output is not valid JSON (Expecting value at line 2)"),
    ],
)
def test_tolerant_fail_routes_to_fallback(
    store: SqliteStore, agent: Any, body: str, error: str
) -> None:
    root = agent(ONE_SCRIPT.format(script="scripts/s.py"), {"scripts/s.py": body + "\n"})
    outcome = run(store, root)
    assert (outcome.status, outcome.output) == ("completed", f"failed: {error}")
    (finished,) = scripts_of(store, outcome.run_id)
    assert finished.error == error and finished.output is None
    (completed,) = [
        e for e in store.read(outcome.run_id) if isinstance(e, NodeCompleted) and e.node_id == "s"
    ]
    assert completed.failed and completed.routed_to == "failed"


def test_failure_without_fallback_or_next_fails_the_run(store: SqliteStore, agent: Any) -> None:
    root = agent(
        """
        name: f
        version: "1.0"
        start: s
        nodes:
          s: {type: script, script: scripts/s.sh}
          done: {type: end}
        """,
        {"scripts/s.sh": "echo oops >&2; exit 4\n"},
    )
    outcome = run(store, root)
    assert outcome.status == "failed"
    assert outcome.error == "node 's': script exited with code 4: oops"


def test_sh_runs_with_bash_in_the_agent_dir(store: SqliteStore, agent: Any) -> None:
    # No shebang, no exec bit, bash-only syntax: the extension decides the runtime.
    root = agent(
        ONE_SCRIPT.format(script="scripts/s.sh"),
        {
            "scripts/s.sh": """
            if [[ -n "$BASH_VERSION" ]]; then shell=bash; fi
            printf '{"result": "%s %s"}' "$shell" "$(basename "$PWD")"
        """
        },
        name="agentdir",
    )
    outcome = run(store, root, "p")
    assert (outcome.status, outcome.output) == ("completed", "bash agentdir")
    assert fold(store.read(outcome.run_id)).state["seen"] == "p"  # lenient: missing -> ""


def test_py_runs_with_python3(store: SqliteStore, agent: Any) -> None:
    root = agent(
        ONE_SCRIPT.format(script="scripts/s.py"),
        {
            "scripts/s.py": """
            #!/bin/false  (the shebang is not used)
            import json, sys
            print(json.dumps({"result": f"python{sys.version_info.major}"}))
        """.replace("#!/bin/false  (the shebang is not used)", "#!/bin/false")
        },
    )
    outcome = run(store, root)
    assert (outcome.status, outcome.output) == ("completed", "python3")


def _tsx_available() -> bool:
    if shutil.which("npx") is None:
        return False
    try:
        proc = subprocess.run(
            ["npx", "--no-install", "tsx", "--version"], capture_output=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


@pytest.mark.skipif(
    not _tsx_available(), reason="`npx --no-install tsx --version` fails: tsx is not installed"
)
def test_ts_runs_with_npx_tsx(store: SqliteStore, agent: Any) -> None:
    root = agent(
        ONE_SCRIPT.format(script="scripts/s.ts"),
        {
            "scripts/s.ts": """
            const state: Record<string, unknown> = JSON.parse(process.env.GRAPH_STATE ?? "{}");
            console.log(JSON.stringify({ result: `ts ${typeof state}` }));
        """
        },
    )
    outcome = run(store, root)
    assert (outcome.status, outcome.output) == ("completed", "ts object")


def test_scoped_lenient_and_strict_fields(store: SqliteStore, agent: Any) -> None:
    root = agent(
        """
        name: strict
        version: "1.0"
        start: s
        nodes:
          s:
            type: script
            script: scripts/s.py
            next: done
            state_updates:
              copy: "{{value}}"
              nothing: "{{output}}"
              mixed: "v={{value}} m={{absent.deep[0]}}"
          done:
            type: end
            output: "{{copy}} {{no_such_key}}"
        """,
        {"scripts/s.py": "print('{\"value\": [1, 2]}')\n"},
    )
    outcome = run(store, root)
    assert outcome.status == "failed"
    assert outcome.error == (
        "node 'done': {{no_such_key}} in done.output: 'no_such_key' is not in state "
        "(state has: copy, initial_prompt, mixed, nothing, value)"
    )
    state = fold(store.read(outcome.run_id)).state
    # A whole-expression update keeps the JSON type; missing keys render empty; script
    # nodes have no scoped {{output}}.
    assert state["copy"] == [1, 2]
    assert state["nothing"] == ""
    assert state["mixed"] == "v=[1,2] m="


def test_output_timeout_and_leftovers(tmp_path: Path) -> None:
    """The runner reads the output, times out, and cleans up the group: a background
    job a script leaves holding its pipes is killed when the script exits."""
    import asyncio
    import time

    from graphrun.actors.base import ListContext
    from graphrun.actors.messages import ScriptTask
    from graphrun.actors.script import run_script_async

    marker = tmp_path / "left-behind"
    (tmp_path / "ok.sh").write_text(
        f'(sleep 2; touch "{marker}") &\necho \'{{"ok": true}}\'\n', encoding="utf-8"
    )
    (tmp_path / "slow.sh").write_text("echo started >&2\nsleep 10\n", encoding="utf-8")
    ctx = ListContext(agent_dir=tmp_path)

    asyncio.run(run_script_async(ScriptTask("ok", 1, "ok.sh", 30.0, "{}"), ctx))
    started = time.monotonic()
    asyncio.run(run_script_async(ScriptTask("slow", 1, "slow.sh", 0.5, "{}"), ctx))
    elapsed = time.monotonic() - started

    ok, slow = ctx.events
    assert ok.output == {"ok": True} and ok.error is None
    assert ok.duration_ms < 1500  # not held by the background job's two seconds
    assert slow.timed_out and slow.error == "script timed out after 0.5s"
    assert "started" in slow.stderr
    assert elapsed < 3
    time.sleep(2.5)
    assert not marker.exists()  # the background job in ok.sh's group was killed


def test_a_script_that_cannot_run_is_a_recorded_failure(tmp_path: Path) -> None:
    """Without validation before the run, the runner itself words why a script
    cannot run: outside the agent folder, an unknown extension, unreadable."""
    import asyncio

    from graphrun.actors.base import ListContext
    from graphrun.actors.messages import ScriptTask
    from graphrun.actors.script import run_script_async

    agent = tmp_path / "agent"
    agent.mkdir()
    (tmp_path / "outside.sh").write_text("echo '{}'\n", encoding="utf-8")
    (agent / "notes.txt").write_text("hello\n", encoding="utf-8")
    (agent / "folder.sh").mkdir()
    ctx = ListContext(agent_dir=agent)
    for script in ("../outside.sh", "notes.txt", "folder.sh"):
        asyncio.run(run_script_async(ScriptTask("s", 1, script, 30.0, "{}"), ctx))
    assert [e.error for e in ctx.events] == [
        f"script '../outside.sh' is outside the agent folder ({tmp_path.resolve()}/outside.sh)",
        "unsupported script extension '.txt' (use .sh, .py or .ts)",
        "cannot read script folder.sh: Is a directory",
    ]
    assert all(e.exit_code is None and e.output is None for e in ctx.events)
