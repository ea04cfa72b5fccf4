"""The one expression evaluator: safe, pure, with the paths templates use."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graphrun.runtime.graph.expressions import ExpressionError, evaluate, parse, paths

STATE = {"ticket": {"priority": "p0", "tags": ["billing"]}, "n": 3, "items": [1, 2]}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("ticket.priority", "p0"),
        ("ticket.priority == 'p0' and n > 2", True),
        ("len(items) + n", 5),
        ("items[1]", 2),
        ("contains(ticket.tags, 'billing')", True),
        ("lower('ABC')", "abc"),
        ("n if n > 5 else 0", 0),
        ("true and not false", True),
    ],
)
def test_evaluates_over_the_state(text: str, value: object) -> None:
    assert evaluate(text, STATE) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x.__class__", "expression 'x.__class__': '__class__' cannot be read"),
        (
            "open('/etc/passwd')",
            "expression \"open('/etc/passwd')\": only these functions exist: bool, contains, "
            "float, int, len, lower, str, upper",
        ),
        ("a = 1", "expression 'a = 1' does not parse: invalid syntax"),
        ("[x for x in items]", "expression '[x for x in items]': comprehension is not allowed"),
        ("", "an expression must be a non-empty string"),
    ],
)
def test_refuses_what_is_not_a_pure_expression(text: str, message: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        parse(text)
    assert str(caught.value) == message


def test_a_missing_key_is_a_clear_error() -> None:
    with pytest.raises(ExpressionError) as caught:
        evaluate("missing > 1", STATE)
    assert str(caught.value) == (
        "expression 'missing > 1' reads 'missing', which is not in the state"
    )


def test_paths_are_the_state_paths_read() -> None:
    found = paths(parse("ticket.priority == 'x' and len(items) > n and true"))
    assert sorted(found) == ["items", "n", "ticket.priority"]


def test_huge_powers_are_refused() -> None:
    with pytest.raises(ExpressionError):
        evaluate("9 ** 9 ** 9", {})


@given(st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(-5, 5)))
def test_evaluation_is_pure(state: dict[str, int]) -> None:
    text = "a > b if a and b else c == 1"
    first = [evaluate(text, state) if {"a", "b", "c"} <= set(state) else None]
    again = [evaluate(text, dict(state)) if {"a", "b", "c"} <= set(state) else None]
    assert first == again
