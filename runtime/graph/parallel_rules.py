"""Validation rules of the parallel format: fan-out groups, reducers, the map contract.

A *parallel group* is the entries of one node's ``next`` list when it has two or
more. Only immediate successors count (no transitive analysis), as in Loki; the
runtime single-writer rule catches what the validator cannot see. Registered with
:func:`graphrun.runtime.graph.validate.register_rule`.
"""

from __future__ import annotations

import re
from collections import deque

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
from graphrun.runtime.graph.routing import expression_reads, skip_conditions
from graphrun.runtime.graph.templates import expressions
from graphrun.runtime.graph.validate import Check, _npath, register_rule

_ROOT = re.compile(r"^([^.\[]+)")
_LOKI_TOOLS = re.compile(r"\b(user|agent|todo|skill)__[a-z_]+\b")


def groups(c: Check) -> list[tuple[str, list[str]]]:
    """``(fanning node, members)`` for every ``next`` list of two or more entries."""
    out = []
    for nid, node in c.nodes():
        members = [t for t in node.targets if t in c.graph.nodes]
        if isinstance(node.next, list) and len(node.targets) >= 2:
            out.append((nid, sorted(set(members))))
    return out


def write_set(node: NodeBase) -> set[str]:
    keys = set(node.state_updates)
    schema = getattr(node, "output_schema", None)
    if isinstance(node, LlmNode | AgentNode) and isinstance(schema, dict):
        props = schema.get("properties")
        if isinstance(props, dict):
            keys.update(props)
    return keys


def _roots(template: object) -> set[str]:
    if not isinstance(template, str):
        return set()
    roots = set()
    for expr in expressions(template):
        m = _ROOT.match(expr.strip())
        if m:
            roots.add(m.group(1))
    return roots


def read_set(node: NodeBase) -> set[str]:
    fields: list[object] = []
    scoped = ""
    match node:
        case LlmNode():
            fields = [node.prompt, node.instructions]
            scoped = "output"
        case AgentNode():
            fields = [node.prompt]
            scoped = "output"
        case RagNode():
            fields = [node.query]
            scoped = "output"
        case ApprovalNode():
            fields = [node.question]
            scoped = "choice"
        case InputNode():
            fields = [node.question, node.default]
            scoped = "input"
        case EndNode():
            fields = [node.output]
        case MapNode():
            fields = [node.over]
    roots: set[str] = node.reads() | expression_reads(skip_conditions(node))
    for value in fields:
        roots |= _roots(value)
    updates: set[str] = set()
    for key, value in node.state_updates.items():
        roots = _roots(value)
        if isinstance(node, ScriptNode):
            # `meta: "{{meta}}"` declares that the script writes `meta`: its own
            # output is merged before its state_updates render, so that is no read
            # of the snapshot.
            roots.discard(key)
        updates |= roots
    updates.discard(scoped)
    return roots | updates


@register_rule
def max_concurrency_positive(c: Check) -> list[Diagnostic]:
    out = []
    if c.graph.settings.max_concurrency < 1:
        out.append(
            c.diag(
                "error",
                "max-concurrency",
                f"settings.max_concurrency must be >= 1 (got "
                f"{c.graph.settings.max_concurrency}): no branch could ever run",
                "$.settings.max_concurrency",
            )
        )
    for nid, node in c.nodes():
        cap = node.max_concurrency if isinstance(node, MapNode) else None
        if cap is not None and cap < 1:
            out.append(
                c.diag(
                    "error",
                    "max-concurrency",
                    f"map node '{nid}': max_concurrency must be >= 1 (got {cap})",
                    _npath(nid, "max_concurrency"),
                    node=nid,
                )
            )
    return out


@register_rule
def fan_out_groups(c: Check) -> list[Diagnostic]:
    """People cannot answer in parallel; scripts declare writes; shared keys reduce;
    no branch reads what a sibling writes."""
    out: list[Diagnostic] = []
    nodes = c.graph.nodes
    reducers = c.graph.reducers
    for fan, members in groups(c):
        for member in members:
            node = nodes[member]
            if isinstance(node, ApprovalNode | InputNode):
                out.append(
                    c.diag(
                        "error",
                        "fan-out-human",
                        f"{node.type} node '{member}' is an immediate target of a fan-out "
                        f"(node '{fan}'): it must run after the join",
                        _npath(member),
                        node=member,
                        hint="route the branches to a join node, then ask",
                    )
                )
            declared = _npath(member, "state_updates") in c.loaded.lines
            if isinstance(node, ScriptNode) and not declared:
                out.append(
                    c.diag(
                        "error",
                        "fan-out-script-writes",
                        f"script node '{member}' is in a parallel branch (fan-out of "
                        f"'{fan}') but declares no `state_updates`",
                        _npath(member),
                        node=member,
                        hint="declare the keys its JSON output sets, e.g. "
                        '`state_updates: {meta: "{{meta}}"}` (or `state_updates: {}` when it '
                        "sets none), so the writes of the step can be checked",
                    )
                )
        writers: dict[str, list[str]] = {}
        for member in members:
            for key in write_set(nodes[member]):
                writers.setdefault(key, []).append(member)
        for key in sorted(writers):
            names = sorted(writers[key])
            if len(names) >= 2 and key not in reducers:
                out.append(
                    c.diag(
                        "error",
                        "fan-out-single-writer",
                        f"nodes [{', '.join(names)}] all write key '{key}' in the same "
                        f"parallel super-step (fan-out of '{fan}') and no reducer is declared",
                        "$.reducers" if "$.reducers" in c.loaded.lines else _npath(fan, "next"),
                        hint=f"add `reducers: {{{key}: append}}` (or extend, concat, sum, "
                        "max, min, merge, overwrite), or write different keys",
                    )
                )
        for a in members:
            reads = read_set(nodes[a])
            for b in members:
                if a == b:
                    continue
                shared = sorted(reads & write_set(nodes[b]))
                if shared:
                    out.append(
                        c.diag(
                            "error",
                            "fan-out-read-hazard",
                            f"node '{a}' reads state key(s) {', '.join(f'`{k}`' for k in shared)} "
                            f"which sibling parallel branch '{b}' writes; branches see only the "
                            "snapshot taken BEFORE the super-step",
                            _npath(a),
                            node=a,
                            hint="read it after the join",
                        )
                    )
    return out


@register_rule
def uneven_joins(c: Check) -> list[Diagnostic]:
    """A join reached by branch paths of unequal length runs once per arrival (Loki's
    super-step rule): warn, since that is rarely what the author meant."""
    out: list[Diagnostic] = []
    nodes = c.graph.nodes
    for fan, members in groups(c):
        distance: dict[str, dict[str, int]] = {}
        for member in members:
            seen = {member: 0}
            todo = deque([member])
            while todo:
                nid = todo.popleft()
                if seen[nid] > 50:
                    continue
                for _f, target in static_edges(nodes[nid]):
                    if target in nodes and target not in seen:
                        seen[target] = seen[nid] + 1
                        todo.append(target)
            for target, d in seen.items():
                if target != member:
                    distance.setdefault(target, {})[member] = d
        reported: set[str] = set()
        for target, by_member in distance.items():
            if len(by_member) >= 2 and len(set(by_member.values())) > 1:
                # Only the first such node on each path: later ones follow from it.
                if any(t in reported for t in by_member):
                    continue
                reported.add(target)
                lengths = ", ".join(f"{m}: {d}" for m, d in sorted(by_member.items()))
                out.append(
                    c.diag(
                        "warning",
                        "uneven-join",
                        f"node '{target}' is reached from the fan-out of '{fan}' by paths of "
                        f"unequal length ({lengths}): it runs in the super-step after each "
                        "arrival, so more than once",
                        _npath(target),
                        node=target,
                        hint="make the branches equally long, or join them in a script",
                    )
                )
    return out


@register_rule
def map_contract(c: Check) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    nodes = c.graph.nodes
    for nid, node in c.nodes():
        if not isinstance(node, MapNode) or node.branch not in nodes:
            continue
        branch = nodes[node.branch]
        bad = {
            "approval": "an approval node cannot run inside a parallel map branch",
            "input": "an input node cannot run inside a parallel map branch",
            "end": "map branches end through the map's collect mechanism, not end nodes",
            "map": "nested map fan-outs are not supported",
        }.get(branch.type)
        if bad is not None:
            out.append(
                c.diag(
                    "error",
                    "map-branch",
                    f"map node '{nid}': branch '{node.branch}': {bad}",
                    _npath(nid, "branch"),
                    node=nid,
                )
            )
            continue
        if branch.next is not None:
            out.append(
                c.diag(
                    "error",
                    "map-branch",
                    f"map branch '{node.branch}' has a `next` declared: map branches must be "
                    "atomic (one node, one run per item)",
                    _npath(node.branch, "next"),
                    node=node.branch,
                    hint=f"chain after the map: put it in map node '{nid}''s next",
                )
            )
        for key in sorted(branch.state_updates):
            if key != node.output_key:
                out.append(
                    c.diag(
                        "error",
                        "map-branch",
                        f"map branch '{node.branch}' writes '{key}': map branches may only "
                        f"write through their `output_key` ('{node.output_key}')",
                        _npath(node.branch, "state_updates", key),
                        node=node.branch,
                    )
                )
        schema = getattr(branch, "output_schema", None)
        if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
            props = ", ".join(sorted(schema["properties"]))
            out.append(
                c.diag(
                    "error",
                    "map-branch",
                    f"map branch '{node.branch}' has an `output_schema` with top-level "
                    f"properties ({props}): map branches write only through their `output_key`",
                    _npath(node.branch, "output_schema"),
                    node=node.branch,
                )
            )
    return out


#: Loki fields graphrun accepts but does not act on (warned once each).
_NOT_IMPLEMENTED = {
    "inject_skill_instructions": "skills",
    "skill_instructions": "skills",
    "extractor_model": "graph-based RAG",
    "extractor_prompt": "graph-based RAG",
    "graph_hops": "graph-based RAG",
    "driver": "RAG storage drivers",
}


@register_rule
def accepted_not_implemented(c: Check) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    seen: set[str] = set()
    places: list[tuple[str, object, str]] = [("$", c.graph, "the graph")]
    places += [(_npath(nid), node, f"node '{nid}'") for nid, node in c.nodes()]
    for path, obj, what in places:
        for name, feature in _NOT_IMPLEMENTED.items():
            if name in seen or getattr(obj, name, None) is None:
                continue
            seen.add(name)
            out.append(
                c.diag(
                    "warning",
                    "not-implemented",
                    f"{what}: '{name}' ({feature}) is accepted for Loki compatibility but "
                    "graphrun does not implement it; it has no effect",
                    f"{path}.{name}",
                )
            )
    for nid, node in c.nodes():
        texts = [getattr(node, f, None) for f in ("prompt", "instructions")]
        from graphrun.runtime.graph.builtins import node_tools

        offered = set(node_tools(c.graph, node))
        missing: list[str] = []
        for text in texts:
            if isinstance(text, str):
                for m in _LOKI_TOOLS.finditer(text):
                    if m.group(0) not in offered and m.group(0) not in missing:
                        missing.append(m.group(0))
        if missing:
            names = ", ".join(f"'{name}'" for name in missing)
            out.append(
                c.diag(
                    "warning",
                    "loki-builtin-tool",
                    f"node '{nid}' names Loki's built-in tools {names}, which its `tools:` "
                    "list does not offer (an llm node's `tools:` list is strict)",
                    _npath(nid),
                    node=nid,
                )
            )
    return out


__all__ = ["groups", "read_set", "write_set"]
