"""Loading graph.yaml: structure errors with file, line and JSON path; line maps."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from graphrun.runtime.errors import GraphLoadError, GraphValidationError
from graphrun.runtime.graph.loader import find_graph_file, load_graph, load_text, parse_yaml
from graphrun.runtime.nodes.end import EndNode
from graphrun.runtime.nodes.script import ScriptNode


def load(text: str):  # type: ignore[no-untyped-def]
    return load_text(textwrap.dedent(text).lstrip(), path=Path("graph.yaml"))


def errors_of(text: str) -> list[str]:
    with pytest.raises(GraphValidationError) as info:
        load(text)
    return [d.format() for d in info.value.diagnostics]


def test_loads_a_graph_with_defaults_and_lines() -> None:
    loaded = load("""
        name: g
        version: "1.0"
        start: a
        nodes:
          a:
            type: script
            script: scripts/a.py
            state_updates:
              x: "{{y}}"
          done:
            type: end
    """)
    graph = loaded.graph
    assert isinstance(graph.nodes["a"], ScriptNode)
    assert graph.nodes["a"].timeout == 30.0
    assert isinstance(graph.nodes["done"], EndNode)
    assert graph.settings.max_loop_iterations == 100
    assert graph.settings.validate_before_run is True
    assert graph.settings.timeout is None
    assert loaded.line("$.nodes.a") == 5
    assert loaded.line("$.nodes.a.script") == 7
    assert loaded.line("$.nodes.a.state_updates.x") == 9
    # An unknown path falls back to its closest known ancestor.
    assert loaded.line("$.nodes.a.state_updates.nope[3]") == 8
    assert loaded.agent_dir == Path(".")


def test_parse_yaml_maps_sequence_items_and_quoted_keys() -> None:
    data, lines, problems = parse_yaml('a:\n  - x\n  - y\n"b c":\n  d: 1\n')
    assert data == {"a": ["x", "y"], "b c": {"d": 1}}
    assert lines["$.a[1]"] == 3
    assert lines["$['b c'].d"] == 5
    assert problems == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: g\nnodes: [\n", "graph.yaml:3: malformed YAML: did not find expected node content"),
        (
            "name: g\n\tversion: x\n",
            "graph.yaml:2: malformed YAML: found a tab character that violates indentation",
        ),
        ("", "graph.yaml: the file is empty"),
        (
            "name: !!python/object:os.system x\n",
            "graph.yaml:1: malformed YAML: could not determine a constructor for the tag "
            "'tag:yaml.org,2002:python/object:os.system'",
        ),
    ],
)
def test_malformed_yaml_is_one_line(text: str, message: str) -> None:
    with pytest.raises(GraphLoadError) as info:
        load_text(text, path=Path("graph.yaml"))
    assert str(info.value) == message
    assert "\n" not in str(info.value)
    assert info.value.exit_code == 2


def warnings_of(text: str) -> list[str]:
    return [d.format() for d in load(text).warnings]


def test_unknown_field_suggests_the_closest() -> None:
    # Unknown fields are warnings (Loki ignores them); here `prompt` is also missing.
    assert errors_of("""
        name: g
        version: "1.0"
        start: a
        nodes:
          a:
            type: llm
            promt: hi
            next: done
          done:
            type: end
    """) == [
        "graph.yaml:5 ($.nodes.a): llm node 'a' is missing the required field 'prompt' "
        "('promt' is written instead: rename it to 'prompt')",
        "graph.yaml:7 ($.nodes.a.promt): unknown field 'promt' in llm node 'a' (ignored) "
        "(did you mean 'prompt'?)",
    ]


def test_unknown_top_level_and_settings_fields() -> None:
    assert errors_of("""
        nme: g
        version: "1.0"
        start: a
        settings:
          timout: 3
          max_loop_iteration: 4
        nodes:
          a: {type: end}
    """) == [
        "graph.yaml:1 ($): the graph is missing the required field 'name' "
        "('nme' is written instead: rename it to 'name')",
        "graph.yaml:1 ($.nme): unknown field 'nme' in the graph (ignored) (did you mean 'name'?)",
        "graph.yaml:5 ($.settings.timout): unknown field 'timout' in settings (ignored) "
        "(did you mean 'timeout'?)",
        "graph.yaml:6 ($.settings.max_loop_iteration): unknown field 'max_loop_iteration' in "
        "settings (ignored) (did you mean 'max_loop_iterations'?)",
    ]
    assert warnings_of("""
        name: g
        version: "1.0"
        start: a
        settings:
          timout: 3
          max_loop_iteration: 4
        nodes:
          a: {type: end}
    """) == [
        "graph.yaml:5 ($.settings.timout): unknown field 'timout' in settings (ignored) "
        "(did you mean 'timeout'?)",
        "graph.yaml:6 ($.settings.max_loop_iteration): unknown field 'max_loop_iteration' in "
        "settings (ignored) (did you mean 'max_loop_iterations'?)",
    ]


def test_unknown_field_without_a_close_match_has_no_hint() -> None:
    assert warnings_of("""
        name: g
        version: "1.0"
        start: a
        nodes:
          a: {type: end, colour: blue}
    """) == ["graph.yaml:5 ($.nodes.a.colour): unknown field 'colour' in end node 'a' (ignored)"]


def test_wrong_types_every_error_at_once() -> None:
    assert errors_of("""
        name: g
        version: 1.0
        start: a
        settings:
          max_loop_iterations: lots
        nodes:
          a:
            type: script
            script: scripts/a.py
            timeout: soon
            next: done
          b:
            type: approval
            question: q
            options: [ok, 3]
            on_other: done
          done:
            type: end
    """) == [
        'graph.yaml:2 ($.version): version must be the string "1.0", got the number 1.0 '
        '(quote it: version: "1.0")',
        "graph.yaml:10 ($.nodes.a.timeout): expected float, got str",
        "graph.yaml:15 ($.nodes.b.options[1]): expected str, got int",
        "graph.yaml:5 ($.settings.max_loop_iterations): expected int, got str",
    ]


def test_node_types_and_shapes() -> None:
    from graphrun.runtime.graph.model import NODE_TYPES

    TYPES = ", ".join(NODE_TYPES)
    assert TYPES.startswith("agent, script, approval, input, llm, rag, end, map")
    assert errors_of("""
        name: g
        version: "1.0"
        start: a
        nodes:
          a: {type: ennd}
          b: {output: x}
          c: hello
          d: {type: 7}
    """) == [
        "graph.yaml:5 ($.nodes.a.type): node 'a' has unknown type 'ennd' (did you mean 'end'?)",
        f"graph.yaml:6 ($.nodes.b.type): node 'b' has no 'type' (the types are: {TYPES})",
        "graph.yaml:7 ($.nodes.c): node 'c' must be a mapping of fields",
        f"graph.yaml:8 ($.nodes.d.type): node 'd' has unknown type '7' (the types are: {TYPES})",
    ]


def test_duplicate_keys_and_non_mapping_documents() -> None:
    assert errors_of("""
        name: g
        version: "1.0"
        start: a
        nodes:
          a: {type: end}
          a: {type: end}
    """) == ["graph.yaml:6 ($.nodes.a): duplicate key 'a' (first at line 5)"]
    assert errors_of("- 1\n") == ["graph.yaml:1 ($): graph.yaml must be a mapping of fields"]
    assert errors_of('name: g\nversion: "1.0"\nstart: a\nnodes: [a]\n') == [
        "graph.yaml:4 ($.nodes): 'nodes' must be a mapping of node id to node"
    ]


def test_missing_on_other_says_why_it_is_required() -> None:
    assert errors_of("""
        name: g
        version: "1.0"
        start: r
        nodes:
          r:
            type: approval
            question: ok?
            options: ["yes"]
            routes: {"yes": done}
          done: {type: end}
    """) == [
        "graph.yaml:5 ($.nodes.r): approval node 'r' is missing the required field 'on_other' "
        "(free-form answers are always possible; on_other says where they route)"
    ]


def test_find_graph_file(tmp_path: Path) -> None:
    with pytest.raises(GraphLoadError, match=f"no graph.yaml in {tmp_path}"):
        find_graph_file(tmp_path)
    (tmp_path / "config.yaml").write_text("name: x\n")
    with pytest.raises(GraphLoadError) as info:
        find_graph_file(tmp_path)
    assert str(info.value) == (
        f"{tmp_path} is an LLM-loop agent (config.yaml), not a graph agent "
        "(graph agents are defined by graph.yaml)"
    )
    with pytest.raises(GraphLoadError, match="no such file or directory"):
        find_graph_file(tmp_path / "nope.yaml")
    graph = tmp_path / "graph.yaml"
    graph.write_text('name: g\nversion: "1.0"\nstart: e\nnodes:\n  e: {type: end}\n')
    assert find_graph_file(tmp_path) == graph
    loaded = load_graph(graph)
    assert loaded.agent_dir == tmp_path and loaded.file == str(graph)


def test_unreadable_graph_file(tmp_path: Path) -> None:
    graph = tmp_path / "graph.yaml"
    graph.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(GraphLoadError, match="cannot read"):
        load_graph(tmp_path)
