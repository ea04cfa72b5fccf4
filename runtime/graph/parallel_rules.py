"""Validation rules of the parallel format: fan-out groups, reducers, the map contract.

A *parallel group* is the entries of one node's ``next`` list when it has two or
more. Only immediate successors count (no transitive analysis), as in Loki; the
runtime single-writer rule catches what the validator cannot see. Registered with
:func:`graphrun.runtime.graph.check.register_rule`.
"""

from __future__ import annotations

import re
from collections import deque

from graphrun.runtime.graph.check import Check, register_rule
from graphrun.runtime.graph.check import node_path as _npath
from graphrun.runtime.graph.loader import Diagnostic
from graphrun.runtime.graph.model import NodeBase, static_edges
from graphrun.runtime.graph.routing import expression_reads, skip_conditions
from graphrun.runtime.graph.templates import expressions

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
    return set(node.state_updates) | node.result_keys()


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
    scoped = type(node).SCOPED
    roots: set[str] = node.reads() | expression_reads(skip_conditions(node))
    for value in node.template_fields():
        roots |= _roots(value)
    updates: set[str] = set()
    for key, value in node.state_updates.items():
        found = _roots(value)
        if type(node).UPDATES_DECLARE_WRITES:
            # `meta: "{{meta}}"` declares that the script writes `meta`: its own
            # output is merged before its state_updates render, so that is no read
            # of the snapshot.
            found.discard(key)
        updates |= found
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
            if type(node).HUMAN:
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
            if type(node).UPDATES_DECLARE_WRITES and not declared:
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


#: Loki fields graphrun accepts but does not act on (warned once each).
_NOT_IMPLEMENTED = {
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
