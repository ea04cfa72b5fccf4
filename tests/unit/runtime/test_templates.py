"""``{{path}}`` templates: the spec's table, rendering rules, strict and lenient modes."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrun.runtime.errors import TemplateError
from graphrun.runtime.graph.templates import (
    expressions,
    lookup,
    parse_path,
    render,
    render_update,
    render_updates,
    to_text,
)

STATE = {
    "key": "value",
    "a": {"b": {"c": 3}, "arr": [0, 1, {"field": "deep"}]},
    "arr": ["x", "y"],
    "matrix": [[1, 2], [3, 4]],
    "users": [{"name": "Ann"}, {"name": "Bo"}],
    "flag": True,
    "none": None,
    "num": 4.5,
    "obj": {"k": "v"},
    "text": "héllo",
}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{key}}", "value"),
        ("{{a.b.c}}", "3"),
        ("{{arr[0]}}", "x"),
        ("{{matrix[0][1]}}", "2"),
        ("{{users[0].name}}", "Ann"),
        ("{{a.arr[2].field}}", "deep"),
        ("{{flag}}", "true"),
        ("{{none}}", "null"),
        ("{{num}}", "4.5"),
        ("{{arr}}", '["x","y"]'),
        ("{{obj}}", '{"k":"v"}'),
        ("{{text}}", "héllo"),
        ("{{ key }} and {{a.b.c}}!", "value and 3!"),
        ("no templates { here }", "no templates { here }"),
        ("{{arr[-1]}}", "y"),
    ],
)
def test_spec_table(template: str, expected: str) -> None:
    assert render(template, STATE, strict=True) == expected
    assert render(template, STATE, strict=False) == expected


@pytest.mark.parametrize("path", ["missing", "a.b.x", "arr[5]", "key.sub", "users[0].age"])
def test_missing_is_an_error_when_strict_and_empty_when_lenient(path: str) -> None:
    assert render(f"<{{{{{path}}}}}>", STATE, strict=False) == "<>"
    with pytest.raises(TemplateError, match=re.escape(f"'{path}' is not in state")):
        render(f"{{{{{path}}}}}", STATE, strict=True, field="n.prompt")


def test_strict_error_message_and_hint() -> None:
    with pytest.raises(TemplateError) as info:
        render("Hi {{usres}}", STATE, strict=True, field="greet.prompt")
    assert str(info.value) == (
        "{{usres}} in greet.prompt: 'usres' is not in state (did you mean 'users'?)"
    )
    with pytest.raises(TemplateError) as info:
        render("{{zzz}}", {}, strict=True, field="e.output")
    assert str(info.value) == "{{zzz}} in e.output: 'zzz' is not in state (state is empty)"


@pytest.mark.parametrize("path", ["a..b", ".a", "a.", "[0]", "a[x]", "a]"])
def test_malformed_paths(path: str) -> None:
    with pytest.raises(ValueError, match="malformed template path"):
        parse_path(path)
    with pytest.raises(TemplateError):
        render(f"{{{{{path}}}}}", STATE, strict=True)
    assert render(f"{{{{{path}}}}}", STATE, strict=False) == ""


def test_parse_path_and_expressions() -> None:
    assert parse_path("users[0].name") == ("users", 0, "name")
    assert parse_path("matrix[0][1]") == ("matrix", 0, 1)
    assert expressions("{{a}} x {{ b.c[1] }}") == ["a", "b.c[1]"]


def test_state_updates_keep_the_type_of_a_whole_expression() -> None:
    assert render_update("{{arr}}", STATE) == ["x", "y"]
    assert render_update("{{a.b}}", STATE) == {"c": 3}
    assert render_update("{{flag}}", STATE) is True
    assert render_update("{{missing}}", STATE) == ""
    assert render_update(" {{arr}}", STATE) == ' ["x","y"]'
    assert render_update("n={{a.b.c}}", STATE) == "n=3"
    assert render_update(7, STATE) == 7
    assert render_update(["{{key}}", {"k": "{{num}}"}], STATE) == ["value", {"k": 4.5}]


def test_scoped_variables_exist_only_in_state_updates() -> None:
    updates = render_updates(
        {"r": "{{output}}", "t": "got {{choice}}"}, STATE, {"output": {"x": 1}, "choice": "yes"}
    )
    assert updates == {"r": {"x": 1}, "t": "got yes"}
    assert "output" not in updates and "choice" not in updates
    assert render_updates({}, STATE, {"output": 1}) == {}
    # Scoped variables shadow state keys of the same name, only inside state_updates.
    assert render_updates({"k": "{{key}}"}, STATE, {"key": "scoped"}) == {"k": "scoped"}
    with pytest.raises(TemplateError):
        render("{{output}}", STATE, strict=True)


# --- properties --------------------------------------------------------------------

identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,5}", fullmatch=True)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-1000, 1000)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8).filter(lambda s: "{{" not in s)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(identifiers, inner, max_size=3),
    max_leaves=10,
)
states = st.dictionaries(identifiers, values, min_size=1, max_size=4)


@st.composite
def state_and_path(draw: st.DrawFn) -> tuple[dict[str, Any], str, Any]:
    """A state, a path that exists in it, and the value found by walking there."""
    state = draw(states)
    key = draw(st.sampled_from(sorted(state)))
    path, value = key, state[key]
    while draw(st.booleans()):
        if isinstance(value, dict) and value:
            k = draw(st.sampled_from(sorted(value)))
            path, value = f"{path}.{k}", value[k]
        elif isinstance(value, list) and value:
            i = draw(st.integers(0, len(value) - 1))
            path, value = f"{path}[{i}]", value[i]
        else:
            break
    return state, path, value


def reference_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@settings(max_examples=200, deadline=None)
@given(case=state_and_path())
def test_rendering_a_path_is_to_text_of_its_value(case: tuple[dict[str, Any], str, Any]) -> None:
    state, path, value = case
    assert lookup(state, path) == value
    expected = reference_text(value)
    assert to_text(value) == expected
    for template in (f"{{{{{path}}}}}", f"{{{{ {path} }}}}"):
        assert render(template, state, strict=True) == expected
        assert render(template, state, strict=False) == expected
    assert (
        render(f"<{{{{{path}}}}}|{{{{{path}}}}}>", state, strict=True) == f"<{expected}|{expected}>"
    )
    assert render_update(f"{{{{{path}}}}}", state) == value


@settings(max_examples=100, deadline=None)
@given(state=states, text=st.text(max_size=30).filter(lambda s: "{{" not in s))
def test_text_without_expressions_is_unchanged(state: dict[str, Any], text: str) -> None:
    assert render(text, state, strict=True) == text
    assert render_update(text, state) == text


@settings(max_examples=100, deadline=None)
@given(state=states, name=identifiers)
def test_a_missing_key_is_strict_error_and_lenient_empty(state: dict[str, Any], name: str) -> None:
    missing = name + "_missing"
    state.pop(missing, None)
    with pytest.raises(TemplateError):
        render(f"{{{{{missing}}}}}", state, strict=True)
    assert render(f"[{{{{{missing}}}}}]", state, strict=False) == "[]"
