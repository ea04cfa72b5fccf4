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

# Kept at runtime/graph.schema.json: the examples' editor hints point there.
SCHEMA_FILE = Path(__file__).parents[1] / "graph.schema.json"


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


#: What an editor shows on hover: the description of each definition (key ``None``)
#: and of each property, by definition. A node kind's (and its own Structs') are its
#: ``DESCRIPTIONS``, in its module under runtime/nodes/. Node fields every node type
#: has are in ``_NODE_COMMON``; a node type's own entry wins. The text is the user's manual in
#: brief (docs/graph-yaml.md has the whole of it); a test checks that every property
#: of the generated schema has one.
_NODE_COMMON: dict[str, str] = {
    "type": "The node type: {types}.",
    "id": "The node's id. Optional: it defaults to the key under `nodes:`; when given it "
    "must equal that key.",
    "description": "Free-form prose about the node, for people; not used at run time.",
    "next": "The default next node. A list of two or more ids fans out: the targets run "
    "together in the next super-step; `[]` ends this branch.",
    "state_updates": "Map of state key -> template, applied after the node's body "
    '(lenient: a missing key renders as ""). A value that is exactly one '
    "`{{expression}}` keeps its JSON type. Scoped here only: {{output}} (agent, llm, rag, "
    "map), {{choice}} (approval), {{input}} (input).",
    "routes": "graphrun: conditional edges, a list of `{when, to}` tried in order after the "
    "node's state_updates; the first whose `when` holds wins (`when: default` always does); "
    "none: `next`.",
    "on_error": "graphrun: failure routes, a list of `{match, kind, to}` or `{default: true, "
    "to}`; the first that matches the failure's kind and `<kind>: <message>` wins (not with "
    "`fallback`).",
    "if": "graphrun: an expression over the state, evaluated when the node is about to run; "
    "false: the node is skipped (no effect, no writes) and the run goes to `next`.",
    "unless": "graphrun: an expression over the state, evaluated when the node is about to "
    "run; true: the node is skipped (no effect, no writes) and the run goes to `next`.",
    "retry": "graphrun: try a failed effect again (`{max_attempts, backoff, initial, max, "
    "jitter, on}`); the failure routes only once the attempts are used up.",
    "guard": "graphrun: `{input, output, on_fail}` conditions around the node's effect.",
    "cache": "graphrun: `{key, ttl}`; serve the recorded effect of an earlier run of this "
    "graph that made the same request.",
    "join": "graphrun: on a fan-out (`next` list), `{type: all|any|count, count, timeout}`: "
    "when the super-step goes on; the branches still running then are cancelled.",
    "fallback": "Where to route when the node fails (tolerant fail). Without it a "
    "failure continues to `next`, with the error in state as `_error`.",
    "timeout": "The node's wall-clock cap, in seconds.",
    "output_schema": "A JSON Schema for the node's output. The output is parsed (or "
    "extracted) as JSON; an object's top-level keys merge into state; {{output}} is the "
    "parsed value.",
}

_DESCRIPTIONS: dict[str, dict[str | None, str]] = {
    "Graph": {
        None: "A graph agent: agent-level config plus a directed graph of typed nodes "
        "(Loki's graph.yaml).",
        "name": "The agent's name (required).",
        "version": 'Graph schema version: only "1.0" is accepted.',
        "description": "Plain prose describing what the workflow does.",
        "start": "The id of the first node to run (required).",
        "nodes": "The nodes, by id. Each has a `type` and that type's fields.",
        "model": "Default model for llm nodes that set none, as provider:model "
        "(e.g. openai:gpt-4o-mini, anthropic:claude-sonnet-4-6).",
        "temperature": "Default sampling temperature for llm nodes.",
        "top_p": "Default sampling top-p for llm nodes.",
        "reasoning_effort": "Default reasoning effort for llm nodes on models that take "
        "one (e.g. low, medium, high).",
        "global_tools": "Global tools (from the config dir's functions/tools) that llm "
        "nodes may whitelist in `tools:`.",
        "mcp_servers": "MCP servers (from functions/mcp.json) whose tools llm nodes may "
        "whitelist, one by one or as mcp:<server>.",
        "conversation_starters": "Suggested prompts (for listings; not used by a run).",
        "settings": "Run-wide limits and switches.",
        "initial_state": "State seeded before the first node; {{initial_prompt}} is always "
        "the run's prompt. `--set KEY=VALUE` wins over it.",
        "reducers": "How writes to a state key from parallel branches combine: append, "
        "extend, concat, sum, max, min, merge or overwrite (the default: last in node-id "
        "order wins).",
        "variables": "Agent variables (Loki's shape): each reaches scripts and tools as "
        "LLM_AGENT_VAR_<NAME>; a variable without a default must be given.",
        "skills_enabled": "Loki's skills switch: llm nodes are offered skill__list, "
        "skill__load and skill__unload.",
        "enabled_skills": "Loki's skill allow-list: the skills skill__load may load.",
        "inject_skill_instructions": "Loki's skill hint switch (default true): llm nodes "
        "with skills get a paragraph on skill__* appended to their instructions.",
        "skill_instructions": "Loki's skill hint text: replaces the default paragraph.",
    },
    "Settings": {
        None: "Run-wide limits and switches.",
        "max_loop_iterations": "Per-node visit cap (default 100): a node entered more "
        "often fails the run.",
        "log_state_snapshots": "Log the state's size and keys before each node "
        "(GRAPHRUN_LOG=debug; the full state at trace). Default true.",
        "validate_before_run": "Run the validator before each run (default true).",
        "timeout": "Wall-clock cap on the whole run, in seconds; time waiting for a "
        "person does not count. Unset: none.",
        "max_concurrency": "How many nodes of one super-step run at once (default 8).",
        "max_tokens": "Budget: the most LLM tokens the run may use.",
        "max_cost": "Budget: the most the run's LLM calls may cost, in USD.",
        "on_unhandled_failure": "A node that fails with no fallback routes on to `next` "
        "(Loki's rule); the run then ends `completed_with_errors` (default, exit 4), "
        "`continue`: plain `completed`, or `fail`: the first such failure fails the run.",
        "signed_decisions": "graphrun extension: `required` refuses human answers that are "
        "not signed by an allowed signer (graphrun approve --sign KEY); default optional.",
        "cancel_by": "graphrun extension: `approvers` lets only the graph's approvers cancel "
        "the run; default anyone.",
    },
    "RetryPolicy": {
        None: "graphrun: how a failed effect is tried again; each attempt, its error and "
        "the delay are recorded.",
        "max_attempts": "Attempts in all, the first included (3).",
        "backoff": "`exponential` (initial, then doubling) or `fixed` (initial each time).",
        "initial": "Seconds before the second attempt (1).",
        "max": "The longest delay, in seconds (60).",
        "jitter": "Wait between half and all of the delay (true), from a value fixed by the "
        "run, node, visit and attempt, so a replay decides the same.",
        "on": "Regular expressions searched in `<kind>: <message>`: retry only errors that "
        "match one (empty: any).",
    },
    "Guard": {
        None: "graphrun: conditions checked before (`input`) and after (`output`) the "
        "node's effect; one that does not hold routes to `on_fail`.",
        "input": "An expression over the state, or a JSON Schema (a mapping, draft 2020-12) "
        "the state must be valid against; checked before the effect; false or invalid: the "
        "effect never runs.",
        "output": "An expression over the state the node leaves, with `output` its result, "
        "or a JSON Schema (a mapping) the result must be valid against; false or invalid: "
        "the completion is dropped.",
        "on_fail": "Where a failed guard routes (`_error` says which); none: the run fails.",
    },
    "JoinPolicy": {
        None: "graphrun: when a fan-out's super-step goes on; branches still running then "
        "are cancelled (their processes and child runs too) and recorded as cancelled; "
        "only the counted branches are merged, in node-id order.",
        "type": "`all` (every branch, the default), `any` (the first to finish) or `count` "
        "(the first `count` to finish).",
        "count": "With `type: count`: how many branches must finish (1 to the number of branches).",
        "timeout": "Seconds after which the branches still running are cancelled and count "
        "as failed (the step fails unless the join already holds).",
    },
    "CachePolicy": {
        None: "graphrun: an earlier run's recorded effect for the same request is served "
        "instead of performing it again (the log is the cache).",
        "key": "State paths whose values join the request in the cache key (a script's "
        "whole state is replaced by them).",
        "ttl": "Seconds an entry stays usable (none: forever).",
    },
    "ErrorRoute": {
        None: "One entry of `on_error:`; the first entry that matches the failure wins.",
        "match": "A regular expression searched for in `<kind>: <message>` (e.g. "
        "`TimeoutError`, `HTTPError: .*429`, `timed out`).",
        "kind": "The failure's kind, exactly: TimeoutError, HTTPError, ConnectionError, "
        "LLMError, OutputSchemaError, ScriptExit, ScriptOutput, ToolError, AgentFailed, "
        "RetrievalError, GuardFailed, ExpressionError, TemplateError or Cancelled.",
        "default": "true: matches any failure (the last entry, usually).",
        "to": "The node the run goes to when this entry matches; the error is in the "
        "state as `_error`.",
    },
    "Route": {
        None: "One conditional edge of a `routes:` list; the first route that matches wins.",
        "when": "A condition over the state (an expression with the paths templates use), "
        "a value to compare a decision's `expr` with, or `default` (always matches).",
        "to": "The node the run goes to when this route matches.",
    },
    "Variable": {
        None: "An agent variable.",
        "name": "The variable's name; scripts and tools see LLM_AGENT_VAR_<NAME>.",
        "description": "What the variable is for (shown when it is asked for).",
        "default": "The value used when none is given.",
    },
}


def _own_descriptions(types: list[Any]) -> dict[str, dict[str | None, str]]:
    """The ``DESCRIPTIONS`` the Structs of ``types`` (and the Structs in their fields)
    declare, by definition name: a node kind describes itself in its own module."""
    import msgspec

    found: dict[str, dict[str | None, str]] = {}

    def walk(info: Any) -> None:
        if isinstance(info, msgspec.inspect.StructType):
            if info.cls.__name__ in found:
                return
            found[info.cls.__name__] = getattr(info.cls, "DESCRIPTIONS", {})
            for f in info.fields:
                walk(f.type)
        for attr in ("types", "item_type", "key_type", "value_type"):
            inner = getattr(info, attr, None)
            for sub in inner if isinstance(inner, tuple) else (inner,):
                if sub is not None:
                    walk(sub)

    for info in msgspec.inspect.multi_type_info(types):
        walk(info)
    return {name: table for name, table in found.items() if table}


def _describe(defs: dict[str, Any]) -> None:
    """Put the descriptions of :data:`_DESCRIPTIONS` (and those the node kinds declare)
    into the schema's definitions."""
    from graphrun.runtime.graph.model import NODE_TYPES

    node_defs = {cls.__name__: cls for cls in NODE_TYPES.values()}
    own = _own_descriptions(list(NODE_TYPES.values()))
    for name, definition in defs.items():
        table = _DESCRIPTIONS.get(name) or own.get(name, {})
        if None in table:
            definition["description"] = table[None]
        common = _NODE_COMMON if name in node_defs else {}
        for prop, sub in definition.get("properties", {}).items():
            text = table.get(prop) or common.get(prop)
            if text is not None and prop == "type" and name in node_defs:
                text = text.format(types=_types())
            if text is not None:
                sub["description"] = text


def _types() -> str:
    """The node types, as a sentence lists them."""
    from graphrun.runtime.graph.model import NODE_TYPES

    names = list(NODE_TYPES)
    return ", ".join(names[:-1]) + " or " + names[-1]


def generate() -> dict[str, Any]:
    import msgspec

    from graphrun.runtime.graph.model import NODE_TYPES, Graph

    schema = msgspec.json.schema(Graph)
    # Graph.nodes holds any NodeBase: the kinds, each defined in its own module, join
    # the defs instead (``nodes`` dispatches on ``type`` below).
    del schema["$defs"]["NodeBase"]
    (_extra, more) = msgspec.json.schema_components(list(NODE_TYPES.values()))
    for name, definition in more.items():
        schema["$defs"].setdefault(name, definition)
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
    graph["properties"]["version"] = {"const": "1.0"}
    _describe(defs)
    graph["properties"]["nodes"]["additionalProperties"] = {
        "type": "object",
        "required": ["type"],
        "properties": {
            "type": {
                "enum": list(NODE_TYPES),
                "description": _NODE_COMMON["type"].format(types=_types()),
            }
        },
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
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


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
