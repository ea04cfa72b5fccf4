"""Pictures of a graph: Mermaid, Graphviz DOT, SVG and a self-contained HTML page.

A node's type is its shape; ``next`` (one target or a list: a fan-out), ``routes``,
``on_other`` and ``fallback`` are labelled edges; a ``map`` node has a dotted edge
to its branch (a node id, or an inline node drawn beside it); the targets a
script names in ``_next`` (found in its source, and in a run's path) are dashed, and
so are the edges a node's ``if``/``unless`` skips along (to its ``next``).
Given a run, the path it took is highlighted and each node shows its visit count.

The renderers read the graph model through ``getattr`` with defaults, so they
draw graphs whose nodes have fields they do not know yet.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphrun.eventstore.errors import GraphrunError

FORMATS = ("mermaid", "dot", "svg", "html")


class GraphPictureError(GraphrunError):
    """A picture cannot be made (Graphviz missing, layout failed)."""

    exit_code = 2


@dataclass
class PicNode:
    id: str
    type: str
    visits: int = 0
    inline: bool = False  # an inline map branch, not a node of the graph


@dataclass
class PicEdge:
    src: str
    dst: str
    label: str = ""
    style: str = "solid"  # solid, dashed (_next), dotted (map branch)
    taken: bool = False


@dataclass
class Picture:
    name: str
    start: str
    nodes: list[PicNode] = field(default_factory=list)
    edges: list[PicEdge] = field(default_factory=list)
    run_id: str | None = None
    current: str | None = None  # the node a run is at (or waits at) now, drawn apart


def _targets(value: Any) -> list[str]:
    """``next`` as a list of targets: a string, a list of strings, or nothing."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [str(v) for v in value if v is not None]
    return []


_QUOTED = re.compile(r"""["']([A-Za-z0-9_.\-]+)["']""")


def script_next_targets(source: str, node_ids: Iterable[str]) -> list[str]:
    """Node ids a script names on lines that mention ``_next`` (its dynamic routes)."""
    known = set(node_ids)
    found: list[str] = []
    for line in source.splitlines():
        if "_next" not in line:
            continue
        for name in _QUOTED.findall(line):
            if name in known and name != "_next" and name not in found:
                found.append(name)
    return found


def _join_label(node: Any) -> str:
    """How a fan-out's step is joined, when it says (``, join count 2, 15s``)."""
    join = getattr(node, "join", None)
    kind = getattr(join, "type", None)
    if not isinstance(kind, str):
        return ""
    label = f", join {kind}"
    count = getattr(join, "count", None)
    if kind == "count" and isinstance(count, int):
        label += f" {count}"
    timeout = getattr(join, "timeout", None)
    if isinstance(timeout, int | float):
        label += f" within {timeout:g}s"
    return label


def _skip_label(node: Any) -> str:
    """The label of a node's skip edges (to ``next``): its ``if``/``unless``."""
    parts = []
    if isinstance(getattr(node, "if_", None), str):
        parts.append(f"if {node.if_} is false")
    if isinstance(getattr(node, "unless", None), str):
        parts.append(f"unless {node.unless} is true")
    return "skip: " + " or ".join(parts) if parts else ""


def _node_type(node: Any) -> str:
    kind = getattr(node, "type", None)
    if isinstance(kind, str):
        return kind
    if isinstance(node, dict):
        return str(node.get("type", "?"))
    return type(node).__name__.removesuffix("Node").lower()


def build_picture(
    graph: Any,
    agent_dir: Path | None = None,
    path_taken: list[tuple[str, Any]] | None = None,
) -> Picture:
    """The nodes and edges of a graph; ``path_taken`` is ``[(node, routed_to), ...]``."""
    nodes: dict[str, Any] = dict(getattr(graph, "nodes", {}) or {})
    pic = Picture(name=str(getattr(graph, "name", "")), start=str(getattr(graph, "start", "")))
    for node_id, node in nodes.items():
        pic.nodes.append(PicNode(node_id, _node_type(node)))
    for node_id, node in nodes.items():
        kind = _node_type(node)
        if kind == "approval":
            for option, target in (getattr(node, "routes", None) or {}).items():
                pic.edges.append(PicEdge(node_id, target, str(option)))
            on_other = getattr(node, "on_other", None)
            if on_other:
                pic.edges.append(PicEdge(node_id, on_other, "on_other"))
        else:
            targets = _targets(getattr(node, "next", None))
            fan = "fan-out" + _join_label(node)
            for target in targets:
                pic.edges.append(PicEdge(node_id, target, "" if len(targets) == 1 else fan))
            fallback = getattr(node, "fallback", None)
            if fallback:
                pic.edges.append(PicEdge(node_id, fallback, "fallback"))
            route_edges = getattr(node, "route_edges", None)
            for _field, target, label in route_edges() if route_edges else ():
                pic.edges.append(PicEdge(node_id, target, label))
        skip = _skip_label(node)
        if skip:
            for target in _targets(getattr(node, "next", None)):
                pic.edges.append(PicEdge(node_id, target, skip, style="dashed"))
        if kind == "map":
            branch = getattr(node, "branch", None)
            if isinstance(branch, str):
                pic.edges.append(PicEdge(node_id, branch, "each item", style="dotted"))
            elif branch is not None:
                inline_id = f"{node_id}.branch"
                pic.nodes.append(PicNode(inline_id, _node_type(branch), inline=True))
                pic.edges.append(PicEdge(node_id, inline_id, "each item", style="dotted"))
        if kind == "script" and agent_dir is not None:
            script = getattr(node, "script", None)
            try:
                source = (Path(agent_dir) / str(script)).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError, TypeError):
                source = ""
            static = {e.dst for e in pic.edges if e.src == node_id}
            for target in script_next_targets(source, nodes):
                if target in static:
                    continue
                pic.edges.append(PicEdge(node_id, target, "_next", style="dashed"))
    if path_taken:
        visits: dict[str, int] = {}
        for node_id, _ in path_taken:
            visits[node_id] = visits.get(node_id, 0) + 1
        for n in pic.nodes:
            n.visits = visits.get(n.id, 0)
        taken = {(a, b) for a, targets in path_taken for b in _targets(targets)}
        for edge in pic.edges:
            if (edge.src, edge.dst) in taken:
                edge.taken = True
        known = {(e.src, e.dst) for e in pic.edges}
        for src, dst in sorted(taken - known):
            if dst in nodes:  # a route only the run shows (a script's _next)
                pic.edges.append(PicEdge(src, dst, "_next", style="dashed", taken=True))
    return pic


# --- Mermaid -------------------------------------------------------------------

_MERMAID_SHAPES = {
    "llm": ('("', '")'),
    "script": ('[["', '"]]'),
    "approval": ('{"', '"}'),
    "input": ('[/"', '"/]'),
    "agent": ('{{"', '"}}'),
    "rag": ('[("', '")]'),
    "end": ('(["', '"])'),
    "map": ('[/"', '"\\]'),
}


def _mermaid_text(text: str) -> str:
    """Text safe inside a quoted Mermaid label (entity codes for quotes and brackets)."""
    out = html.escape(text, quote=False)
    return out.replace('"', "#quot;").replace("|", "#124;")


def _label(n: PicNode, with_visits: bool) -> str:
    label = f"{n.id}<br/><i>{n.type}</i>"
    if with_visits:
        label += f"<br/>×{n.visits}" if n.visits else "<br/>not visited"
    return label


def to_mermaid(pic: Picture) -> str:
    """A Mermaid ``flowchart`` of the picture (ids are ``n0``, ``n1``…; labels are the names)."""
    ids = {n.id: f"n{i}" for i, n in enumerate(pic.nodes)}
    with_visits = pic.run_id is not None
    lines = ["flowchart TD"]
    lines.append('  gr_start((" ")):::startNode')
    for n in pic.nodes:
        left, right = _MERMAID_SHAPES.get(n.type, ('["', '"]'))
        text = _mermaid_text(n.id) + "<br/><i>" + _mermaid_text(n.type) + "</i>"
        if with_visits:
            text += f"<br/>×{n.visits}" if n.visits else "<br/>not visited"
        lines.append(f"  {ids[n.id]}{left}{text}{right}")
    edges: list[PicEdge] = []
    if pic.start in ids:
        edges.append(PicEdge("", pic.start, "", taken=with_visits))
    edges.extend(e for e in pic.edges if e.src in ids and e.dst in ids)
    taken_links: list[int] = []
    for index, e in enumerate(edges):
        src = "gr_start" if not e.src else ids[e.src]
        arrow = {"solid": "-->", "dashed": "-.->", "dotted": "-.->"}[e.style]
        label = f'|"{_mermaid_text(e.label)}"|' if e.label else ""
        lines.append(f"  {src} {arrow}{label} {ids[e.dst]}")
        if e.taken:
            taken_links.append(index)
    lines.append("  classDef startNode fill:#333,stroke:#333")
    if with_visits:
        lines.append("  classDef taken fill:#d8f0d8,stroke:#2a7a2a,stroke-width:2px")
        lines.append("  classDef untouched fill:#f4f4f4,stroke:#bbb,color:#999")
        visited = [ids[n.id] for n in pic.nodes if n.visits]
        untouched = [ids[n.id] for n in pic.nodes if not n.visits]
        if visited:
            lines.append(f"  class {','.join(visited)} taken")
        if untouched:
            lines.append(f"  class {','.join(untouched)} untouched")
        if taken_links:
            joined = ",".join(str(i) for i in taken_links)
            lines.append(f"  linkStyle {joined} stroke:#2a7a2a,stroke-width:3px")
    return "\n".join(lines) + "\n"


# --- DOT -------------------------------------------------------------------------

_DOT_SHAPES = {
    "llm": "box",
    "script": "component",
    "approval": "diamond",
    "input": "parallelogram",
    "agent": "hexagon",
    "rag": "cylinder",
    "end": "doublecircle",
    "map": "trapezium",
}


def _dot_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(pic: Picture) -> str:
    """A Graphviz ``digraph`` of the picture."""
    with_visits = pic.run_id is not None
    lines = [
        f"digraph {_dot_str(pic.name or 'graph')} {{",
        "  rankdir=TB;",
        '  node [fontname="Helvetica", fontsize=11, style="rounded,filled", fillcolor="#ffffff"];',
        '  edge [fontname="Helvetica", fontsize=9];',
        '  "__start__" [shape=point, width=0.2, label=""];',
    ]
    for n in pic.nodes:
        label = f"{n.id}\n({n.type})"
        attrs = [f"shape={_DOT_SHAPES.get(n.type, 'box')}"]
        if with_visits:
            label += f"\n×{n.visits}" if n.visits else "\nnot visited"
            if n.id == pic.current:
                attrs.append('fillcolor="#ffe08a", color="#b36b00", penwidth=3')
            elif n.visits:
                attrs.append('fillcolor="#d8f0d8", color="#2a7a2a", penwidth=2')
            else:
                attrs.append('fillcolor="#f4f4f4", color="#bbbbbb", fontcolor="#999999"')
        if n.inline:
            attrs.append('style="rounded,filled,dashed"')
        attrs.insert(0, f"label={_dot_str(label)}")
        lines.append(f"  {_dot_str(n.id)} [{', '.join(attrs)}];")
    ids = {n.id for n in pic.nodes}
    if pic.start in ids:
        extra = ', color="#2a7a2a", penwidth=3' if with_visits else ""
        lines.append(f'  "__start__" -> {_dot_str(pic.start)} [label=""{extra}];')
    for e in pic.edges:
        if e.src not in ids or e.dst not in ids:
            continue
        attrs = [f"label={_dot_str(e.label)}"]
        if e.style != "solid":
            attrs.append(f"style={e.style}")
        if e.taken:
            attrs.append('color="#2a7a2a", penwidth=3')
        lines.append(f"  {_dot_str(e.src)} -> {_dot_str(e.dst)} [{', '.join(attrs)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def dot_to_svg(dot: str) -> str:
    """Lay a DOT graph out as SVG with Graphviz's ``dot`` program.

    Raises:
        GraphPictureError: Graphviz is not installed, or failed.
    """
    exe = shutil.which("dot")
    if exe is None:
        raise GraphPictureError(
            "SVG needs Graphviz's `dot` program, which is not installed",
            hint="install Graphviz (Debian: apt-get install graphviz), "
            "or use --format mermaid / dot",
        )
    try:
        done = subprocess.run(
            [exe, "-Tsvg"], input=dot.encode("utf-8"), capture_output=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GraphPictureError(f"Graphviz failed: {exc}") from None
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GraphPictureError(f"Graphviz failed: {message[0] if message else done.returncode}")
    return done.stdout.decode("utf-8")


def to_html(pic: Picture, svg: str) -> str:
    """A self-contained page with the SVG picture and a legend (no network)."""
    title = html.escape(pic.name or "graph")
    run = f" — run {html.escape(pic.run_id)}" if pic.run_id else ""
    body = svg[svg.find("<svg") :] if "<svg" in svg else svg
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        f"<title>{title}{run}</title><style>"
        "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}"
        "svg{max-width:100%;height:auto}.legend{color:#555;font-size:0.9em}"
        "</style></head><body>"
        f"<h1>{title}{run}</h1>"
        '<p class="legend">box: llm · component: script · diamond: approval · '
        "parallelogram: input · hexagon: agent · cylinder: rag · trapezium: map · "
        "double circle: end · dashed: a script's <code>_next</code> · dotted: map branch"
        + (" · green: the path the run took, ×N visits" if pic.run_id else "")
        + f'</p><div id="graph">{body}</div></body></html>\n'
    )


def render(pic: Picture, fmt: str) -> str:
    """The picture in one of :data:`FORMATS`."""
    if fmt == "mermaid":
        return to_mermaid(pic)
    if fmt == "dot":
        return to_dot(pic)
    svg = dot_to_svg(to_dot(pic))
    return svg if fmt == "svg" else to_html(pic, svg)


def run_path(events: Iterable[Any]) -> list[tuple[str, Any]]:
    """``[(node, routed_to)]`` of every node visit of a run, in order (``routed_to``
    is a list for a fan-out; None for a map item, one per item of its branch node)."""
    from graphrun.eventstore.events import NodeCompleted, NodeEntered, NodeFailed

    out: list[tuple[str, Any]] = []
    open_: dict[tuple[str, int], int] = {}
    items: set[tuple[str, str]] = set()
    for event in events:
        branch = getattr(event, "branch", "")
        if branch.endswith("]") and not isinstance(event, NodeEntered):
            # A map item: its effects name the branch node; each item is one visit.
            node_id = getattr(event, "node_id", None)
            if isinstance(node_id, str) and (node_id, branch) not in items:
                items.add((node_id, branch))
                out.append((node_id, None))
            continue
        if isinstance(event, NodeEntered):
            open_[(event.node_id, event.visit)] = len(out)
            out.append((event.node_id, None))
        elif isinstance(event, NodeCompleted | NodeFailed):
            index = open_.pop((event.node_id, event.visit), None)
            if index is not None:
                fan_out = getattr(event, "fan_out", None)
                out[index] = (event.node_id, getattr(event, "routed_to", None) or fan_out or None)
    return out


__all__ = [
    "FORMATS",
    "GraphPictureError",
    "PicEdge",
    "PicNode",
    "Picture",
    "build_picture",
    "dot_to_svg",
    "render",
    "run_path",
    "script_next_targets",
    "to_dot",
    "to_html",
    "to_mermaid",
]
