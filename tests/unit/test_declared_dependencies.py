"""Every package the code imports directly is declared in pyproject.toml (none arrives
only as another package's dependency)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("runtime", "actors", "eventstore", "cli")


def _imported_top_levels() -> dict[str, str]:
    """Top-level module name -> the first file importing it (third-party only)."""
    found: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in ("graphrun", "__future__"):
                        continue
                    found.setdefault(top, path.relative_to(ROOT).as_posix())
    return found


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    specs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        specs += extra
    return {_normalise(re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0]) for spec in specs}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# Import names that differ from the distribution that provides them, for when that
# distribution is not installed here (an extra) and so cannot be looked up.
ALIASES = {
    "bs4": "beautifulsoup4",
    "dotenv": "python-dotenv",
    "markdown_it": "markdown-it-py",
    "opentelemetry": "opentelemetry-sdk",
    "psycopg_pool": "psycopg-pool",
    "yaml": "pyyaml",
}


def test_every_directly_imported_package_is_declared() -> None:
    distributions = packages_distributions()
    declared = _declared()
    missing = []
    for module, where in sorted(_imported_top_levels().items()):
        names = {_normalise(d) for d in distributions.get(module, [])}
        names.add(_normalise(ALIASES.get(module, module)))
        if not names & declared:
            missing.append(f"{module} (imported in {where}; distribution {sorted(names)})")
    assert missing == []
