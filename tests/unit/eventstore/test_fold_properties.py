"""Folding: deterministic, incremental at every split, and equal to a plain model."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from graphrun.eventstore.events import (
    HumanInputReceived,
    HumanInputRequested,
    NodeCompleted,
    NodeEntered,
    NodeFailed,
    RunCompleted,
    RunFailed,
    RunResumed,
    RunStarted,
    ScriptFinished,
)
from graphrun.eventstore.fold import RunState, apply, effect_output, fold

keys = st.sampled_from(["a", "b", "c", "n", "_next", "topic"])
values = (
    st.none() | st.integers(-5, 5) | st.text(max_size=4) | st.lists(st.integers(0, 3), max_size=2)
)
objects = st.dictionaries(keys, values, max_size=3)
nodes = st.sampled_from(["parse", "loop", "ask", "review"])


@st.composite
def runs(draw: st.DrawFn) -> tuple[list[Any], dict[str, Any], dict[str, int]]:
    """A valid-looking run and what its state and visit counts must fold to."""
    seq = 0
    ts = 100.0

    def stamp(event: Any) -> Any:
        nonlocal seq, ts
        seq += 1
        ts += draw(st.sampled_from([0.0, 0.5, 1.0]))
        return type(event)(**{**_fields(event), "run_id": "r", "seq": seq, "ts": ts})

    initial = draw(objects)
    out = [
        stamp(
            RunStarted(
                graph_name="g",
                graph_source="s",
                graph_hash="h",
                initial_state=initial,
                initial_prompt=draw(st.text(max_size=5)),
            )
        )
    ]
    model = dict(initial)
    visits: dict[str, int] = {}
    for _ in range(draw(st.integers(0, 6))):
        node = draw(nodes)
        visits[node] = visits.get(node, 0) + 1
        visit = visits[node]
        out.append(stamp(NodeEntered(node_id=node, node_type="script", visit=visit)))
        kind = draw(st.sampled_from(["script", "script-failed", "human", "failed"]))
        if draw(st.booleans()):
            out.append(stamp(RunResumed(by="x", reason="resume")))
        if kind == "script":
            output = draw(objects)
            updates = draw(objects)
            out.append(
                stamp(
                    ScriptFinished(
                        node_id=node, visit=visit, script="s.py", exit_code=0, output=output
                    )
                )
            )
            out.append(
                stamp(
                    NodeCompleted(
                        node_id=node,
                        visit=visit,
                        routed_to="loop",
                        updates=updates,
                        merge_effect=True,
                    )
                )
            )
            model.update({k: v for k, v in output.items() if k != "_next"})
            model.update(updates)
        elif kind == "script-failed":
            updates = {"_error": {"node": node, "message": "exit 1"}}
            out.append(
                stamp(
                    ScriptFinished(
                        node_id=node, visit=visit, script="s.py", exit_code=1, error="exit 1"
                    )
                )
            )
            out.append(
                stamp(
                    NodeCompleted(
                        node_id=node,
                        visit=visit,
                        routed_to="loop",
                        updates=updates,
                        failed=True,
                        error="exit 1",
                    )
                )
            )
            model.update(updates)
        elif kind == "human":
            answer = draw(st.text(max_size=5))
            out.append(
                stamp(HumanInputRequested(node_id=node, visit=visit, kind="input", question="?"))
            )
            if draw(st.booleans()):
                out.append(stamp(RunResumed(by="y", reason="answer")))
            out.append(stamp(HumanInputReceived(node_id=node, visit=visit, answer=answer, by="b")))
            out.append(
                stamp(
                    NodeCompleted(
                        node_id=node, visit=visit, routed_to="loop", updates={"answer": answer}
                    )
                )
            )
            model["answer"] = answer
        else:
            out.append(stamp(NodeFailed(node_id=node, visit=visit, error="no")))
            out.append(stamp(RunFailed(error="node failed", node_id=node)))
            return out, model, visits
    if draw(st.booleans()):
        out.append(stamp(RunCompleted(node_id="end", output="done")))
    return out, model, visits


def _fields(event: Any) -> dict[str, Any]:
    return {name: getattr(event, name) for name in event.__struct_fields__}


@settings(max_examples=150, deadline=None)
@given(run=runs())
def test_fold_is_deterministic_and_matches_the_model(run: Any) -> None:
    events, model, visits = run
    first = fold(events)
    assert fold(events) == first
    assert fold(list(events)) == fold(iter(events))
    assert first.state == model
    assert first.visits == visits
    assert first.last_seq == len(events)
    assert first.steps == sum(isinstance(e, NodeEntered) for e in events)
    last = events[-1]
    expected_status = {RunCompleted: "completed", RunFailed: "failed"}.get(type(last), "running")
    assert first.status == expected_status
    assert first.run_id == "r"


@settings(max_examples=150, deadline=None)
@given(run=runs())
def test_folding_resumes_at_every_split(run: Any) -> None:
    events, _model, _visits = run
    whole = fold(events)
    for i in range(len(events) + 1):
        assert fold(events[i:], fold(events[:i])) == whole


@settings(max_examples=100, deadline=None)
@given(run=runs(), cut=st.integers(0, 40))
def test_fold_never_mutates_the_state_it_was_given(run: Any, cut: int) -> None:
    events, _model, _visits = run
    cut = min(cut, len(events))
    before = fold(events[:cut])
    snapshot = (dict(before.state), dict(before.visits), before.effects)
    after = fold(events[cut:], before)
    assert (before.state, before.visits, before.effects) == snapshot
    if cut < len(events):
        assert after.last_seq == len(events)


def test_waiting_and_answered() -> None:
    start = RunStarted(run_id="r", seq=1, graph_name="g", graph_source="", graph_hash="")
    state = apply(
        apply(RunState(), start), NodeEntered(seq=2, node_id="ask", node_type="input", visit=1)
    )
    asked = HumanInputRequested(seq=3, node_id="ask", visit=1, kind="input", question="?")
    state = apply(state, asked)
    assert (state.status, state.waiting) == ("waiting", asked)
    # A resume while waiting keeps it waiting.
    assert apply(state, RunResumed(seq=4)).status == "waiting"
    answered = apply(state, HumanInputReceived(seq=4, node_id="ask", visit=1, answer="a", by="b"))
    assert (answered.status, answered.waiting, answered.current) == ("running", None, "ask")
    assert effect_output(answered.effects) is None


def test_merge_takes_the_last_script_output_without_next() -> None:
    effects = (
        ScriptFinished(node_id="s", visit=1, script="a.py", output={"x": 1}),
        ScriptFinished(node_id="s", visit=1, script="a.py", output={"x": 2, "_next": "e"}),
    )
    assert effect_output(effects) == {"x": 2, "_next": "e"}
    start = RunStarted(
        run_id="r", seq=1, graph_name="g", graph_source="", graph_hash="", initial_state={"x": 0}
    )
    state = fold([start, NodeEntered(seq=2, node_id="s", node_type="script", visit=1)])
    for e in effects:
        state = apply(state, e)
    done = apply(
        state,
        NodeCompleted(
            seq=5, node_id="s", visit=1, routed_to="e", merge_effect=True, updates={"y": "{{x}}"}
        ),
    )
    assert done.state == {"x": 2, "y": "{{x}}"}
    assert (done.routed_to, done.last_node, done.current) == ("e", "s", None)
