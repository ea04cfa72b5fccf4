"""Validation of what templates read against what the graph can write.

A template's first path segment (``{{category}}``, ``{{items[0].name}}``) must be a
key some part of the graph declares: ``initial_state``, a node's ``state_updates``,
an llm or agent node's ``output_schema`` properties, a map's ``collect_into``, a
reducer, ``initial_prompt`` and ``_error``, or the field's own scoped variable
(``output``, ``choice``, ``input``, a map item's ``as``). Only the fields rendered
strictly are checked (a missing key there fails the run); ``state_updates`` render
leniently.

A script's JSON output can set any key, so where a script runs before the node
(on its static path) only a near miss of a declared key is reported, as a warning
(declaring the key in the script's ``state_updates`` silences it); elsewhere an
unknown key is an error, with a "did you mean" when a declared key is close. Registered with
:func:`graphrun.runtime.graph.validate.register_rule`.
"""

from __future__ import annotations

import difflib

from graphrun.runtime.graph.loader import Diagnostic
from graphrun.runtime.graph.model import (
    AgentNode,
    ApprovalNode,
    EndNode,
    InputNode,
    LlmNode,
    MapNode,
    NodeBase,
    RagNode,
    ScriptNode,
    static_edges,
)
from graphrun.runtime.graph.templates import expressions, parse_path
from graphrun.runtime.graph.validate import Check, _did_you_mean, _npath, register_rule

#: Keys every run has.
BUILTIN_KEYS = ("initial_prompt", "_error")


def declared_keys(c: Check) -> set[str]:
    """Every state key the graph says something writes."""
    graph = c.graph
    keys = set(BUILTIN_KEYS) | set(graph.initial_state) | set(c.loaded.seed_state)
    keys |= set(graph.reducers)
    for _, node in c.nodes():
        keys |= set(node.state_updates)
        schema = getattr(node, "output_schema", None)
        if isinstance(node, LlmNode | AgentNode) and isinstance(schema, dict):
            props = schema.get("properties")
            if isinstance(props, dict):
                keys |= {str(k) for k in props}
        if isinstance(node, MapNode):
            keys.add(node.collect_into)
    return keys


def _strict_fields(node: NodeBase) -> list[tuple[str, object]]:
    match node:
        case LlmNode():
            return [("prompt", node.prompt), ("instructions", node.instructions)]
        case AgentNode():
            return [("prompt", node.prompt)]
        case RagNode():
            return [("query", node.query)]
        case ApprovalNode():
            return [("question", node.question)]
        case InputNode():
            return [("question", node.question)]
        case EndNode():
            return [("output", node.output)]
        case MapNode():
            return [("over", node.over)]
    return []


def _after_scripts(c: Check) -> set[str]:
    """The nodes a script node can run before (on static edges), scripts' successors
    onward: their templates may read keys a script's JSON output set."""
    succ: dict[str, list[str]] = {nid: [t for _, t in static_edges(n)] for nid, n in c.nodes()}
    seen: set[str] = set()
    todo = [t for nid, n in c.nodes() if isinstance(n, ScriptNode) for t in succ[nid]]
    while todo:
        nid = todo.pop()
        if nid in seen or nid not in succ:
            continue
        seen.add(nid)
        todo.extend(succ[nid])
    return seen


@register_rule
def template_keys_declared(c: Check) -> list[Diagnostic]:
    """``{{key}}`` in a strictly rendered field names a key the graph can write."""
    known = declared_keys(c)
    after_scripts = _after_scripts(c)
    item_names = {n.branch: n.as_ for _, n in c.nodes() if isinstance(n, MapNode)}
    out: list[Diagnostic] = []
    for nid, node in c.nodes():
        scoped = {item_names[nid]} if nid in item_names else set()
        for fname, value in _strict_fields(node):
            if not isinstance(value, str):
                continue
            for expr in expressions(value):
                try:
                    root = parse_path(expr.strip())[0]
                except ValueError:
                    continue  # the template rule reports a malformed path
                if not isinstance(root, str) or root in known or root in scoped:
                    continue
                maybe_script = nid in after_scripts
                if maybe_script:
                    # A script may well set it: only a near miss of a declared key
                    # (a typo, most likely) is worth a warning.
                    near = difflib.get_close_matches(root, sorted(known | scoped), 1, 0.8)
                    if not near:
                        continue
                    close: str | None = f"did you mean '{near[0]}'?"
                else:
                    close = _did_you_mean(root, sorted(known | scoped))
                severity = "warning" if maybe_script else "error"
                why = (
                    "unless a script's JSON output sets it"
                    if maybe_script
                    else "no node, initial_state or reducer writes it"
                )
                hint = close or (
                    f"declare it: `initial_state: {{{root}: ...}}`, or in the "
                    f"`state_updates` of the node that writes it"
                )
                out.append(
                    c.diag(
                        severity,
                        "template-unknown-key",
                        f"node '{nid}': {{{{{expr.strip()}}}}} in {nid}.{fname}: '{root}' is not "
                        f"a state key the graph declares ({why})",
                        _npath(nid, fname),
                        node=nid,
                        hint=hint,
                    )
                )
    return out
