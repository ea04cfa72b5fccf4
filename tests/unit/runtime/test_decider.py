"""The pure decider, driven by hand: no processes, no store, no clock.

``simulate`` plays the supervisor: it applies decision events and answers each
``Perform`` with a recorded effect outcome chosen by the test.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from graphrun.actors.messages import ScriptTask
from graphrun.eventstore.events import (
    HumanInputReceived,
    HumanInputRequested,
    LlmResult,
    NodeCompleted,
    NodeEntered,
    NodeFailed,
    RunCompleted,
    RunFailed,
    RunStarted,
    ScriptFinished,
    VisitCapExceeded,
)
from graphrun.eventstore.fold import RunState, apply, fold
from graphrun.runtime.engine.decider import (
    Append,
    Finished,
    Perform,
    decide,
    match_choice,
    state_json,
)
from graphrun.runtime.graph.loader import load_text
from graphrun.runtime.graph.model import Graph

Effect = Callable[[Perform, RunState], list[Any]]


def graph_of(text: str) -> Graph:
    return load_text(textwrap.dedent(text).lstrip(), path=Path("graph.yaml")).graph


def begin(initial: dict[str, Any] | None = None, prompt: str = "") -> RunState:
    return fold(
        [
            RunStarted(
                run_id="r",
                seq=1,
                graph_name="g",
                graph_source="",
                graph_hash="",
                initial_state={**(initial or {}), "initial_prompt": prompt},
                initial_prompt=prompt,
            )
        ]
    )


def simulate(
    graph: Graph, state: RunState, effect: Effect, limit: int = 500
) -> tuple[RunState, list[Any]]:
    log: list[Any] = []
    seq = state.last_seq
    for _ in range(limit):
        step = decide(graph, state)
        if isinstance(step, Finished):
            return state, log
        if isinstance(step, Append):
            events = list(step.events)
        else:
            events = effect(step, state)
            if not events:
                return state, log
        for event in events:
            seq += 1
            event = type(event)(
                **{**{f: getattr(event, f) for f in event.__struct_fields__}, "seq": seq}
            )
            log.append(event)
            state = apply(state, event)
    raise AssertionError("the decider did not finish")


def scripts(outputs: dict[str, Callable[[dict[str, Any]], Any]]) -> Effect:
    """Answer script Performs: a dict output, or an ``error`` string via {"__error__": ...}."""

    def effect(step: Perform, state: RunState) -> list[Any]:
        task = step.task
        assert isinstance(task, ScriptTask)
        value = outputs[step.node_id](json.loads(task.state_json))
        if isinstance(value, str):
            return [
                ScriptFinished(
                    node_id=step.node_id,
                    visit=task.visit,
                    script=task.script,
                    exit_code=1,
                    error=value,
                )
            ]
        return [
            ScriptFinished(
                node_id=step.node_id,
                visit=task.visit,
                script=task.script,
                exit_code=0,
                output=value,
            )
        ]

    return effect


def path(log: list[Any]) -> list[str]:
    return [e.node_id for e in log if isinstance(e, NodeEntered)]


LOOP = """
    name: loop
    version: "1.0"
    start: step
    settings:
      max_loop_iterations: {cap}
    initial_state:
      n: 0
    nodes:
      step:
        type: script
        script: s.py
        state_updates:
          last: "n is {{{{n}}}}"
      done:
        type: end
        output: "n={{{{n}}}} last={{{{last}}}}"
"""


def count_to(limit: int) -> Effect:
    return scripts(
        {"step": lambda s: {"n": s["n"] + 1, "_next": "done" if s["n"] + 1 >= limit else "step"}}
    )


def test_next_loop_runs_to_the_end_node() -> None:
    graph = graph_of(LOOP.format(cap=100))
    state, log = simulate(graph, begin({"n": 0}), count_to(6))
    assert path(log) == ["step"] * 6 + ["done"]
    assert state.status == "completed"
    assert state.output == "n=6 last=n is 6"
    assert state.state["n"] == 6 and "_next" not in state.state
    # The script's output is not copied into NodeCompleted: it is merged from the effect.
    completed = [e for e in log if isinstance(e, NodeCompleted) and e.node_id == "step"]
    assert all(e.merge_effect and "n" not in e.updates for e in completed)


def test_visit_cap_message_is_the_specs() -> None:
    graph = graph_of(LOOP.format(cap=3))
    state, log = simulate(graph, begin({"n": 0}), count_to(50))
    assert path(log) == ["step"] * 3
    assert isinstance(log[-2], VisitCapExceeded)
    assert (log[-2].node_id, log[-2].visits, log[-2].cap) == ("step", 4, 3)
    assert isinstance(log[-1], RunFailed)
    assert log[-1].error == "Node 'step' visited 4 times (max_loop_iterations=3)"
    assert state.status == "failed"


def test_the_decider_is_pure() -> None:
    graph = graph_of(LOOP.format(cap=100))
    _state, _log = simulate(graph, begin({"n": 0}), count_to(2))
    mid = fold(_log[:4], begin({"n": 0}))
    assert decide(graph, mid) == decide(graph, mid)
    assert state_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'


TOLERANT = """
    name: t
    version: "1.0"
    start: s
    nodes:
      s:
        type: script
        script: s.py
        {extra}
        state_updates:
          note: "failed? {{{{_error.message}}}}"
      fb:
        type: end
        output: "fallback: {{{{note}}}}"
      nx:
        type: end
        output: "next: {{{{_error.node}}}}"
"""


@pytest.mark.parametrize(
    ("extra", "outcome"),
    [
        ("fallback: fb\n        next: nx", ("completed", "fallback: failed? exit 3")),
        ("next: nx", ("completed_with_errors", "next: s")),
        ("", ("failed", None)),
    ],
)
def test_tolerant_fail_routes_fallback_then_next_then_fails(
    extra: str, outcome: tuple[str, Any]
) -> None:
    graph = graph_of(TOLERANT.format(extra=extra))
    state, log = simulate(graph, begin(), scripts({"s": lambda s: "exit 3"}))
    assert (state.status, state.output) == outcome
    if outcome[0] == "failed":
        assert isinstance(log[-2], NodeFailed) and log[-2].error == "exit 3"
        assert state.error == "node 's': exit 3"
    else:
        (done,) = [e for e in log if isinstance(e, NodeCompleted) and e.node_id == "s"]
        assert done.failed and done.error == "exit 3" and not done.merge_effect


def test_next_override_beats_static_next_and_bad_next_is_a_failure() -> None:
    graph = graph_of(TOLERANT.format(extra="next: nx\n        fallback: fb"))
    state, log = simulate(graph, begin(), scripts({"s": lambda s: {"_next": "fb"}}))
    assert path(log) == ["s", "fb"]
    state, log = simulate(graph, begin(), scripts({"s": lambda s: {"_next": 3}}))
    assert state.output == "fallback: failed? _next must be a node id string, got 3"
    state, log = simulate(graph, begin(), scripts({"s": lambda s: {"_next": "nowhere"}}))
    assert state.status == "failed"
    assert state.error == "node 's' routed to unknown node 'nowhere'"


def test_script_without_any_route_fails_clearly() -> None:
    graph = graph_of(TOLERANT.format(extra=""))
    state, _ = simulate(graph, begin(), scripts({"s": lambda s: {"x": 1}}))
    assert state.status == "failed"
    assert state.error == (
        "node 's': script printed no _next and the node has no next (or fallback) to route to"
    )


def test_end_node_strict_output_and_lenient_state_updates() -> None:
    graph = graph_of("""
        name: e
        version: "1.0"
        start: e
        nodes:
          e:
            type: end
            state_updates:
              greeting: "hi {{nobody}}!"
            output: "{{greeting}} {{initial_prompt}} {{missing_key}}"
    """)
    state, log = simulate(graph, begin(prompt="p"), scripts({}))
    assert state.status == "failed"
    assert isinstance(log[-2], NodeFailed)
    assert state.error == (
        "node 'e': {{missing_key}} in e.output: 'missing_key' is not in state"
        " (state has: greeting, initial_prompt)"
    )
    graph = graph_of("""
        name: e
        version: "1.0"
        start: e
        nodes:
          e:
            type: end
            state_updates:
              greeting: "hi {{nobody}}!"
            output: "{{greeting}} {{initial_prompt}}"
    """)
    state, _ = simulate(graph, begin(prompt="p"), scripts({}))
    assert (state.status, state.output) == ("completed", "hi ! p")
    assert state.state["greeting"] == "hi !"


APPROVAL = """
    name: a
    version: "1.0"
    start: review
    nodes:
      review:
        type: approval
        question: "Ship {{thing}}?"
        options: ["yes", "no"]
        routes: {"yes": ok, "no": rejected}
        on_other: clarify
        state_updates:
          decision: "{{choice}}"
      ok: {type: end, output: "ok {{decision}}"}
      rejected: {type: end, output: "no {{decision}}"}
      clarify: {type: end, output: "other {{decision}}"}
"""


def humans(answers: dict[str, str]) -> Effect:
    def effect(step: Perform, state: RunState) -> list[Any]:
        return [
            HumanInputReceived(
                node_id=step.node_id,
                visit=state.current_visit,
                answer=answers[step.node_id],
                by="ann",
            )
        ]

    return effect


@pytest.mark.parametrize(
    ("answer", "output"),
    [
        ("yes", "ok yes"),
        ("No", "no no"),
        ("  yes ", "ok yes"),
        ("maybe later", "other maybe later"),
    ],
)
def test_approval_routes_and_on_other(answer: str, output: str) -> None:
    graph = graph_of(APPROVAL)
    state, log = simulate(graph, begin({"thing": "v2"}), humans({"review": answer}))
    asked = [e for e in log if isinstance(e, HumanInputRequested)]
    assert asked[0].question == "Ship v2?" and asked[0].options == ["yes", "no"]
    assert state.output == output
    assert "choice" not in state.state


def test_approval_waits_before_asking() -> None:
    graph = graph_of(APPROVAL)
    state, log = simulate(graph, begin({"thing": "x"}), lambda step, st: [])
    assert state.status == "waiting"
    assert isinstance(log[-1], HumanInputRequested)
    step = decide(graph, state)
    assert isinstance(step, Perform) and step.node_type == "approval"


def test_match_choice_is_exact_then_case_insensitive() -> None:
    graph = graph_of(APPROVAL)
    node = graph.nodes["review"]
    assert match_choice(node, "YES") == "yes"  # type: ignore[arg-type]
    assert match_choice(node, "yess") is None  # type: ignore[arg-type]


INPUT = """
    name: i
    version: "1.0"
    start: ask
    initial_state:
      last: "abc"
    nodes:
      ask:
        type: input
        question: "Code?"
        default: "{{last}}"
        validation: "len(input) >= 5"
        state_updates:
          code: "{{input}}"
        next: done
      done: {type: end, output: "code={{code}}"}
"""


@pytest.mark.parametrize(
    ("answer", "status", "result"),
    [
        ("abcdef", "completed", "code=abcdef"),
        ("", "completed", "code=abc"),  # the substituted default is not re-validated
        (
            "abc",
            "failed",
            "node 'ask': input failed validation 'len(input) >= 5' (got 3 characters)",
        ),
    ],
)
def test_input_default_and_validation(answer: str, status: str, result: str) -> None:
    graph = graph_of(INPUT)
    state, _ = simulate(graph, begin({"last": "abc"}), humans({"ask": answer}))
    assert state.status == status
    assert (state.output if status == "completed" else state.error) == result


def test_llm_failure_routes_next_with_the_error_as_output() -> None:
    graph = graph_of("""
        name: l
        version: "1.0"
        start: ask
        nodes:
          ask:
            type: llm
            prompt: "Q: {{initial_prompt}}"
            state_updates:
              answer: "{{output}}"
            next: done
          done: {type: end, output: "{{answer}}"}
    """)

    def llm(step: Perform, state: RunState) -> list[Any]:
        assert step.task.prompt == "Q: why"
        return [LlmResult(node_id="ask", visit=1, error="429 rate limit")]

    state, _ = simulate(graph, begin(prompt="why"), llm)
    assert (state.status, state.output) == (
        "completed_with_errors",
        "LLM node failed: 429 rate limit",
    )
    failure = {"node": "ask", "visit": 1, "error": "LLM node failed: 429 rate limit"}
    assert state.unhandled == (failure,)


def test_strict_prompt_missing_key_fails_the_node() -> None:
    graph = graph_of("""
        name: l
        version: "1.0"
        start: ask
        nodes:
          ask: {type: llm, prompt: "{{nope}}", next: done, fallback: done}
          done: {type: end}
    """)
    state, log = simulate(graph, begin(), lambda step, st: [])
    assert state.status == "failed"
    assert isinstance(log[-2], NodeFailed)
    assert log[-2].error.startswith("{{nope}} in ask.prompt: 'nope' is not in state")


def test_a_log_in_a_node_the_graph_lacks_fails() -> None:
    graph = graph_of(LOOP.format(cap=100))
    state = apply(begin(), NodeEntered(seq=2, node_id="gone", node_type="script", visit=1))
    step = decide(graph, state)
    assert isinstance(step, Append) and isinstance(step.events[0], RunFailed)
    assert step.events[0].error == "the log is in node 'gone', which the graph does not have"
    done = apply(state, RunCompleted(seq=3, node_id="x", output=""))
    assert decide(graph, done) == Finished("completed")
