"""Three levels of agents: graph -> graph (with a human approval) -> LLM-loop agent.

``runs``, ``show``, ``audit`` and ``replay`` work across the whole tree, and replay
needs neither the LLM server nor the agents' files.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from tests.conftest import GraphrunCli, write_agent
from tests.support.fake_llm import FakeLlm, text, tool_calls

DESK = """\
    name: desk
    version: "1.0"
    start: commission
    nodes:
      commission:
        type: agent
        agent: editor
        prompt: "Write a note about {{initial_prompt}}"
        state_updates:
          note: "{{output}}"
        next: done
      done:
        type: end
        output: "Desk: {{note}}"
"""
EDITOR = """\
    name: editor
    version: "1.0"
    start: research
    nodes:
      research:
        type: agent
        agent: researcher
        prompt: "{{initial_prompt}}"
        state_updates:
          draft: "{{output}}"
        next: sign_off
      sign_off:
        type: approval
        question: "Publish this draft? {{draft}}"
        options: [publish, revise]
        on_other: revise
        routes:
          publish: published
          revise: revise
      published:
        type: end
        output: "{{draft}}"
      revise:
        type: end
        status: failed
        output: "sent back"
"""
RESEARCHER = """\
    model: openai:gpt-test
    instructions: You research topics with your tools.
"""
RESEARCHER_TOOLS = """\
#!/usr/bin/env bash
set -e
# @cmd Look a topic up in the archive
# @option --topic! The topic
lookup() {
  echo "archive: $argc_topic was first measured in 1850" >> "$LLM_OUTPUT"
}
eval "$(argc --argc-eval "$0" "$@")"
"""


@pytest.fixture
def agents(tmp_path: Path) -> Path:
    root = tmp_path / "agents"
    write_agent(root / "editor", EDITOR)
    leaf = root / "researcher"
    leaf.mkdir(parents=True)
    (leaf / "config.yaml").write_text(textwrap.dedent(RESEARCHER), encoding="utf-8")
    (leaf / "tools.sh").write_text(RESEARCHER_TOOLS, encoding="utf-8")
    write_agent(tmp_path / "desk", DESK)
    return root


def script(fake: FakeLlm) -> None:
    fake.script(
        tool_calls(("lookup", {"topic": "sea level"})),
        text("Sea level has been measured since 1850."),
    )


def llm_env(fake: FakeLlm) -> dict[str, str]:
    return {"OPENAI_BASE_URL": fake.url_openai, "OPENAI_API_KEY": "sk-test"}


def tree(graphrun: GraphrunCli) -> tuple[dict, dict, dict]:  # type: ignore[type-arg]
    """The top, middle and leaf runs of the only tree in the database."""
    rows = graphrun("runs", "--json").json_lines()
    by_parent = {r["parent_run_id"]: r for r in rows}  # type: ignore[index]
    top = by_parent[None]
    middle = by_parent[top["run_id"]]
    leaf = by_parent[middle["run_id"]]
    assert len(rows) == 3
    return top, middle, leaf


def test_three_levels_with_an_approval_audit_show_and_offline_replay(
    graphrun: GraphrunCli, fake_llm: FakeLlm, agents: Path, tmp_path: Path
) -> None:
    script(fake_llm)

    res = graphrun(
        "run",
        str(tmp_path / "desk"),
        "sea level",
        "--agents-dir",
        str(agents),
        "--answer",
        "sign_off=publish",
        "--as",
        "alice",
        **llm_env(fake_llm),
    )

    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "Desk: Sea level has been measured since 1850."
    top, middle, leaf = tree(graphrun)
    assert [r["status"] for r in (top, middle, leaf)] == ["completed"] * 3
    assert fake_llm.requests[0].body["messages"][-1]["content"] == "Write a note about sea level"

    # runs: the tree, children indented under their parents.
    listing = graphrun("runs").stdout.splitlines()
    order = [line.split()[0] for line in listing[1:]]
    assert order == [top["run_id"], middle["run_id"], leaf["run_id"]]
    assert listing[2].startswith("  " + middle["run_id"])
    assert listing[3].startswith("    " + leaf["run_id"])

    # show: the whole tree from the top.
    shown = graphrun("show", top["run_id"], "--json").json()
    assert shown["status"] == "completed"  # type: ignore[index]
    (mid,) = shown["children"]  # type: ignore[index]
    (lf,) = mid["children"]
    assert (mid["run_id"], lf["run_id"]) == (middle["run_id"], leaf["run_id"])
    assert lf["output"] == "Sea level has been measured since 1850."
    assert mid["state"]["draft"] == lf["output"]

    # audit: the approval in the middle run, seen from the top.
    audit = graphrun("audit", top["run_id"], "--verify", "--json").json()
    (decision,) = audit["decisions"]  # type: ignore[index]
    assert (decision["run_id"], decision["node_id"]) == (middle["run_id"], "sign_off")
    assert (decision["answer"], decision["by"], decision["depth"]) == ("publish", "alice", 1)
    assert decision["question"].startswith("Publish this draft? Sea level")
    assert [c["ok"] for c in audit["verify"]] == [True, True, True]  # type: ignore[index]

    # replay: no LLM server, no agent files.
    fake_llm.stop()
    shutil.rmtree(agents)
    shutil.rmtree(tmp_path / "desk")
    replayed = graphrun("replay", top["run_id"])
    assert replayed.code == 0, replayed.stderr
    lines = replayed.stderr.strip().splitlines()
    assert [line.split()[2].rstrip(":") for line in lines] == [
        top["run_id"],
        middle["run_id"],
        leaf["run_id"],
    ]
    assert all(line.startswith("ok: run ") for line in lines)


def test_a_waiting_grandchild_approval_answered_later_finishes_the_tree(
    graphrun: GraphrunCli, fake_llm: FakeLlm, agents: Path, tmp_path: Path
) -> None:
    script(fake_llm)

    waiting = graphrun(
        "run", str(tmp_path / "desk"), "sea level", "--agents-dir", str(agents), **llm_env(fake_llm)
    )

    assert waiting.code == 3, waiting.stderr
    top, middle, leaf = tree(graphrun)
    assert (middle["status"], leaf["status"]) == ("waiting", "completed")
    assert f"graphrun approve {middle['run_id']} " in waiting.stderr

    res = graphrun("approve", middle["run_id"], "revise", "--as", "bob", **llm_env(fake_llm))

    assert res.code == 1, res.stderr  # the editor's "revise" end fails the tree
    top, middle, leaf = tree(graphrun)
    assert (top["status"], middle["status"]) == ("failed", "failed")
    (decision,) = graphrun("audit", top["run_id"], "--json").json()["decisions"]  # type: ignore[index]
    assert (decision["by"], decision["answer"], decision["via"]) == ("bob", "revise", "approve")
    assert len(fake_llm.requests) == 2  # the leaf's calls were not repeated on resume
