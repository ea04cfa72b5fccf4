"""Validation of what templates read against what the graph can write.

A template's first path segment (``{{category}}``, ``{{items[0].name}}``) must be a
key some part of the graph declares: ``initial_state``, a node's ``state_updates``,
an llm or agent node's ``output_schema`` properties, a map's ``collect_into``, a
reducer, ``initial_prompt`` and ``_error``, or the field's own scoped variable
(``output``, ``choice``, ``input``, a map item's ``as``). Only the fields rendered
strictly are checked (a missing key there fails the run); ``state_updates`` render
leniently.

A near miss of a declared key (a typo, most likely) is an error with a "did you
mean"; a key nothing declares is only advice from ``validate`` (``run --set`` may
give it). A script's JSON output can set any key, so after a script (on the node's
static path) only a close near miss is reported, as a warning (declaring the key in
the script's ``state_updates`` silences it). Registered with
:func:`graphrun.runtime.graph.check.register_rule`.
"""

from __future__ import annotations

import difflib

from graphrun.runtime.graph.check import Check, advice, register_rule
from graphrun.runtime.graph.check import node_path as _npath
from graphrun.runtime.graph.loader import Diagnostic
from graphrun.runtime.graph.model import static_edges
from graphrun.runtime.graph.templates import expressions, parse_path

#: Keys every run has.
BUILTIN_KEYS = ("initial_prompt", "_error")


def declared_keys(c: Check) -> set[str]:
    """Every state key the graph says something writes."""
    graph = c.graph
    keys = set(BUILTIN_KEYS) | set(graph.initial_state) | set(c.loaded.seed_state)
    keys |= set(graph.reducers)
    for _, node in c.nodes():
        keys |= set(node.state_updates) | node.result_keys()
        item = node.per_item()
        if item is not None:
            keys.add(item.collect_into)
    return keys


def _after_scripts(c: Check) -> set[str]:
    """The nodes a script (or tool) node can run before (on static edges), their
    successors onward: their templates may read keys its JSON result set."""
    succ: dict[str, list[str]] = {nid: [t for _, t in static_edges(n)] for nid, n in c.nodes()}
    seen: set[str] = set()
    todo = [t for nid, n in c.nodes() if type(n).MERGES_ANY_KEY for t in succ[nid]]
    while todo:
        nid = todo.pop()
        if nid in seen or nid not in succ:
            continue
        seen.add(nid)
        todo.extend(succ[nid])
    return seen


def _unknown_keys(c: Check, *, near_misses: bool) -> list[Diagnostic]:
    """Template keys the graph declares nowhere: the near misses of a declared key
    (``near_misses``), or the others."""
    if c.loaded.path.name == "config.yaml":
        return []  # an LLM-loop agent's instructions render its variables, not state
    known = declared_keys(c)
    after_scripts = _after_scripts(c)
    item_names = {i.node: i.item for _, n in c.nodes() if (i := n.per_item()) is not None}
    out: list[Diagnostic] = []
    for nid, node in c.nodes():
        scoped = {item_names[nid]} if nid in item_names else set()
        for fname, value in node.strict_fields():
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
                cutoff = 0.8 if maybe_script else 0.6
                near = difflib.get_close_matches(root, sorted(known | scoped), 1, cutoff)
                if bool(near) != near_misses or (maybe_script and not near):
                    continue
                if near:
                    severity = "warning" if maybe_script else "error"
                    hint = f"did you mean '{near[0]}'?"
                else:
                    severity = "warning"
                    hint = (
                        f"fine if `run --set {root}=...` gives it; else declare it: "
                        f"`initial_state: {{{root}: ...}}`, or in the `state_updates` of the "
                        "node that writes it"
                    )
                why = (
                    "unless a script's JSON output sets it"
                    if maybe_script
                    else "no node, initial_state or reducer writes it"
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


@register_rule
def template_keys_declared(c: Check) -> list[Diagnostic]:
    """A template key that is a near miss of a declared key: an error (a warning
    where a script may have set it)."""
    return _unknown_keys(c, near_misses=True)


@advice
def template_keys_undeclared(c: Check) -> list[Diagnostic]:
    """A template key nothing declares (``--set`` may give it): ``validate`` says so."""
    return _unknown_keys(c, near_misses=False)
