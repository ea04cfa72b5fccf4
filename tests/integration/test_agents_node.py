"""``agent`` nodes: child runs with their own logs, outputs, timeouts and cancellation."""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time
from pathlib import Path

from tests.conftest import GraphrunCli, write_agent
from tests.support.fake_llm import FakeLlm, text

SLEEPER = """\
    name: sleeper
    version: "1.0"
    start: nap
    nodes:
      nap:
        type: script
        script: scripts/nap.sh
        timeout: 60
        next: done
      done:
        type: end
        output: rested
"""
# The script records its pid and its own child's pid, then waits for the child.
NAP_SH = """\
    #!/usr/bin/env bash
    echo $$ > "$PID_FILE"
    sleep 30 &
    echo $! >> "$PID_FILE"
    wait
    echo '{}'
"""


def llm_env(fake: FakeLlm) -> dict[str, str]:
    return {"OPENAI_BASE_URL": fake.url_openai, "OPENAI_API_KEY": "sk-test"}


def loop_agent(root: Path, config: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text(textwrap.dedent(config).lstrip(), encoding="utf-8")
    return root


def events(graphrun: GraphrunCli, run_id: str) -> list[dict]:  # type: ignore[type-arg]
    return graphrun("events", run_id, "--json").json_lines()  # type: ignore[return-value]


def runs(graphrun: GraphrunCli) -> list[dict]:  # type: ignore[type-arg]
    return graphrun("runs", "--json").json_lines()  # type: ignore[return-value]


def pair(graphrun: GraphrunCli) -> tuple[dict, dict]:  # type: ignore[type-arg]
    """The top-level run and its one child run."""
    rows = runs(graphrun)
    top = [r for r in rows if r["parent_run_id"] is None]
    children = [r for r in rows if r["parent_run_id"] is not None]
    assert len(top) == 1 and len(children) == 1, rows
    return top[0], children[0]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie awaiting its reaper counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def wait_gone(pids: list[int], seconds: float = 3.0) -> list[int]:
    deadline = time.monotonic() + seconds
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    return left


def test_child_run_is_linked_and_its_answer_is_the_output(
    graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    agents = tmp_path / "agents"
    loop_agent(agents / "capitals", "model: openai:gpt-test\ninstructions: Name capitals.\n")
    parent = write_agent(
        tmp_path / "parent",
        """\
        name: parent
        version: "1.0"
        start: ask
        nodes:
          ask:
            type: agent
            agent: capitals
            prompt: "Capital of {{initial_prompt}}?"
            state_updates:
              capital: "{{output}}"
            next: done
          done:
            type: end
            output: "Answer: {{capital}}"
        """,
    )
    fake_llm.script(text("Paris"))

    res = graphrun("run", str(parent), "France", "--agents-dir", str(agents), **llm_env(fake_llm))

    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "Answer: Paris"
    assert fake_llm.requests[0].body["messages"][-1]["content"] == "Capital of France?"
    top, child = pair(graphrun)
    assert child["parent_run_id"] == top["run_id"] and top["parent_run_id"] is None
    parent_events = events(graphrun, top["run_id"])
    started = next(e for e in parent_events if e["type"] == "ChildRunStarted")
    finished = next(e for e in parent_events if e["type"] == "ChildRunFinished")
    assert started["child_run_id"] == finished["child_run_id"] == child["run_id"]
    assert (started["agent"], started["prompt"]) == ("capitals", "Capital of France?")
    assert (finished["status"], finished["output"]) == ("completed", "Paris")
    child_events = events(graphrun, child["run_id"])
    assert child_events[0]["parent_run_id"] == top["run_id"]
    assert child_events[0]["initial_prompt"] == "Capital of France?"
    # ChildRunStarted is durable before the child's first event.
    assert started["ts"] <= child_events[0]["ts"]
    # The narration shows the child's steps indented under the parent's.
    assert "▸ ask (agent)\n  ▸ graph: capitals (start: agent)" in res.stderr


STRUCTURED_PARENT = """\
    name: facts
    version: "1.0"
    model: openai:gpt-test
    start: research
    nodes:
      research:
        type: agent
        agent: researcher
        prompt: "Tell me about {{initial_prompt}}"
        output_schema:
          type: object
          properties:
            city: {type: string}
            population: {type: integer}
          required: [city, population]
        state_updates:
          city: "{{output.city}}"
          population: "{{output.population}}"
        next: done
      done:
        type: end
        output: "{{city}} has {{population}} people"
"""


def test_output_schema_is_extracted_afterwards_without_a_hint(
    graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    agents = tmp_path / "agents"
    loop_agent(agents / "researcher", "model: openai:gpt-test\ninstructions: Research.\n")
    parent = write_agent(tmp_path / "facts", STRUCTURED_PARENT)
    fake_llm.script(
        text("Paris is the capital of France; about 2100000 people live there."),
        text('{"city": "Paris", "population": 2100000}'),
    )

    res = graphrun("run", str(parent), "Paris", "--agents-dir", str(agents), **llm_env(fake_llm))

    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "Paris has 2100000 people"
    child_request = fake_llm.requests[0].body
    assert "schema" not in str(child_request).lower()  # agents get no schema hint
    assert child_request["messages"][0]["content"].startswith("Research.\n\n## ")
    assert len(fake_llm.requests) == 2  # the extractor ran over the child's final text
    assert "about 2100000 people" in str(fake_llm.requests[1].body["messages"])


def test_output_schema_extraction_failure_fails_the_graph(
    graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    agents = tmp_path / "agents"
    loop_agent(agents / "researcher", "model: openai:gpt-test\ninstructions: Research.\n")
    parent = write_agent(tmp_path / "facts", STRUCTURED_PARENT)
    fake_llm.default = lambda request: text("I could not find anything useful.")

    res = graphrun("run", str(parent), "Atlantis", "--agents-dir", str(agents), **llm_env(fake_llm))

    assert res.code == 1
    top, _child = pair(graphrun)
    assert top["status"] == "failed"
    failed = [e for e in events(graphrun, top["run_id"]) if e["type"] == "NodeFailed"]
    assert failed and failed[0]["node_id"] == "research"
    assert "Traceback" not in res.stderr


def test_agent_node_without_next_fails_at_run_time(
    graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    agents = tmp_path / "agents"
    loop_agent(agents / "echo", "model: openai:gpt-test\ninstructions: Echo.\n")
    parent = write_agent(
        tmp_path / "nonext",
        """\
        name: nonext
        version: "1.0"
        start: ask
        nodes:
          ask:
            type: agent
            agent: echo
            prompt: hi
          done:
            type: end
        """,
    )
    fake_llm.script(text("hello"))

    res = graphrun("run", str(parent), "--agents-dir", str(agents), **llm_env(fake_llm))

    assert res.code == 1
    assert "agent node 'ask' has no next; the run fails when it gets there" in res.stderr
    assert pair(graphrun)[0]["status"] == "failed"


def test_node_timeout_fails_the_graph_and_cancels_the_child(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    agents = tmp_path / "agents"
    write_agent(agents / "sleeper", SLEEPER, {"scripts/nap.sh": NAP_SH})
    parent = write_agent(
        tmp_path / "boss",
        """\
        name: boss
        version: "1.0"
        start: delegate
        nodes:
          delegate:
            type: agent
            agent: sleeper
            prompt: nap
            timeout: 1
            next: done
          done:
            type: end
            output: never
        """,
    )
    pid_file = tmp_path / "pids"

    began = time.monotonic()
    res = graphrun("run", str(parent), "--agents-dir", str(agents), PID_FILE=str(pid_file))
    took = time.monotonic() - began

    assert res.code == 1, res.stderr
    assert took < 8  # about the timeout plus process start-up, never the script's 30 s
    top, child = pair(graphrun)
    assert (top["status"], child["status"]) == ("failed", "cancelled")
    assert res.stderr.strip().endswith(
        f"error: run {top['run_id']} failed: node 'delegate': child agent 'sleeper' run "
        f"{child['run_id']} timed out after 1s (the node's timeout)"
    )
    child_events = events(graphrun, child["run_id"])
    assert child_events[-1]["type"] == "RunCancelled"
    assert child_events[-1]["reason"] == "agent node 'delegate' timed out after 1s"
    pids = [int(line) for line in pid_file.read_text().split()]
    assert len(pids) == 2
    assert wait_gone(pids) == []


def test_ctrl_c_interrupts_parent_and_child_and_both_stay_resumable(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    agents = tmp_path / "agents"
    write_agent(agents / "sleeper", SLEEPER, {"scripts/nap.sh": NAP_SH})
    parent = write_agent(
        tmp_path / "boss",
        """\
        name: boss
        version: "1.0"
        start: delegate
        nodes:
          delegate:
            type: agent
            agent: sleeper
            prompt: nap
            next: done
          done:
            type: end
        """,
    )
    pid_file = tmp_path / "pids"
    proc = graphrun.popen("run", str(parent), "--agents-dir", str(agents), PID_FILE=str(pid_file))
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and len(pid_file.read_text().split()) == 2):
        assert time.monotonic() < deadline, "the child's script never started"
        time.sleep(0.05)

    proc.send_signal(signal.SIGINT)  # Ctrl-C
    try:
        _out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise

    # Ctrl-C interrupts (it does not cancel): exit 130, both runs resumable.
    assert proc.returncode == 130, err
    top, child = pair(graphrun)
    assert (top["status"], child["status"]) == ("interrupted", "interrupted")
    parent_events = events(graphrun, top["run_id"])
    assert parent_events[-1]["type"] == "RunInterrupted"
    assert not [e for e in parent_events if e["type"] == "ChildRunFinished"]
    assert events(graphrun, child["run_id"])[-1]["type"] == "RunInterrupted"
    assert wait_gone([int(p) for p in pid_file.read_text().split()]) == []
    # Replay of the interrupted tree needs nothing but the log.
    replayed = graphrun("replay", top["run_id"])
    assert replayed.code == 0, replayed.stdout + replayed.stderr


def test_graphrun_cancel_of_a_waiting_parent_cancels_the_waiting_child(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    agents = tmp_path / "agents"
    write_agent(
        agents / "asker",
        """\
        name: asker
        version: "1.0"
        start: ask
        nodes:
          ask:
            type: input
            question: "Your name?"
            state_updates:
              name: "{{input}}"
            next: done
          done:
            type: end
            output: "{{name}}"
        """,
    )
    parent = write_agent(
        tmp_path / "boss",
        """\
        name: boss
        version: "1.0"
        start: delegate
        nodes:
          delegate:
            type: agent
            agent: asker
            prompt: go
            next: done
          done:
            type: end
        """,
    )
    waiting = graphrun("run", str(parent), "--agents-dir", str(agents))
    assert waiting.code == 3, waiting.stderr
    top, child = pair(graphrun)

    res = graphrun("cancel", top["run_id"], "--as", "ops")

    assert res.code == 0, res.stderr
    statuses = {r["run_id"]: r["status"] for r in runs(graphrun)}
    assert statuses == {top["run_id"]: "cancelled", child["run_id"]: "cancelled"}
    assert any(
        e["type"] == "ChildCancelled" and e["child_run_id"] == child["run_id"]
        for e in events(graphrun, top["run_id"])
    )
    assert events(graphrun, child["run_id"])[-1]["type"] == "RunCancelled"
