"""A node kind is one module under runtime/nodes/: its Struct is there, it is
registered whatever graphrun module is imported first, and the graph package asks
the kind what it needs instead of naming it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from graphrun.runtime.graph.model import NODE_TYPES, NodeBase
from graphrun.runtime.nodes import KINDS

ROOT = Path(__file__).resolve().parents[3]

GRAPH = """\
name: kinds
version: "1.0"
start: pick
nodes:
  pick:
    type: decision
    expr: "kind"
    routes: [{when: "a", to: each}, {when: default, to: done}]
  each:
    type: map
    over: "{{items}}"
    as: item
    branch: one
    collect_into: got
    next: done
  one:
    type: script
    script: one.py
  done:
    type: end
    output: "{{got}}"
"""


def test_every_kind_is_defined_in_its_module_under_runtime_nodes() -> None:
    assert list(NODE_TYPES) == [
        "agent",
        "script",
        "approval",
        "input",
        "llm",
        "rag",
        "end",
        "map",
        "decision",
        "tool",
    ]
    for tag, cls in NODE_TYPES.items():
        assert issubclass(cls, NodeBase)
        assert cls.__module__.startswith("graphrun.runtime.nodes."), (tag, cls.__module__)
    for tag, kind in KINDS.items():
        assert NODE_TYPES[tag] is kind.struct


def test_the_graph_package_names_no_kind() -> None:
    """No module of runtime/graph names a kind's Struct (the kind declares itself)."""
    names = {cls.__name__ for cls in NODE_TYPES.values()}
    for path in sorted((ROOT / "runtime" / "graph").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        used |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not used & names, (path.name, sorted(used & names))


def test_the_loader_knows_every_kind_whatever_is_imported_first(tmp_path: Path) -> None:
    (tmp_path / "graph.yaml").write_text(GRAPH)
    (tmp_path / "one.py").write_text("print('{}')\n")
    for first in (
        "graphrun.runtime.graph.loader",
        "graphrun.runtime.graph.model",
        "graphrun.runtime.replay.testing",
        "graphrun.eventstore.events",
    ):
        code = (
            f"import {first}\n"
            "from graphrun.runtime.graph.loader import load_graph\n"
            f"graph = load_graph({str(tmp_path)!r}).graph\n"
            "print(' '.join(n.type for n in graph.nodes.values()))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=False
        )
        assert (done.returncode, done.stdout) == (0, "decision map script end\n"), done.stderr
