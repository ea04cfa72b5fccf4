"""Imports point one way: cli → runtime.{replay, observe} → runtime.engine → runtime.nodes
→ runtime.graph → actors → eventstore, nothing points back, and no modules import
each other in a circle inside a layer either.

For the direction every import counts: module level, inside a function, and under
``TYPE_CHECKING``; a circle a type checker or a reader sees is a circle, even when
Python never runs it. For circles among modules every import Python runs counts
(module level or inside a function: importing late does not untie two modules that
need each other); only imports under ``TYPE_CHECKING`` are left out.
"""

from __future__ import annotations

import ast
from collections import deque
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("eventstore", "actors", "runtime", "cli")

# Lowest first. A module may import its own layer or any layer below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("graphrun.eventstore",),
    ("graphrun.actors",),
    (
        "graphrun.runtime.errors",
        "graphrun.runtime.graph",
        "graphrun.runtime.agents",
        # Decision statements, signatures and the approver policy (read from a graph).
        "graphrun.runtime.decisions",
    ),
    ("graphrun.runtime.nodes",),
    ("graphrun.runtime.engine",),
    (
        "graphrun.runtime.replay",
        "graphrun.runtime.observe",
        "graphrun.runtime.inspect",
        "graphrun.runtime.narrate",
        "graphrun.runtime.decisions.report",
        "graphrun.runtime",
    ),
    ("graphrun.cli",),
)


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return "graphrun." + ".".join(parts).removesuffix(".__init__")


def _layer(module: str) -> int:
    best, best_len = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best >= 0, f"{module} belongs to no layer: add it to LAYERS"
    return best


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name.startswith("graphrun.")]


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """The graphrun imports Python runs: all but those under ``if TYPE_CHECKING``."""
    found: list[tuple[int, str]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            found += [item for child in node.orelse for item in _run_imports(child)]
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        found += _run_imports(node)
    return [(line, name) for line, name in found if name.startswith("graphrun.")]


def import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """``{module: {imported module: line}}`` over the imports Python runs."""
    paths = {_module_name(path, root): path for path in _sources(root)}
    graph: dict[str, dict[str, int]] = {}
    for module, path in paths.items():
        edges = graph.setdefault(module, {})
        for line, name in _run_imports(ast.parse(path.read_text(), str(path))):
            target = name
            while target and target not in paths:  # `from pkg.mod import name`
                target = target.rpartition(".")[0]
            if target and target != module:
                edges.setdefault(target, line)
    return graph


def import_cycles(root: Path = ROOT) -> list[str]:
    """Every circle of imports, one line each: ``a:3 -> b:7 -> a`` (the lines of the
    imports), found from the lowest module name of each strongly connected group."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                connect(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(group)

    for module in sorted(graph):
        if module not in index:
            connect(module)
    found = []
    for group in groups:
        start = min(group)
        # The shortest way round from the group's first module back to it.
        came: dict[str, str] = {}
        todo = deque([start])
        while start not in came:
            here = todo.popleft()
            for target in sorted(t for t in graph[here] if t in group):
                if target not in came:
                    came[target] = here
                    todo.append(target)
        path = [start]
        while len(path) == 1 or path[-1] != start:
            path.append(came[path[-1]])
        path.reverse()
        shown = [f"{m.removeprefix('graphrun.')}:{graph[m][n]}" for m, n in pairwise(path)]
        found.append(" -> ".join([*shown, start.removeprefix("graphrun.")]))
    return sorted(found)


def _sources(root: Path = ROOT) -> list[Path]:
    return sorted(p for package in PACKAGES for p in (root / package).rglob("*.py"))


def backward_imports(root: Path = ROOT) -> list[str]:
    """Every import that points from a lower layer to a higher one."""
    offences = []
    for path in _sources(root):
        here = _layer(_module_name(path, root))
        for line, name in _imports(path):
            if _layer(name) > here:
                where = path.relative_to(root)
                offences.append(f"{where}:{line} imports {name}")
    return offences


def test_imports_point_one_way() -> None:
    assert backward_imports() == []


def test_every_module_has_a_layer() -> None:
    for path in _sources():
        _layer(_module_name(path))


def test_a_backward_import_is_caught(tmp_path: Path) -> None:
    # A copy of the tree where a graph module reaches up into the engine (a local
    # import, as circles used to hide) and a node kind builds a Driver.
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            target = tmp_path / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text())
    loader = tmp_path / "runtime" / "graph" / "loader.py"
    loader.write_text(
        loader.read_text()
        + "\n\ndef _late():\n    from graphrun.runtime.engine.driver import Driver\n"
    )
    kind = tmp_path / "runtime" / "nodes" / "agent.py"
    kind.write_text("from graphrun.runtime.engine.driver import drive\n" + kind.read_text())
    found = backward_imports(tmp_path)
    assert len(found) == 2
    assert (
        found[0]
        == "runtime/graph/loader.py:"
        + str(len(loader.read_text().splitlines()))
        + " imports graphrun.runtime.engine.driver.Driver"
    )
    assert found[1] == "runtime/nodes/agent.py:1 imports graphrun.runtime.engine.driver.drive"


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert import_cycles() == []


def test_a_circle_of_imports_is_caught(tmp_path: Path) -> None:
    # A copy of the tree where a validator rule module is imported by the validator
    # and imports it back, late (inside a function), as the rule registry once did.
    # An import under TYPE_CHECKING does not count.
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            target = tmp_path / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text())
    rules = tmp_path / "runtime" / "graph" / "state_rules.py"
    rules.write_text(
        rules.read_text()
        + "\n\ndef _late():\n    from graphrun.runtime.graph.validate import validate\n"
    )
    typed = tmp_path / "runtime" / "graph" / "model.py"
    typed.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from graphrun.runtime.graph.validate import Check\n"
        + typed.read_text()
    )
    assert import_cycles(tmp_path) == [
        f"runtime.graph.state_rules:{len(rules.read_text().splitlines())} -> "
        f"runtime.graph.validate:{_line_of(tmp_path, 'validate.py', 'state_rules')} -> "
        "runtime.graph.state_rules"
    ]


def _line_of(root: Path, name: str, needle: str) -> int:
    lines = (root / "runtime" / "graph" / name).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if needle in line and "import" in line)
