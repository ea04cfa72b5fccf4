"""Hostile graph.yaml: bounded aliases, depth and size; only JSON-like values pass."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from graphrun.runtime.errors import GraphError, GraphLoadError, GraphValidationError
from graphrun.runtime.graph.loader import MAX_DEPTH, MAX_GRAPH_BYTES, load_text

HEAD = """\
name: g
version: "1.0"
start: a
nodes:
  a:
    type: end
    output: hi
"""


def load(text: str) -> object:
    return load_text(text, path=Path("graph.yaml"))


def error_of(text: str) -> str:
    with pytest.raises(GraphError) as info:
        load(text)
    message = str(info.value)
    assert "\n" not in message
    assert info.value.exit_code == 2
    return message


def alias_bomb(levels: int) -> str:
    lines = ['  a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"  a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return HEAD + "initial_state:\n" + "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_at_once() -> None:
    text = alias_bomb(12)
    assert len(text) < 1000
    started = time.monotonic()
    message = error_of(text)
    assert time.monotonic() - started < 5  # it used to take minutes and gigabytes
    assert message == (
        "graph.yaml:14: more than 200,000 values once aliases are expanded "
        "(an alias repeats everything its anchor holds)"
    )


def test_a_few_aliases_are_fine() -> None:
    loaded = load(alias_bomb(3))
    assert len(loaded.graph.initial_state["a2"]) == 9  # type: ignore[attr-defined]


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 500, 30_000])
def test_deep_nesting_is_refused(levels: int) -> None:
    flow = HEAD + "initial_state:\n  d: " + "[" * levels + "]" * levels + "\n"
    assert error_of(flow) == f"graph.yaml:9: values nest deeper than {MAX_DEPTH} levels"
    block = HEAD + "initial_state:\n" + "".join(f"{'  ' * (i + 1)}k{i}:\n" for i in range(levels))
    if levels < 1000:
        assert "values nest deeper than" in error_of(block)


def test_nesting_through_an_alias_counts() -> None:
    inner = "[" * 40 + "]" * 40
    outer = "[" * 25 + "*deep" + "]" * 25
    text = HEAD + f"initial_state:\n  a: &deep {inner}\n  b: {outer}\n"
    assert error_of(text) == f"graph.yaml:10: values nest deeper than {MAX_DEPTH} levels"


def test_an_oversized_file_is_refused() -> None:
    text = HEAD + "description: " + "x" * MAX_GRAPH_BYTES + "\n"
    assert error_of(text) == (
        f"graph.yaml: the file is {len(text):,} bytes; graph files are limited to "
        f"{MAX_GRAPH_BYTES:,}"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "!!binary aGVsbG8=",
            "graph.yaml:9 ($.initial_state.v): !!binary values are not allowed (graph.yaml "
            "holds only strings, numbers, booleans, null, lists and mappings)",
        ),
        (
            "!!timestamp 2026-11-20",
            "graph.yaml:9 ($.initial_state.v): !!timestamp values are not allowed (graph.yaml "
            "holds only strings, numbers, booleans, null, lists and mappings)",
        ),
        ("!!int abc", "graph.yaml:9 ($.initial_state.v): 'abc' is not a valid !!int value"),
        ("!!float x", "graph.yaml:9 ($.initial_state.v): 'x' is not a valid !!float value"),
        ('"a\\0b"', "graph.yaml:9 ($.initial_state.v): a string holds a NUL character"),
        (".nan", "graph.yaml:9 ($.initial_state.v): '.nan' is not a number JSON can hold"),
        ("-.inf", "graph.yaml:9 ($.initial_state.v): '-.inf' is not a number JSON can hold"),
        (
            "1" * 5000,
            "graph.yaml:9 ($.initial_state.v): '1111111111111111111111111111111111111111…' "
            "is not a valid !!int value",
        ),
        (
            "!!set {a, b}",
            "graph.yaml:9 ($.initial_state.v): !!set values are not allowed",
        ),
        (
            "!!omap [a: 1]",
            "graph.yaml:9 ($.initial_state.v): !!omap values are not allowed",
        ),
    ],
)
def test_only_json_like_values_pass(value: str, message: str) -> None:
    with pytest.raises(GraphValidationError) as info:
        load(HEAD + f"initial_state:\n  v: {value}\n")
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_a_nul_key_and_a_raw_nul_byte() -> None:
    assert error_of(HEAD + 'initial_state:\n  "k\\0": 1\n').startswith(
        "graph.yaml:9 ($.initial_state): a string holds a NUL character"
    )
    assert error_of(HEAD + "description: a\x00b\n") == (
        "graph.yaml: malformed YAML: unacceptable character #x0000: "
        "control characters are not allowed"
    )


def test_an_unquoted_date_stays_a_string() -> None:
    loaded = load(HEAD + "initial_state:\n  released: 2026-11-20\n")
    assert loaded.graph.initial_state == {"released": "2026-11-20"}  # type: ignore[attr-defined]


def test_unknown_tags_are_still_malformed_yaml() -> None:
    with pytest.raises(GraphLoadError) as info:
        load(HEAD + "initial_state: !!python/object:os.system x\n")
    assert str(info.value).startswith("graph.yaml:8: malformed YAML: could not determine")
