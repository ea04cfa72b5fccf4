"""The semantic validator: every rule of the spec's Validation section, one function each.

Each rule takes a :class:`Check` (the loaded graph plus where to look things up)
and returns :class:`Diagnostic` s. :func:`validate` runs them all; errors stop a
run, warnings are printed and the run continues.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graphrun.runtime.graph import check as registered
from graphrun.runtime.graph import effect_rules, parallel_rules, state_rules
from graphrun.runtime.graph.check import Check, Rule
from graphrun.runtime.graph.check import did_you_mean as _did_you_mean
from graphrun.runtime.graph.check import node_path as _npath
from graphrun.runtime.graph.loader import Diagnostic, LoadedGraph
from graphrun.runtime.graph.model import static_edges

#: The rule modules beside this one (their rules register as they are imported).
RULE_MODULES = (effect_rules, parallel_rules, state_rules)


#: This module's own rules (the rule modules beside it register theirs in
#: :mod:`graphrun.runtime.graph.check`).
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


#: Advice only ``graphrun validate`` gives (a run does not repeat it every time).
ADVICE: list[Rule] = []


def advice(fn: Rule) -> Rule:
    ADVICE.append(fn)
    return fn


# --- graph-level -------------------------------------------------------------------


@rule
def version_is_1_0(c: Check) -> list[Diagnostic]:
    if c.graph.version != "1.0":
        return [
            c.diag(
                "error",
                "version",
                f'unsupported graph schema version "{c.graph.version}"',
                "$.version",
                hint='only "1.0" is accepted',
            )
        ]
    return []


@rule
def ids_match_keys(c: Check) -> list[Diagnostic]:
    return [
        c.diag(
            "error",
            "id-mismatch",
            f"node id '{node.id}' does not match its key '{key}'",
            _npath(key, "id"),
            node=key,
            hint=f"set id: {key} or leave id out",
        )
        for key, node in c.nodes()
        if node.id is not None and node.id != key
    ]


@rule
def start_exists(c: Check) -> list[Diagnostic]:
    if c.graph.start not in c.graph.nodes:
        return [
            c.diag(
                "error",
                "start",
                f"start node '{c.graph.start}' does not exist",
                "$.start",
                hint=_did_you_mean(c.graph.start, list(c.graph.nodes)),
            )
        ]
    return []


@rule
def edge_targets_exist(c: Check) -> list[Diagnostic]:
    out = []
    for node_id, node in c.nodes():
        for field_name, target in static_edges(node):
            if target not in c.graph.nodes:
                out.append(
                    c.diag(
                        "error",
                        "unknown-target",
                        f"node '{node_id}': {field_name} points to unknown node '{target}'",
                        _npath(node_id, *field_name.split(".", 1)),
                        node=node_id,
                        hint=_did_you_mean(target, list(c.graph.nodes)),
                    )
                )
    return out


@rule
def no_static_cycles(c: Check) -> list[Diagnostic]:
    nodes = c.graph.nodes
    adjacency = {
        nid: [(f, t) for f, t in static_edges(n) if t in nodes] for nid, n in nodes.items()
    }
    color: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    seen_cycles: set[frozenset[str]] = set()

    def visit(nid: str) -> None:
        color[nid] = 1
        stack.append(nid)
        for _f, target in adjacency[nid]:
            if color.get(target, 0) == 0:
                visit(target)
            elif color[target] == 1:
                cycle = [*stack[stack.index(target) :], target]
                key = frozenset(cycle)
                if key not in seen_cycles:
                    seen_cycles.add(key)
                    found.append(cycle)
        stack.pop()
        color[nid] = 2

    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * len(nodes) + 100))
    try:
        for nid in nodes:
            if color.get(nid, 0) == 0:
                visit(nid)
    finally:
        sys.setrecursionlimit(limit)
    return [
        c.diag(
            "error",
            "static-cycle",
            f"cycle in static edges: {' -> '.join(cycle)}",
            _npath(cycle[-2]),
            node=cycle[-2],
            hint="static cycles are always errors; loop with a script's _next instead",
        )
        for cycle in found
    ]


@rule
def has_end_node(c: Check) -> list[Diagnostic]:
    if not any(type(n).ENDS_RUN for _, n in c.nodes()):
        return [
            c.diag(
                "error",
                "no-end",
                "the graph has no end node, so it could never finish",
                "$.nodes",
                hint="add a node with type: end",
            )
        ]
    return []


def map_branches(c: Check) -> set[str]:
    """The nodes a map runs per item (their own routing is never used)."""
    return {item.node for _, n in c.nodes() if (item := n.per_item()) is not None}


def _reachable(c: Check) -> set[str]:
    nodes = c.graph.nodes
    seen: set[str] = set()
    todo = [c.graph.start] if c.graph.start in nodes else []
    while todo:
        nid = todo.pop()
        if nid in seen:
            continue
        seen.add(nid)
        todo.extend(t for _f, t in static_edges(nodes[nid]) if t in nodes)
    return seen


@rule
def unreachable_nodes(c: Check) -> list[Diagnostic]:
    if c.graph.start not in c.graph.nodes:
        return []
    reachable = _reachable(c)
    missing = [nid for nid in c.graph.nodes if nid not in reachable]
    if not missing:
        return []
    # One warning per graph: a graph routed by scripts (_next) has many such nodes.
    if len(missing) == 1:
        what = f"node '{missing[0]}' is"
    else:
        what = "nodes " + ", ".join(f"'{nid}'" for nid in missing) + " are"
    return [
        c.diag(
            "warning",
            "unreachable",
            f"{what} unreachable from '{c.graph.start}' via static edges",
            _npath(missing[0]),
            node=missing[0],
            hint="fine if a script routes there with _next",
        )
    ]


@rule
def end_reachable(c: Check) -> list[Diagnostic]:
    if c.graph.start not in c.graph.nodes:
        return []
    if not any(type(c.graph.nodes[n]).ENDS_RUN for n in _reachable(c)):
        return [
            c.diag(
                "warning",
                "no-reachable-end",
                f"no end node is reachable from '{c.graph.start}' via static edges",
                "$.start",
                hint="fine if a script routes there with _next",
            )
        ]
    return []


@rule
def next_where_required(c: Check) -> list[Diagnostic]:
    """agent, rag, input and llm nodes route via ``next``; without it the run fails there."""
    reachable = _reachable(c) if c.graph.start in c.graph.nodes else set()
    # A map's branch node runs once per item; its own routing is never used.
    branches = map_branches(c)
    out = []
    for nid, node in c.nodes():
        needs_next = type(node).NEEDS_NEXT
        routes = getattr(node, "routes", None)
        if isinstance(routes, list) and any(r.when == "default" for r in routes):
            needs_next = False  # a `when: default` route always leads on
        if needs_next and not node.next and nid in reachable and nid not in branches:
            out.append(
                c.diag(
                    "warning",
                    "missing-next",
                    f"{node.type} node '{nid}' has no next; the run fails when it gets there",
                    _npath(nid),
                    node=nid,
                )
            )
    return out


@advice
def unhandled_failure_flow(c: Check) -> list[Diagnostic]:
    """An llm or script node without ``fallback`` routes its failure on to ``next``
    (Loki's rule); the run then ends ``completed_with_errors`` (or fails, with
    ``settings.on_unhandled_failure: fail``). Say so where it can happen."""
    from graphrun.runtime.graph.routing import failure_handled as handled

    policy = c.graph.settings.on_unhandled_failure
    if policy == "continue" or c.graph.start not in c.graph.nodes:
        return []
    reachable = _reachable(c)
    branches = map_branches(c)
    ends = "fails the run" if policy == "fail" else "ends the run completed_with_errors (exit 4)"
    out = []
    for nid, node in c.nodes():
        if not type(node).FAILURE_FLOWS_ON or nid not in reachable:
            continue
        if nid in branches or not node.targets or handled(node, getattr(node, "fallback", None)):
            continue
        if any(e.default for e in getattr(node, "on_error", None) or ()):
            continue
        where = ", ".join(f"'{t}'" for t in node.targets)
        out.append(
            c.diag(
                "warning",
                "unhandled-failure",
                f"node '{nid}': a failure of this {node.type} node routes on to {where} "
                f"unhandled (no fallback or on_error default); it {ends}",
                _npath(nid),
                node=nid,
                hint="add `fallback: <node>` (or an `on_error` route) to handle it, or set "
                "settings.on_unhandled_failure: continue (Loki's plain completed)",
            )
        )
    return out


@rule
def node_kind_rules(c: Check) -> list[Diagnostic]:
    """The rules a node kind declares in its own module (``NodeBase.rules``), and the
    ``if``/``unless`` every node may have."""
    from graphrun.runtime.graph.routing import skip_rules

    out: list[Diagnostic] = []
    for nid, node in c.nodes():
        out.extend(node.rules(nid, c))
        out.extend(skip_rules(node, nid, c))
    return out


# --- approvals, templates ------------------------------------------------------------


@rule
def approvals_quorum(c: Check) -> list[Diagnostic]:
    """``approvals: {required: N, of: [...]}`` asks for a number of signers it can get."""
    out = []
    for nid, node in c.nodes():
        approvals = getattr(node, "approvals", None)
        if approvals is None:
            continue
        distinct = list(dict.fromkeys(approvals.of))
        if len(distinct) != len(approvals.of):
            out.append(
                c.diag(
                    "error",
                    "approvals-duplicate",
                    f"approval '{nid}': approvals.of names a signer twice",
                    _npath(nid, "approvals", "of"),
                    node=nid,
                )
            )
        if not 1 <= approvals.required <= len(distinct):
            out.append(
                c.diag(
                    "error",
                    "approvals-required",
                    f"approval '{nid}': approvals.required is {approvals.required}, but "
                    f"approvals.of names {len(distinct)} signer(s)",
                    _npath(nid, "approvals", "required"),
                    node=nid,
                    hint="required must be between 1 and the number of signers in `of`",
                )
            )
        listed = getattr(node, "approvers", None)
        outside = [p for p in distinct if listed and p not in listed]
        if outside:
            out.append(
                c.diag(
                    "error",
                    "approvals-not-approver",
                    f"approval '{nid}': approvals.of names {outside[0]!r}, who is not "
                    "among its approvers",
                    _npath(nid, "approvals", "of"),
                    node=nid,
                )
            )
    return out


@rule
def templates_terminated(c: Check) -> list[Diagnostic]:
    """Every ``{{`` in a node's text is closed by ``}}``."""
    import msgspec

    from graphrun.runtime.graph.templates import unterminated

    out = []

    def walk(nid: str, path: str, value: Any) -> None:
        if isinstance(value, str):
            at = unterminated(value)
            if at is not None:
                shown = value[at : at + 30].splitlines()[0]
                out.append(
                    c.diag(
                        "error",
                        "template-unterminated",
                        f"unterminated template: {shown!r} has no closing '}}}}'",
                        path,
                        node=nid,
                        hint="close it with }}, e.g. {{key}}",
                    )
                )
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(nid, f"{path}[{i}]", item)
        elif isinstance(value, dict):
            from graphrun.runtime.graph.loader import _child

            for key, item in value.items():
                walk(nid, _child(path, key), item)

    for nid, node in c.nodes():
        fields = msgspec.to_builtins(node)
        if not isinstance(fields, dict):
            continue
        for name, value in fields.items():
            if name not in ("output_schema", "type", "id"):
                walk(nid, _npath(nid, name), value)
    return out


# --- agent directory, output schemas -------------------------------------------------


@rule
def agent_dir_files(c: Check) -> list[Diagnostic]:
    d = c.loaded.agent_dir
    if c.loaded.path.name == "graph.yaml" and (d / "config.yaml").exists():
        return [
            c.diag(
                "error",
                "graph-and-config",
                f"{d} has both graph.yaml and config.yaml",
                "$",
                hint="an agent is either a graph agent (graph.yaml) or an LLM-loop agent "
                "(config.yaml): remove one",
            )
        ]
    return []


@rule
def output_schemas_valid(c: Check) -> list[Diagnostic]:
    out = []
    for nid, node in c.nodes():
        schema = getattr(node, "output_schema", None)
        if schema is None:
            continue
        import jsonschema

        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            out.append(
                c.diag(
                    "error",
                    "output-schema",
                    f"node '{nid}': output_schema is not a valid JSON Schema: {exc.message}",
                    _npath(nid, "output_schema"),
                    node=nid,
                )
            )
    return out


def validate(check: Check, *, with_advice: bool = False) -> list[Diagnostic]:
    """Run every rule (and with ``with_advice``, the advice ``validate`` gives);
    errors first, each group in file order."""
    found: list[Diagnostic] = list(check.loaded.warnings)
    rules = RULES + registered.RULES
    for fn in rules + (ADVICE + registered.ADVICE if with_advice else []):
        if not check.deep and getattr(fn, "deep", False):
            continue
        found.extend(fn(check))
    return sorted(found, key=lambda d: (d.severity != "error", d.line or 0, d.rule))


# Rules that stubbing a broken node (see validate_all) could trip for no real reason.
_STUB_SENSITIVE = {"unreachable", "no-reachable-end", "static-cycle", "no-end"}


def validate_all(
    target: Path, *, agents_dir: Path | None, config_dir: Path | None
) -> list[Diagnostic]:
    """Every error of every phase of an agent at once: YAML and schema errors and,
    on what parses, the semantic and configuration rules too (``graphrun validate``).

    When the graph has structural errors, each node that has one is replaced by a
    stub ``end`` node and each broken top-level field is dropped, so the rules still
    run on the rest; their findings about the stubs are left out.
    """
    from graphrun.runtime.agents import load_agent
    from graphrun.runtime.errors import GraphValidationError

    try:
        loaded = load_agent(target, config_dir=config_dir)
    except GraphValidationError as exc:
        first = list(exc.diagnostics)
        return _sorted(first + _salvaged(target, first, agents_dir, config_dir))
    return validate(Check(loaded, agents_dir=agents_dir, config_dir=config_dir), with_advice=True)


def _sorted(found: list[Diagnostic]) -> list[Diagnostic]:
    unique = list(dict.fromkeys(found))  # ties keep their order: the loader's first
    return sorted(unique, key=lambda d: (d.severity != "error", d.line or 0))


#: Required text fields a node missing them can be checked without (empty text).
_FILLABLE_TEXT = ("prompt", "question", "output", "query")


def _filled(node_id: str, nodes: dict[str, Any], errors: list[Diagnostic]) -> Any:
    """The node with its missing required fields filled in, when that is all that is
    wrong with it (so the rest of it is still checked), else None."""
    raw = nodes.get(node_id)
    if not isinstance(raw, dict):
        return None
    filled = dict(raw)
    for d in errors:
        if d.severity != "error":
            continue  # a warning (an unknown field) does not stop the node's checks
        if d.rule != "missing-field":
            return None
        name = d.message.rpartition("required field '")[2].rstrip("'")
        if name in _FILLABLE_TEXT:
            filled[name] = ""
        elif name == "on_other":
            target = raw.get("next")
            if not (isinstance(target, str) and target in nodes):
                target = next((n for n, v in nodes.items() if n != node_id), None)
            if target is None:
                return None
            filled[name] = target
        else:
            return None
    return filled


def _salvaged(
    target: Path, first: list[Diagnostic], agents_dir: Path | None, config_dir: Path | None
) -> list[Diagnostic]:
    from graphrun.runtime.graph.loader import find_graph_file, parse_yaml, structure

    try:
        path = find_graph_file(target)
        text = path.read_text(encoding="utf-8")
    except Exception:
        return []
    data, lines, problems = parse_yaml(text, str(path))
    if not isinstance(data, dict) or any(p.severity == "error" for p in problems):
        return []  # nothing to salvage from YAML that does not parse
    data = dict(data)
    nodes = dict(data.get("nodes") or {}) if isinstance(data.get("nodes"), dict) else {}
    stubs = {d.node for d in first if d.node is not None and d.node in nodes}
    for node_id in sorted(stubs):
        filled = _filled(node_id, nodes, [d for d in first if d.node == node_id])
        if filled is not None:
            nodes[node_id] = filled  # its other rules still run
            stubs.discard(node_id)
            continue
        nodes[node_id] = {"type": "end"}
    data["nodes"] = nodes
    for d in first:
        if d.node is None and d.path and d.path.count(".") == 1 and d.path != "$.nodes":
            data.pop(d.path[2:], None)  # a broken top-level field
    data.setdefault("name", path.parent.name)
    data.setdefault("version", "1.0")
    if "start" not in data and nodes:
        data["start"] = next(iter(nodes))
    if "model" not in data:
        from graphrun.runtime.agents import default_model

        model = default_model(path.parent.name, config_dir)
        if model:
            data["model"] = model
    graph, _more = structure(data, lines, str(path))
    if graph is None:
        return []
    loaded = LoadedGraph(graph, text, path, path.parent, lines)
    found = validate(Check(loaded, agents_dir=agents_dir, config_dir=config_dir), with_advice=True)
    return [d for d in found if d.node not in stubs and not (stubs and d.rule in _STUB_SENSITIVE)]
