"""``graph.schema.json``: the JSON Schema of graph.yaml, generated from the Structs.

The committed copy (package data, next to this module) is what editors use via
yaml-language-server (``# yaml-language-server: $schema=...``); a test keeps it
equal to :func:`generate`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

SCHEMA_FILE = Path(__file__).with_name("graph.schema.json")


def _close_objects(node: Any) -> None:
    """Structs forbid unknown fields: say so in the schema too."""
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node:
            node.setdefault("additionalProperties", False)
        for value in node.values():
            _close_objects(value)
    elif isinstance(node, list):
        for value in node:
            _close_objects(value)


def generate() -> dict[str, Any]:
    import msgspec

    from graphrun.runtime.graph import NODE_TYPES, Graph

    schema = msgspec.json.schema(Graph)
    _close_objects(schema)
    defs = schema["$defs"]
    # `id` of a node, `type` as a const (editors complete it), and a flat if/then
    # dispatch that jsonschema reports well.
    for tag, cls in NODE_TYPES.items():
        d = defs[cls.__name__]
        d["properties"]["type"] = {"const": tag}
        required = d.setdefault("required", [])
        if "type" not in required:
            required.insert(0, "type")
    graph = defs["Graph"]
    graph["properties"]["version"] = {"const": "1.0", "description": 'Graph schema version: "1.0".'}
    graph["properties"]["nodes"]["additionalProperties"] = {
        "type": "object",
        "required": ["type"],
        "properties": {"type": {"enum": list(NODE_TYPES)}},
        "allOf": [
            {
                "if": {"properties": {"type": {"const": tag}}},
                "then": {"$ref": f"#/$defs/{cls.__name__}"},
            }
            for tag, cls in NODE_TYPES.items()
        ],
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://graphrun.dev/graph.schema.json",
        "title": "graphrun graph.yaml",
        **schema,
    }


def schema_text() -> str:
    return json.dumps(generate(), indent=2, sort_keys=True) + "\n"


@lru_cache(maxsize=1)
def shipped() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def schema_errors(data: Any) -> list[tuple[str, str]]:
    """``(json path, message)`` for every structural error the shipped schema finds."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(shipped())
    out = []
    for error in validator.iter_errors(data):
        path = "$" + "".join(
            f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path
        )
        out.append((path, error.message))
    return out
