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


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
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


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def backward_imports() -> list[str]:
    """Every import that points from a lower layer to a higher one."""
    offences = []
    for path in _sources():
        here = _layer(_module_name(path))
        for line, name in _imports(path):
            if _layer(name) > here:
                where = path.relative_to(ROOT)
                offences.append(f"{where}:{line} imports {name}")
    return offences


def test_imports_point_one_way() -> None:
    assert backward_imports() == []


def test_every_module_has_a_layer() -> None:
    for path in _sources():
        _layer(_module_name(path))


def test_a_backward_import_is_caught(tmp_path: Path) -> None:
    # The checker itself must see a backward import (a graph module reaching the engine).
    source = "from graphrun.runtime.engine.driver import Driver\n"
    module = ROOT / "runtime" / "graph" / "loader.py"
    assert _layer(_module_name(module)) < _layer("graphrun.runtime.engine.driver")
    tree_imports = [name for _, name in _imports_of_text(source)]
    assert tree_imports == ["graphrun.runtime.engine.driver.Driver"]


def _imports_of_text(text: str) -> list[tuple[int, str]]:
    probe = Path(ROOT / "tests" / "unit" / "_probe_never_written.py")
    tree = ast.parse(text, str(probe))
    return [
        (n.lineno, f"{n.module}.{a.name}")
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module
        for a in n.names
    ]
