"""Loki's skill documents: where they are looked for, and what one says.

A skill is ``<skills dir>/<name>/SKILL.md``; the skills directory is
``$COYOTE_SKILLS_DIR`` (or ``$LOKI_SKILLS_DIR``), else ``skills/`` of the
configuration directory; a project's own ``.coyote/skills`` (or ``.loki/skills``)
in the working directory comes first, as in Loki. A skill's YAML front matter
gives its ``description`` and what it grants (``enabled_tools``,
``enabled_mcp_servers``); the rest is its body.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_FRONT = re.compile(r"\A---\s*\n(.*?)\n---\s*\n?(.*)\Z", re.DOTALL)


def skills_dirs(config_dir: Path | None) -> list[Path]:
    """Where skills are looked for, first match wins."""
    dirs = [Path.cwd() / ".coyote" / "skills", Path.cwd() / ".loki" / "skills"]
    for env in ("COYOTE_SKILLS_DIR", "LOKI_SKILLS_DIR"):
        if os.environ.get(env):
            dirs.append(Path(os.environ[env]))
            break
    else:
        if config_dir is not None:
            dirs.append(Path(config_dir) / "skills")
    return dirs


def read_skill(path: Path) -> tuple[str, str]:
    """A SKILL.md's ``(description, body)``."""
    import yaml

    text = path.read_text(encoding="utf-8")
    match = _FRONT.match(text)
    if match is None:
        return "", text.strip()
    description = ""
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        meta = None
    if isinstance(meta, dict) and isinstance(meta.get("description"), str):
        description = meta["description"]
    return description, match.group(2).strip()


def read_grants(path: Path) -> list[str]:
    """What a SKILL.md's front matter grants, as tools entries: its ``enabled_tools``
    and, as ``mcp:<server>``, its ``enabled_mcp_servers`` (each a list, or names
    separated by commas, as Loki reads them)."""
    import yaml

    match = _FRONT.match(path.read_text(encoding="utf-8"))
    if match is None:
        return []
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return []
    if not isinstance(meta, dict):
        return []
    tools = _names(meta.get("enabled_tools"))
    return tools + [f"mcp:{server}" for server in _names(meta.get("enabled_mcp_servers"))]


def auto_unloads(path: Path) -> bool:
    """Whether a SKILL.md's front matter sets Loki's ``auto_unload``."""
    import yaml

    match = _FRONT.match(path.read_text(encoding="utf-8"))
    try:
        meta = yaml.safe_load(match.group(1)) if match is not None else None
    except yaml.YAMLError:
        return False
    return isinstance(meta, dict) and meta.get("auto_unload") is True


def _names(value: object) -> list[str]:
    if isinstance(value, str):
        names = value.split(",")
    elif isinstance(value, list):
        names = [v for v in value if isinstance(v, str)]
    else:
        return []
    return [n.strip() for n in names if n.strip()]


def find_skill(name: str, config_dir: Path | None) -> Path | None:
    if not _NAME.match(name):
        return None
    for root in skills_dirs(config_dir):
        path = root / name / "SKILL.md"
        if path.is_file():
            return path
    return None


def available(config_dir: Path | None) -> list[str]:
    names: set[str] = set()
    for root in skills_dirs(config_dir):
        if root.is_dir():
            names.update(
                p.name for p in root.iterdir() if (p / "SKILL.md").is_file() and _NAME.match(p.name)
            )
    return sorted(names)


__all__ = [
    "auto_unloads",
    "available",
    "find_skill",
    "read_grants",
    "read_skill",
    "skills_dirs",
]
