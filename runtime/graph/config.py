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


def config_dir(flag: str | None = None) -> Path:
    """``--config-dir``, else ``$GRAPHRUN_CONFIG_DIR``, else ``$LOKI_CONFIG_DIR``, else the
    platform's user config dir for graphrun."""
    for value in (flag, os.environ.get("GRAPHRUN_CONFIG_DIR"), os.environ.get("LOKI_CONFIG_DIR")):
        if value:
            return Path(value)
    return _user_config_dir()


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
        hint="pass a directory with graph.yaml, a graph.yaml file, or set --agents-dir",
    )
