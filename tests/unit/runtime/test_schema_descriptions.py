"""Every property of graph.yaml's JSON Schema has a description (an editor's hover)."""

from __future__ import annotations

from typing import Any

from graphrun.runtime.graph.model import NODE_TYPES
from graphrun.runtime.graph.schema import generate, schema_errors


def _undescribed(node: Any, path: str = "$") -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        for name, sub in node.get("properties", {}).items():
            if "description" not in sub:
                out.append(f"{path}.properties.{name}")
        for key, sub in node.items():
            if key != "if":  # the node-type dispatch, not a property people write
                out += _undescribed(sub, f"{path}.{key}")
    elif isinstance(node, list):
        for i, sub in enumerate(node):
            out += _undescribed(sub, f"{path}[{i}]")
    return out


def test_every_property_and_node_type_is_described() -> None:
    schema = generate()
    assert _undescribed(schema) == []
    for name, definition in schema["$defs"].items():
        assert definition.get("description"), name


def test_descriptions_say_what_the_field_does() -> None:
    defs = generate()["$defs"]
    assert (
        "len(input) <op> <integer>" in defs["InputNode"]["properties"]["validation"]["description"]
    )
    assert "free-form" in defs["ApprovalNode"]["properties"]["on_other"]["description"]
    assert defs["ScriptNode"]["properties"]["next"]["description"].startswith("The default")


def test_descriptions_do_not_change_what_validates() -> None:
    graph = {"name": "g", "version": "1.0", "start": "e", "nodes": {"e": {"type": "end"}}}
    assert schema_errors(graph) == []
    graph["nodes"]["e"]["outptu"] = "x"  # type: ignore[index]
    assert schema_errors(graph) != []


def test_docs_graph_yaml_names_every_field_of_every_node_type() -> None:
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[3] / "docs" / "graph-yaml.md").read_text(
        encoding="utf-8"
    )
    defs = generate()["$defs"]
    missing = [
        f"{name}.{prop}"
        for name, definition in defs.items()
        for prop in definition.get("properties", {})
        if f"`{prop}`" not in docs
    ]
    assert missing == []
    for tag in NODE_TYPES:
        assert f"\n## {tag}\n" in docs
