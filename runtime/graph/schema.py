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
#: and of each property, by definition. Node fields every node type has are in
#: ``_NODE_COMMON``; a node type's own entry wins. The text is the user's manual in
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
        "inject_skill_instructions": "Loki's skill hint switch (accepted; not implemented).",
        "skill_instructions": "Loki's skill hint text (accepted; not implemented).",
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
    "Approvals": {
        None: "graphrun extension: several distinct signers must give the same answer.",
        "required": "How many distinct signers (at least 1, at most the length of `of`).",
        "of": "The principals (of the allowed_signers file) who may sign.",
    },
    "AgentNode": {
        None: "Spawns a child agent (graph or LLM loop) and waits for its final text.",
        "agent": "The child agent's name in the agents directory (required).",
        "prompt": "The child's prompt (its {{initial_prompt}}); templated, strict.",
        "timeout": "Wall-clock cap on the child run, in seconds (default 300); exceeding "
        "it fails the graph.",
        "next": "Where to go when the child finishes (required).",
        "state_updates": "Map of state key -> template; {{output}} is the child's final "
        "text (or its parsed value with output_schema).",
        "output_schema": "A JSON Schema: the child's final text is extracted to a value; "
        "an object's keys merge into state. No schema hint is sent to the child.",
    },
    "ScriptNode": {
        None: "Runs scripts/<file> (.sh with bash, .py with python3, .ts with npx tsx); "
        "its stdout JSON object merges into state.",
        "script": "The script's path, relative to the agent directory (required).",
        "timeout": "Wall-clock cap in seconds (default 30); the process group is killed.",
        "next": "The default route; a `_next` key in the script's output overrides it.",
        "fallback": "Where to route when the script exits non-zero, times out or prints "
        "no JSON object.",
    },
    "ApprovalNode": {
        None: "Asks a person to pick one of the options (or answer in their own words) "
        "and routes on the answer.",
        "question": "The question; templated, strict.",
        "options": "The options shown, in order (answers may give an option's 1-based number).",
        "routes": "Map of option -> node id: where each option routes.",
        "on_other": "Where a free-form answer (one that is no option) routes; required. "
        "Its text is {{choice}}.",
        "approvers": "graphrun extension: only these identities may answer (principals of "
        "the allowed_signers file when answers are signed; else the --as name).",
        "signed_decisions": "graphrun extension: `required` or `optional`; overrides "
        "settings.signed_decisions for this node.",
        "approvals": "graphrun extension: {required: N, of: [principals]}: the run waits "
        "until N distinct signers gave the same answer.",
        "next": "Ignored: approval nodes route with routes and on_other.",
        "state_updates": "Map of state key -> template; {{choice}} is the picked option "
        "or the free-form text.",
    },
    "InputNode": {
        None: "Asks a person for a line of free text.",
        "question": "The question; templated, strict.",
        "default": "Taken when the answer is empty; templated. Not validated.",
        "validation": "A length rule `len(input) <op> <integer>` with <op> one of >, >=, "
        "<, <=, ==. An answer that fails it is refused and the run keeps waiting.",
        "approvers": "graphrun extension: only these identities may answer.",
        "signed_decisions": "graphrun extension: `required` or `optional`; overrides "
        "settings.signed_decisions for this node.",
        "next": "Where to go with the answer (required; of a list only the first entry is used).",
        "state_updates": "Map of state key -> template; {{input}} is the answer (or the default).",
    },
    "LlmNode": {
        None: "One LLM call with an optional bounded tool loop, in a fresh context.",
        "prompt": "The user message; templated, strict (required).",
        "instructions": "The system prompt; templated, strict.",
        "tools": "The tools this node may call, and only these: global tools, agent "
        "tools, MCP functions or mcp:<server>. Unset or []: none.",
        "model": "provider:model for this node (default: the graph's model).",
        "temperature": "Sampling temperature (default: the graph's; unset: not sent).",
        "top_p": "Sampling top-p (default: the graph's; unset: not sent).",
        "reasoning_effort": "Reasoning effort for models that take one.",
        "max_attempts": "Attempts on transient errors (timeouts, rate limits, 429, 5xx, "
        "refused connections); default 1.",
        "max_iterations": "Cap on tool-loop turns (default 10).",
        "fallback": "Where to route when the call fails; without it the run continues "
        'to next with {{output}} = "LLM node failed: ...".',
        "timeout": "Wall-clock cap on the node in seconds (unset: none).",
        "output_schema": "A JSON Schema: a hint is added to the prompt, the reply is "
        "parsed (or extracted) as JSON, an object's keys merge into state.",
        "state_updates": "Map of state key -> template; {{output}} is the reply text (or "
        "the parsed value with output_schema).",
        "skills_enabled": "Loki's skills: offers the node skill__list, skill__load, "
        "skill__unload (default: the graph's).",
        "enabled_skills": "Loki's skills: the skills skill__load may load (default: the graph's).",
        "inject_skill_instructions": "Loki's skills (accepted; not implemented).",
        "skill_instructions": "Loki's skills (accepted; not implemented).",
    },
    "RagNode": {
        None: "Hybrid (vector + keyword) retrieval over the node's knowledge base; the "
        "result goes to state through state_updates.",
        "documents": "Knowledge sources: files, folders, URLs, relative to the agent "
        "directory (required).",
        "query": "The retrieval query; templated (default {{initial_prompt}}).",
        "top_k": "How many chunks to retrieve (default: the knowledge base's).",
        "timeout": "Retrieval timeout in seconds (default 120).",
        "embedding_model": "Embedding model for the corpus (used when the knowledge base "
        "is built).",
        "chunk_size": "Chunk size when the knowledge base is built.",
        "chunk_overlap": "Overlap between chunks when the knowledge base is built.",
        "reranker_model": "Reranker applied to the hybrid results.",
        "batch_size": "Embedding-request batch size.",
        "extractor_model": "Loki's graph-RAG extractor (accepted; not implemented).",
        "extractor_prompt": "Loki's graph-RAG prompt (accepted; not implemented).",
        "graph_hops": "Loki's graph-RAG depth (accepted; not implemented).",
        "driver": "Loki's knowledge-base storage driver (accepted; not implemented).",
        "next": "Where to go after retrieval (required).",
        "state_updates": "Where the result goes: {{output.context}} (the text block) and "
        "{{output.sources}} (the source list).",
    },
    "EndNode": {
        None: "Ends the run; its output is the run's result.",
        "output": "The final result; templated against the state after state_updates.",
        "status": 'graphrun extension: "failed" ends the run as failed with output as '
        'the error (default "completed").',
        "next": "Ignored: an end node ends the run.",
        "state_updates": "Last state changes (lenient; no scoped variables).",
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
    "MapNode": {
        None: "Runs the `branch` node once per item of a list, concurrently, and collects "
        "the results in input order.",
        "over": "Exactly one {{path}} that resolves to a JSON array (required).",
        "as": "The state key each item is put under inside its branch (required).",
        "branch": "The id of the llm, agent, rag or script node run per item (required).",
        "collect_into": "The state key that receives the list of results (required).",
        "output_key": "Which key of a branch's result is collected (default output).",
        "max_concurrency": "How many items run at once (default: settings.max_concurrency).",
        "next": "Where to go once every item is done (required).",
    },
    "Variable": {
        None: "An agent variable.",
        "name": "The variable's name; scripts and tools see LLM_AGENT_VAR_<NAME>.",
        "description": "What the variable is for (shown when it is asked for).",
        "default": "The value used when none is given.",
    },
}


def _describe(defs: dict[str, Any]) -> None:
    """Put the descriptions of :data:`_DESCRIPTIONS` into the schema's definitions."""
    from graphrun.runtime.graph.model import NODE_TYPES

    node_defs = {cls.__name__: cls for cls in NODE_TYPES.values()}
    for name, definition in defs.items():
        kind = node_defs.get(name)
        table = _DESCRIPTIONS.get(name) or (kind.DESCRIPTIONS if kind is not None else {})
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
    # Node kinds defined in their own modules (not in the Node union) join the defs.
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
