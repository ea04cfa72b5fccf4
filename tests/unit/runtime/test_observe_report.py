"""The report's model of a run: visits, lanes per branch, usage, state diffs, logs."""

from __future__ import annotations

import json
import re

import msgspec
from hypothesis import given, settings
from hypothesis.strategies import text

from graphrun.actors.terminal import terminal_safe
from graphrun.eventstore.events import (
    HumanInputReceived,
    HumanInputRequested,
    LlmCalled,
    NodeCompleted,
    NodeEntered,
    RunCompleted,
    RunStarted,
    ScriptFinished,
)
from graphrun.runtime.engine.usage import (
    Usage,
    budget_breach,
    call_tokens,
    load_prices,
    run_usage,
)
from graphrun.runtime.observe.logs import log_markdown
from graphrun.runtime.observe.report import (
    _PLAIN,
    _json,
    _markdown,
    _md,
    render_report,
    request_messages,
    view_run,
)


# Events as they will be once parallel branches record which branch they ran in.
class BranchEntered(NodeEntered, frozen=True, kw_only=True):
    branch: str = ""


class BranchCompleted(NodeCompleted, frozen=True, kw_only=True):
    branch: str = ""


class BranchScript(ScriptFinished, frozen=True, kw_only=True):
    branch: str = ""


GRAPH = "name: g\nversion: '1.0'\nstart: a\nnodes: {}\n"


def _parallel_run() -> list:
    t = 1_000.0
    events = [
        RunStarted(
            graph_name="g",
            graph_source=GRAPH,
            graph_hash="",
            initial_prompt="go",
            initial_state={"initial_prompt": "go"},
        ),
        BranchEntered(node_id="split", node_type="script", visit=1),
        BranchCompleted(node_id="split", visit=1, routed_to="left", updates={"n": 1}),
        BranchEntered(node_id="left", node_type="script", visit=1, branch="left"),
        BranchEntered(node_id="right", node_type="script", visit=1, branch="right"),
        BranchScript(node_id="left", visit=1, script="l.py", output={"l": 1}, branch="left"),
        BranchCompleted(node_id="left", visit=1, routed_to="join", branch="left"),
        BranchScript(node_id="right", visit=1, script="r.py", output={"r": 2}, branch="right"),
        BranchCompleted(node_id="right", visit=1, routed_to="join", branch="right"),
        BranchEntered(node_id="join", node_type="end", visit=1),
        RunCompleted(node_id="join", output="done"),
    ]
    return [
        msgspec.structs.replace(e, run_id="r1", seq=i + 1, ts=t + i) for i, e in enumerate(events)
    ]


def test_one_lane_per_branch():
    view = view_run(_parallel_run(), {})
    assert [(v.node_id, v.branch, v.status) for v in view.visits] == [
        ("split", "", "completed"),
        ("left", "left", "completed"),
        ("right", "right", "completed"),
        ("join", "", "completed"),
    ]
    left = view.visits[1]
    assert [kind for kind, _ in left.effects] == ["BranchScript"]
    html = render_report([view], {})
    lanes = re.findall(r'<div class="lane-name" title="([^"]*)"', html)
    assert lanes == ["run", "run · branch left", "run · branch right"]
    assert html.count('class="bar ') == 4


def test_state_before_and_after_each_visit():
    view = view_run(_parallel_run(), {})
    split = view.visits[0]
    # Rendered as the visit ended: what it changed, not two copies of the state.
    assert split.before is None
    assert '<span class="add">+  &quot;n&quot;: 1</span>' in split.state_html
    assert "initial_prompt" in split.state_html
    html = render_report([view], {})
    assert '<span class="add">+  &quot;n&quot;: 1</span>' in html


def _llm(node: str, usage: dict, model: str = "openai:gpt-4o-mini") -> LlmCalled:
    return LlmCalled(
        node_id=node,
        visit=1,
        model=model,
        usage=usage,
        request={"messages": [{"role": "user", "content": "hi"}]},
        text="**yes**",
    )


def test_usage_reads_both_wire_protocols_and_prices():
    assert call_tokens({"prompt_tokens": 3, "completion_tokens": 4}) == (3, 4)
    assert call_tokens({"input_tokens": 5, "output_tokens": 6}) == (5, 6)
    events = [
        _llm("a", {"prompt_tokens": 1000, "completion_tokens": 500}),
        _llm("b", {"input_tokens": 10, "output_tokens": 20}, "anthropic:mystery"),
    ]
    total, per_node = run_usage(events, {"openai:gpt-4o-mini": (1.0, 2.0)})
    assert (total.input_tokens, total.output_tokens, total.calls) == (1010, 520, 2)
    assert per_node["a"].cost == (1000 * 1.0 + 500 * 2.0) / 1e6
    assert total.unpriced == {"anthropic:mystery"} and not total.cost_known


def test_budget_breach_is_pure_and_names_the_budget():
    class S:
        max_tokens = 100
        max_cost = None

    assert budget_breach(S(), Usage(calls=1, input_tokens=60, output_tokens=40)) is None
    assert budget_breach(S(), Usage(calls=1, input_tokens=120, output_tokens=30)) == (
        "token budget exceeded: 150 tokens used, settings.max_tokens is 100"
    )

    class C:
        max_tokens = None
        max_cost = 0.01

    unpriced = Usage(calls=1, input_tokens=1, unpriced=frozenset({"x:y"}))
    assert "no price for x:y" in (budget_breach(C(), unpriced) or "")
    assert budget_breach(C(), Usage(calls=1, cost=0.02)) == (
        "cost budget exceeded: 0.020000 USD spent, settings.max_cost is 0.01 USD"
    )


def test_prices_from_config_yaml(tmp_path):
    (tmp_path / "config.yaml").write_text(
        "clients:\n"
        "  - type: openai-compatible\n"
        "    name: local\n"
        "    models:\n"
        "      - {name: llama, input_price: 0.5, output_price: 1.5}\n"
        "prices:\n"
        "  openai:gpt-4o-mini: {input_price: 9, output_price: 9}\n",
        encoding="utf-8",
    )
    prices = load_prices(tmp_path)
    assert prices["local:llama"] == (0.5, 1.5)
    assert prices["openai:gpt-4o-mini"] == (9.0, 9.0)
    (tmp_path / "config.yaml").write_text("prices:\n  a:b: {input_price: cheap}\n")
    try:
        load_prices(tmp_path)
    except Exception as exc:
        assert "prices.a:b.input_price" in str(exc) and "must be a number" in str(exc)
    else:
        raise AssertionError("a bad price was accepted")


def test_anthropic_requests_read_as_messages():
    body = {
        "system": "be brief",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]},
        ],
    }
    roles = [role for role, _ in request_messages(body)]
    assert roles == ["system", "user", "assistant"]


def test_human_waits_are_shown_with_who_and_what_was_shown():
    events = [
        RunStarted(graph_name="g", graph_source=GRAPH, graph_hash=""),
        NodeEntered(node_id="ask", node_type="approval", visit=1),
        HumanInputRequested(
            node_id="ask", visit=1, kind="approval", question="Ship?", options=["yes", "no"]
        ),
        HumanInputReceived(
            node_id="ask", visit=1, answer="yes", by="alice", os_user="bob", channel="approve"
        ),
        NodeCompleted(node_id="ask", visit=1, routed_to="end"),
    ]
    events = [
        msgspec.structs.replace(e, run_id="r", seq=i + 1, ts=10.0 + i) for i, e in enumerate(events)
    ]
    html = render_report([view_run(events, {})], {})
    assert "Ship?\noptions: yes, no" in html
    assert "alice (bob@)" in html and "<td>approve</td>" in html


def test_log_markdown_fences_tool_arguments():
    entry = {
        "graph": "g",
        "node_id": "a",
        "visit": 1,
        "purpose": "main",
        "iteration": 1,
        "attempt": 1,
        "model": "m",
        "ts": 0.0,
        "latency_ms": 1.0,
        "messages": [("user", "hi")],
        "response": None,
        "tool_calls": [{"name": "f", "arguments": "```x```"}],
        "error": None,
        "usage": Usage(calls=1, input_tokens=1).as_dict(),
        "run_id": "r",
    }
    text = log_markdown("r", [entry], Usage(calls=1, input_tokens=1))
    assert "````\n```x```\n````" in text
    assert text.endswith("## Usage\n\n1 tokens (1 in, 0 out), 1 call, $0.00\n")


def test_progress_bar_draws_on_a_terminal_only():
    import io

    from graphrun.runtime.observe.progress import progress_bar

    piped = io.StringIO()
    with progress_bar("replaying", 3, stream=piped) as advance:
        for _ in range(3):
            advance(1)
    assert piped.getvalue() == ""
    tty = io.StringIO()
    with progress_bar("replaying", 3, stream=tty, force=True) as advance:
        advance(2)
    assert "replaying" in tty.getvalue() and "\x1b[" in tty.getvalue()


def test_one_rounding_rule_for_costs() -> None:
    from graphrun.runtime.observe.usage import format_cost

    assert [format_cost(c) for c in (0.00004, 0.0012, 1.5, 0.0, 12.3456789, 0.0000004)] == [
        "$0.00004",
        "$0.0012",
        "$1.50",
        "$0.00",
        "$12.345679",
        "$0.00",
    ]


def test_what_a_run_brings_is_written_out_not_obeyed():
    """A model's reply, a question and an answer carrying control characters or a
    right-to-left override read as they are: no character of theirs reaches the page
    that could reorder or hide the text around it."""
    override, escape = "\u202e", "\x1b"
    events = [
        RunStarted(graph_name="g", graph_source=GRAPH, graph_hash="", initial_prompt="go"),
        NodeEntered(node_id="draft", node_type="llm", visit=1),
        LlmCalled(
            node_id="draft",
            visit=1,
            model="m",
            request={"messages": [{"role": "user", "content": f"say {override}yes"}]},
            response={"choices": [{"message": {"content": "ok"}}]},
            text=f"approve {override}on{escape}[2K now",
        ),
        NodeCompleted(node_id="draft", visit=1, routed_to="ask"),
        NodeEntered(node_id="ask", node_type="approval", visit=1),
        HumanInputRequested(
            node_id="ask", visit=1, kind="approval", question=f"Ship {override}evil?"
        ),
        HumanInputReceived(node_id="ask", visit=1, answer=f"yes{escape}[1A", by="alice"),
        NodeCompleted(node_id="ask", visit=1, routed_to="end"),
        RunCompleted(node_id="ask", output=f"done {override}"),
    ]
    events = [
        msgspec.structs.replace(e, run_id="r", seq=i + 1, ts=10.0 + i) for i, e in enumerate(events)
    ]
    page = render_report([view_run(events, {})], {})
    assert override not in page and escape not in page
    assert "approve \\u202eon\\x1b[2K now" in page  # the model's reply, as Markdown
    assert "Ship \\u202eevil?" in page and "yes\\x1b[1A" in page  # question, answer
    assert "say \\u202eyes" in page  # the request as sent


# The characters a plain paragraph may hold, those that make Markdown of it, and a
# few that make it more than one line or start a block.
_PLAIN_CHARS = "abcXYZ019 ,.;:?!()%/=+'\"-"
_MARKDOWN_CHARS = "*_`#>[]<&\\~|\t\n\r\u00e9\u202e\x1b"
_INLINE_CHARS = "*_`[]<&\\"


@settings(max_examples=2000, deadline=None)
@given(
    text(alphabet=_PLAIN_CHARS, max_size=24)
    | text(alphabet=_PLAIN_CHARS + _INLINE_CHARS, max_size=16)
    | text(alphabet=_PLAIN_CHARS + _MARKDOWN_CHARS, max_size=24)
)
def test_plain_text_is_rendered_as_the_markdown_parser_renders_it(value: str) -> None:
    """A one-line text a report shows without parsing it renders exactly as the
    parser renders it; any other text is parsed."""
    md = _md()
    assert _markdown(md, value) == f'<div class="md">{md.render(terminal_safe(value))}</div>'


def test_every_short_text_renders_as_the_parser_renders_it() -> None:
    """Every text of up to five characters over Markdown's markers and the plain
    ones, a letter first: the shortcut never takes one the parser renders otherwise
    (an emphasis, an escape, an entity, a code span)."""
    import itertools

    md = _md()
    alphabet = "a1 *_`[]<>&\\\"'!#-.(:"
    for n in range(4):
        for middle in itertools.product(alphabet, repeat=n):
            for value in ("a" + "".join(middle), "a" + "".join(middle) + "c"):
                assert _markdown(md, value) == (
                    f'<div class="md">{md.render(terminal_safe(value))}</div>'
                ), value


@given(text(alphabet=_PLAIN_CHARS, min_size=1, max_size=24))
def test_the_plain_path_is_taken_for_words_and_plain_punctuation(value: str) -> None:
    """(So the property above tests the shortcut, not only the parser.)"""
    if value[0].isalpha() and not value.endswith(" "):
        assert _PLAIN.fullmatch(value)


def test_bodies_are_shown_as_indented_json_with_sorted_keys() -> None:
    """An llm call's request and response read as JSON, keys sorted, as sent; what
    msgspec cannot sort falls back to the standard library, as before."""
    body = {"model": "m", "messages": [{"role": "user", "content": "ünï \u2028"}], "n": 10**20}
    assert _json(body) == json.dumps(body, indent=2, ensure_ascii=False, sort_keys=True)
    assert _json({"a": [], "b": {}, "c": None, "d": 1.5}) == (
        '{\n  "a": [],\n  "b": {},\n  "c": null,\n  "d": 1.5\n}'
    )
    assert _json({1: "x"}) == json.dumps({1: "x"}, indent=2, sort_keys=True)
    assert _json({"when": object}) == json.dumps({"when": str(object)}, indent=2)
