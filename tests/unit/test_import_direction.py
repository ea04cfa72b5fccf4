"""Imports point one way: cli → runtime.{replay, observe} → runtime.engine → runtime.nodes
→ runtime.graph → actors → eventstore, and nothing points back.

Every import counts: module level, inside a function, and under ``TYPE_CHECKING``; a
circle a type checker or a reader sees is a circle, even when Python never runs it.
"""

from __future__ import annotations

import ast
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
