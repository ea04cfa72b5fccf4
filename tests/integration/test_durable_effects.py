"""Every effect is durable as it happens: a crash inside a node never repeats what the
node already did; Ctrl-C and SIGTERM interrupt a run that `resume` then continues."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from tests.support.fake_llm import text, tool_calls
from tests.support.sleepy import NAP_SH, SLEEPY

TOOLS_SH = """\
#!/usr/bin/env bash
set -e
# @env LLM_OUTPUT=/dev/stdout The output path

# @cmd Record a mark
# @option --name! <NAME>   The mark
mark() {
    echo "$argc_name" >> "$MARKS"
    if [ "$argc_name" = "slow" ]; then sleep "${SLOW:-0}"; fi
    echo "marked $argc_name" >> "$LLM_OUTPUT"
}

eval "$(argc --argc-eval "$0" "$@")"
"""

GRAPH = """
name: marker
version: "1.0"
model: openai:gpt-test
start: work
nodes:
  work:
    type: llm
    prompt: "{{initial_prompt}}"
    tools: [mark]
    state_updates:
      reply: "{{output}}"
    next: done
  done:
    type: end
    output: "{{reply}}"
"""


def marked(event: dict) -> str:  # type: ignore[type-arg]
    return str(json.loads(event["arguments"])["name"])


def wait_for(predicate, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_kill_9_inside_a_tool_loop_never_repeats_a_recorded_tool_call(
    graphrun, agent, fake_llm, tmp_path: Path
) -> None:
    root = agent(GRAPH, {"tools.sh": TOOLS_SH})
    marks = tmp_path / "marks"
    fake_llm.script(
        tool_calls(("mark", {"name": "first"})),
        tool_calls(("mark", {"name": "slow"})),
        text("all marked"),
    )
    env = {
        "OPENAI_BASE_URL": fake_llm.url_openai,
        "OPENAI_API_KEY": "sk-x",
        "MARKS": str(marks),
        "SLOW": "60",
    }
    proc = graphrun.popen("run", str(root), "mark things", **env)
    # The second tool runs (its mark is written) after the first's result was recorded.
    wait_for(lambda: marks.exists() and "slow" in marks.read_text().split())
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    run_id = graphrun.last_run()
    events = graphrun("events", run_id, "--json").json_lines()
    assert [marked(e) for e in events if e["type"] == "ToolCalled"] == ["first"]

    # On resume the recorded turns are served from the log: the model is asked only
    # for what was in flight (the second turn's result and the final answer).
    fake_llm.reset()
    fake_llm.script(text("all marked"))
    env["SLOW"] = "0"
    resumed = graphrun("resume", run_id, **env)
    assert resumed.code == 0, resumed.stderr
    assert resumed.stdout.strip() == "all marked"
    assert marks.read_text().split() == ["first", "slow", "slow"]
    assert len(fake_llm.requests) == 1
    last = fake_llm.requests[0].body["messages"]
    assert [m["role"] for m in last][-4:] == ["assistant", "tool", "assistant", "tool"]
    events = graphrun("events", run_id, "--json").json_lines()
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert [marked(e) for e in events if e["type"] == "ToolCalled"] == ["first", "slow"]
    assert graphrun("audit", run_id, "--verify").code == 0


def _gone(pids: list[int]) -> bool:
    import os

    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        # A zombie is gone for our purposes.
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        return False
    return True


def test_ctrl_c_and_sigterm_interrupt_and_resume_completes(graphrun, agent, tmp_path: Path) -> None:
    root = agent(SLEEPY, {"scripts/nap.sh": NAP_SH})
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        pids = tmp_path / f"pids-{code}"
        proc = graphrun.popen("run", str(root), PIDS=str(pids), NAP="60")
        wait_for(lambda p=pids: p.exists() and len(p.read_text().split()) == 2)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == code, err
        assert "graphrun resume" in err
        # The script's whole process group is gone.
        group = [int(p) for p in pids.read_text().split()]
        wait_for(lambda g=group: _gone(g), timeout=10)
        run_id = graphrun.last_run()
        events = graphrun("events", run_id, "--json").json_lines()
        assert events[-1]["type"] == "RunInterrupted"
        assert not [e for e in events if e["type"] == "ScriptFinished"]
        resumed = graphrun("resume", run_id, PIDS=str(pids), NAP="0")
        assert resumed.code == 0, resumed.stderr
        assert resumed.stdout.strip() == "yes"


def test_a_closed_stdout_pipe_never_kills_the_run(graphrun, agent, tmp_path: Path) -> None:
    root = agent(
        """
        name: chatty
        version: "1.0"
        start: s
        nodes:
          s: {type: script, script: scripts/s.py, next: done}
          done: {type: end, output: "{{text}}"}
        """,
        {"scripts/s.py": "import json\nprint(json.dumps({'text': 'line\\n' * 20000}))\n"},
    )
    shell = f"{graphrun.cmd_line('run', str(root))} 2>&1 | head -1"
    done = subprocess.run(
        ["bash", "-c", shell], env=graphrun.env(), capture_output=True, text=True, timeout=60
    )
    assert done.stdout.startswith("▸ graph: chatty")
    rows = graphrun("runs", "--json").json_lines()
    assert [r["status"] for r in rows] == ["completed"]
    assert json.dumps(rows)


def test_later_commands_continue_with_the_configuration_the_run_began_with(
    graphrun, fake_llm, tmp_path: Path
) -> None:
    """resume / approve / answer need no --loki-dir: the run recorded it."""
    from tests.conftest import write_agent

    loki = tmp_path / "loki"
    loki.mkdir()
    (loki / "config.yaml").write_text(
        "clients:\n"
        "  - type: openai-compatible\n"
        "    name: local\n"
        f"    api_base: {fake_llm.url_openai}\n"
        "    models:\n"
        "      - name: small\n"
    )
    write_agent(
        loki / "agents" / "gate",
        """\
        name: gate
        version: "1.0"
        model: local:small
        start: draft
        nodes:
          draft:
            type: llm
            prompt: "draft {{initial_prompt}}"
            state_updates: {draft: "{{output}}"}
            next: ok
          ok:
            type: approval
            question: "Ship {{draft}}?"
            options: [ship, hold]
            routes: {ship: final, hold: done}
            on_other: done
          final:
            type: llm
            prompt: "polish {{draft}}"
            state_updates: {draft: "{{output}}"}
            next: done
          done:
            type: end
            output: "{{draft}}"
        """,
    )
    fake_llm.script(text("v1"), text("v2"))
    started = graphrun("run", "gate", "notes", "--loki-dir", str(loki))
    assert started.code == 3, started.stderr
    assert "--loki-dir" not in started.stderr  # the answer hint is complete without it
    run_id = graphrun.last_run()
    approved = graphrun("approve", run_id, "ship", "--as", "alice")
    assert approved.code == 0, approved.stderr
    assert approved.stdout.strip() == "v2"
    assert [r.path for r in fake_llm.requests] == ["/v1/chat/completions"] * 2
