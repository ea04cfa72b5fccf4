"""The replayer on logs of agent (child run) and rag nodes: their recorded effects
are served from the log, and a changed request is reported with its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphrun.eventstore.codec import content_hash
from graphrun.eventstore.events import (
    ChildCancelled,
    ChildRunFinished,
    ChildRunStarted,
    Event,
    NodeCompleted,
    NodeEntered,
    RetrievalDone,
    RunCompleted,
    RunResumed,
    RunStarted,
)
from graphrun.runtime.graph.loader import load_text
from graphrun.runtime.replay.divergence import ReplayError, replay_events

GRAPH = """
version: "1.0"
name: research
start: find
nodes:
  find:
    type: rag
    documents: [./docs/]
    query: "{{initial_prompt}}"
    state_updates:
      context: "{{output.context}}"
    next: write
  write:
    type: agent
    agent: writer
    prompt: "Write about {{initial_prompt}} using {{context}}"
    state_updates:
      draft: "{{output}}"
    next: done
  done:
    type: end
    output: "{{draft}}"
"""


def recorded_log(source: str = GRAPH) -> list[Event]:
    events: list[Event] = [
        RunStarted(
            graph_name="research",
            graph_source=source,
            graph_hash=content_hash(source),
            initial_state={"initial_prompt": "owls"},
            initial_prompt="owls",
        ),
        NodeEntered(node_id="find", node_type="rag", visit=1),
        RetrievalDone(
            node_id="find",
            visit=1,
            query="owls",
            result={"context": "Owls hunt at night.", "sources": ["docs/owls.md"]},
        ),
        NodeCompleted(
            node_id="find",
            visit=1,
            routed_to="write",
            updates={"context": "Owls hunt at night."},
        ),
        NodeEntered(node_id="write", node_type="agent", visit=1),
        ChildRunStarted(
            node_id="write",
            visit=1,
            child_run_id="child1",
            agent="writer",
            prompt="Write about owls using Owls hunt at night.",
        ),
        # The parent was interrupted while its child ran, then resumed.
        RunResumed(by="ops", reason="resume"),
        ChildRunFinished(
            node_id="write", visit=1, child_run_id="child1", status="completed", output="Owls!"
        ),
        NodeCompleted(node_id="write", visit=1, routed_to="done", updates={"draft": "Owls!"}),
        NodeEntered(node_id="done", node_type="end", visit=1),
        NodeCompleted(node_id="done", visit=1, routed_to=None),
        RunCompleted(node_id="done", output="Owls!"),
        ChildCancelled(child_run_id="child1", reason="none left running"),
    ]
    return [
        e.__class__(**{**_fields(e), "seq": i + 1, "run_id": "r1"}) for i, e in enumerate(events)
    ]


def _fields(event: Event) -> dict[str, object]:
    return {f: getattr(event, f) for f in event.__struct_fields__}


def test_child_run_and_retrieval_effects_are_served_from_the_log() -> None:
    result = replay_events(recorded_log())
    assert result.ok, result.divergence and result.divergence.format()
    assert result.effects == 3
    assert result.final is not None and result.final.status == "completed"
    assert result.final.state["draft"] == "Owls!"


def test_a_changed_child_prompt_is_a_request_divergence(tmp_path: Path) -> None:
    changed = GRAPH.replace("Write about {{initial_prompt}}", "Summarise {{initial_prompt}}")
    loaded = load_text(changed, path=tmp_path / "graph.yaml", agent_dir=tmp_path)
    result = replay_events(recorded_log(), loaded)
    assert not result.ok
    d = result.divergence
    assert d is not None
    assert (d.node_id, d.seq, d.event_type, d.field) == ("write", 6, "ChildRunStarted", "prompt")
    report = d.format()
    assert "-Write about owls" in report and "+Summarise owls" in report


def test_a_changed_query_is_reported_with_the_field(tmp_path: Path) -> None:
    changed = GRAPH.replace('query: "{{initial_prompt}}"', 'query: "about {{initial_prompt}}"')
    loaded = load_text(changed, path=tmp_path / "graph.yaml", agent_dir=tmp_path)
    d = replay_events(recorded_log(), loaded).divergence
    assert d is not None and (d.node_id, d.field) == ("find", "query")
    assert d.as_dict()["diff"].endswith("+about owls")


def test_a_log_that_continues_after_the_end_diverges() -> None:
    log = recorded_log()
    extra = NodeEntered(run_id="r1", seq=len(log) + 1, node_id="done", node_type="end", visit=2)
    d = replay_events([*log, extra]).divergence
    assert d is not None and d.kind == "extra" and d.seq == len(log) + 1


def test_a_log_without_run_started_is_an_error() -> None:
    with pytest.raises(ReplayError):
        replay_events(recorded_log()[1:], load_text(GRAPH, path=Path("graph.yaml")))
