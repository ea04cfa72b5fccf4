"""Where things are: the event database, the agents directory, the config directory.

Precedence for each: the command-line flag, then the environment variable, then
the platform's convention (via platformdirs).
"""

from __future__ import annotations

import os
from pathlib import Path


def _user_data_dir() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("graphrun", appauthor=False))


def _user_config_dir() -> Path:
    from platformdirs import user_config_dir

    return Path(user_config_dir("graphrun", appauthor=False))


def db_path(flag: str | None = None) -> Path:
    """``--db``, else ``$GRAPHRUN_DB``, else ``<user data dir>/graphrun/events.db``."""
    if flag:
        return Path(flag)
    env = os.environ.get("GRAPHRUN_DB")
    if env:
        return Path(env)
    return _user_data_dir() / "events.db"


#: The environment variables naming a configuration directory, in the order they count.
CONFIG_ENV = ("GRAPHRUN_CONFIG_DIR", "COYOTE_CONFIG_DIR", "LOKI_CONFIG_DIR")


def _user_dirs() -> list[Path]:
    """The per-user configuration directories looked at, in order: graphrun's, then
    Coyote's and Loki's (``$XDG_CONFIG_HOME/<name>``, else the platform's)."""
    from platformdirs import user_config_dir

    return [_user_config_dir()] + [
        Path(user_config_dir(name, appauthor=False)) for name in ("coyote", "loki")
    ]


def config_dir(flag: str | None = None) -> Path:
    """``--config-dir``/``--loki-dir``, else ``$GRAPHRUN_CONFIG_DIR``, ``$COYOTE_CONFIG_DIR``,
    ``$LOKI_CONFIG_DIR``, else the first of graphrun's, Coyote's and Loki's user config
    dirs that exists (graphrun's when none does)."""
    for value in (flag, *(os.environ.get(name) for name in CONFIG_ENV)):
        if value:
            return Path(value)
    dirs = _user_dirs()
    return next((d for d in dirs if d.is_dir()), dirs[0])


def config_places() -> str:
    """Where a configuration directory was looked for (for error messages)."""
    home = str(Path.home())
    shown = [
        str(d).replace(home, "~", 1) if str(d).startswith(home) else str(d) for d in _user_dirs()
    ]
    return ", ".join([f"${name}" for name in CONFIG_ENV] + shown)


def agents_dir(flag: str | None = None, *, config: Path | None = None) -> Path:
    """``--agents-dir``, else ``$GRAPHRUN_AGENTS_DIR``, else ``<config dir>/agents``."""
    if flag:
        return Path(flag)
    env = os.environ.get("GRAPHRUN_AGENTS_DIR")
    if env:
        return Path(env)
    return (config or config_dir()) / "agents"


def resolve_agent(target: str, agents: Path) -> Path:
    """An agent directory, a graph.yaml path, or an agent name in the agents directory."""
    path = Path(target)
    if path.exists():
        return path
    candidate = agents / target
    if "/" not in target and candidate.exists():
        return candidate
    from graphrun.runtime.errors import GraphLoadError

    raise GraphLoadError(
        f"no agent '{target}': not a path, and not in the agents directory {agents}",
        hint="pass a directory with graph.yaml, a graph.yaml file, or set --agents-dir, or "
        f"--loki-dir DIR for a Loki/Coyote configuration (looked in {config_places()})",
    )
