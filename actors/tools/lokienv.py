"""Loki's environment for the processes an agent runs (tools and script nodes).

What Loki gives them, besides the inherited environment (keys excepted, see
:mod:`graphrun.actors.secrets`):

- ``LLM_PROMPT_UTILS_FILE``: ``<config_dir>/functions/utils/prompt-utils.sh``;
- ``LLM_AGENT_DATA_DIR``: the agent directory;
- ``LLM_AGENT_VAR_<NAME>``: each of the agent's ``variables`` (name upper-cased,
  ``-`` → ``_``): the values the run was started with (recorded; see
  :mod:`graphrun.runtime.graph.variables`), else the declared default, overridden by
  ``$<AGENT>_VARIABLES`` (Loki's JSON array of declarations, or a JSON object of
  values); ``{{NAME}}`` in a value is taken from the environment;
- ``.env`` files: ``<root_dir>/.env`` and ``<config_dir>/.env``; a variable already
  set wins, as in Loki's wrappers;
- ``PATH``: ``<config_dir>/functions/bin`` and ``<agent_dir>/bin`` first, where they exist;
- the working directory (:func:`work_dir`): an agent of a Loki configuration
  directory (``<dir>/agents/<name>`` next to ``<dir>/functions``) runs its scripts
  and tools where graphrun was started, as Loki does (its ``project_dir: '.'`` is
  the user's project); any other agent folder runs them in the agent folder;
- ``AUTO_CONFIRM=true``: graphrun runs headless (tools get no terminal), so
  prompt-utils' ``guard_operation`` / ``guard_path`` must not ask; approval nodes are
  how a graph asks a human.

Colour-forcing variables (``CLICOLOR_FORCE``, ``FORCE_COLOR``) are deliberately not
set: tool output is recorded, and escape codes would be recorded with it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "agent_variables",
    "dotenv_values",
    "env_name",
    "loki_env",
    "prompt_utils_file",
    "resolve_placeholders",
    "script_env",
    "work_dir",
]

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def prompt_utils_file(config_dir: Path | None) -> Path | None:
    """Loki's ``functions/utils/prompt-utils.sh`` of ``config_dir``."""
    if config_dir is None:
        return None
    return Path(config_dir) / "functions" / "utils" / "prompt-utils.sh"


def dotenv_values(path: Path) -> dict[str, str]:
    """The ``KEY=VALUE`` lines of a ``.env`` file (nothing if there is none)."""
    if not path.is_file():
        return {}
    from dotenv import dotenv_values as read

    return {k: v for k, v in read(path, interpolate=False).items() if v is not None}


def resolve_placeholders(text: str, environ: Mapping[str, str]) -> tuple[str, list[str]]:
    """``text`` with each ``{{NAME}}`` replaced from ``environ``; also the missing names."""
    missing: list[str] = []

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in environ:
            return environ[name]
        missing.append(name)
        return match.group(0)

    return _PLACEHOLDER.sub(sub, text), missing


def env_name(name: str) -> str:
    """A name as Loki puts it in an environment variable: upper case, `[A-Z0-9_]`."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name).upper()


def _read_agent_file(agent_dir: Path) -> dict[str, Any]:
    import yaml

    for name in ("config.yaml", "graph.yaml"):
        path = agent_dir / name
        if path.is_file():
            try:
                data = yaml.safe_load(path.read_text(encoding="utf-8"))
            except (OSError, yaml.YAMLError):
                return {}  # reported by the loader, with its line
            return data if isinstance(data, dict) else {}
    return {}


def agent_variables(agent_dir: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The agent's variables with their values (defaults, ``$<AGENT>_VARIABLES``)."""
    env = os.environ if environ is None else environ
    data = _read_agent_file(agent_dir)
    name = str(data.get("name") or agent_dir.name)
    declared = data.get("variables") or []
    values: dict[str, str] = {}
    override: Any = None
    raw = env.get(f"{env_name(name)}_VARIABLES")
    if raw:
        try:
            override = json.loads(raw)
        except ValueError:
            override = None  # Loki ignores invalid JSON here
    if isinstance(override, list):
        declared = override  # Loki: the declarations are replaced
    for var in declared if isinstance(declared, list) else []:
        named = isinstance(var, dict) and isinstance(var.get("name"), str)
        if named and var.get("default") is not None:
            values[var["name"]] = str(var["default"])
    if isinstance(override, dict):
        values.update({str(k): str(v) for k, v in override.items()})
    return {k: resolve_placeholders(v, env)[0] for k, v in values.items()}


def work_dir(agent_dir: Path) -> Path | None:
    """Where an agent's scripts and tools run: ``None`` (the directory graphrun was
    started in) for an agent of a Loki configuration directory, as Loki runs them,
    else the agent folder."""
    parent = Path(os.path.realpath(agent_dir)).parent
    if parent.name == "agents" and (parent.parent / "functions").is_dir():
        return None
    return agent_dir


def loki_env(
    base: Mapping[str, str],
    *,
    agent_dir: Path | None,
    config_dir: Path | None,
    root_dir: Path | None = None,
    variables: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """``base`` plus Loki's variables for a process an agent runs (see the module doc)."""
    env = dict(base)
    for folder in (root_dir, config_dir):
        if folder is not None:
            for key, value in dotenv_values(Path(folder) / ".env").items():
                env.setdefault(key, value)
    utils = prompt_utils_file(config_dir)
    if utils is not None:
        env["LLM_PROMPT_UTILS_FILE"] = str(utils)
    if agent_dir is not None:
        env["LLM_AGENT_DATA_DIR"] = str(agent_dir)
        if variables is None:
            variables = agent_variables(agent_dir, env)
    for name, value in (variables or {}).items():
        # {{NAME}} in a value is taken from the environment (never recorded with it).
        env[f"LLM_AGENT_VAR_{env_name(name)}"] = resolve_placeholders(value, env)[0]
    env.setdefault("AUTO_CONFIRM", "true")
    bins = [
        str(folder)
        for folder in (
            Path(config_dir) / "functions" / "bin" if config_dir is not None else None,
            Path(agent_dir) / "bin" if agent_dir is not None else None,
        )
        if folder is not None and folder.is_dir()
    ]
    if bins:
        env["PATH"] = os.pathsep.join([*bins, env.get("PATH", os.defpath)])
    return env


_SCRIPT_CACHE: dict[tuple[object, ...], tuple[dict[str, str], list[str]]] = {}


def _stamp(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def script_env(
    env: dict[Any, Any],
    *,
    agent_dir: Path,
    config_dir: Path | None,
    script: bytes,
    variables: Mapping[str, str] | None = None,
) -> dict[Any, Any]:
    """A script node's environment (``env``) with Loki's variables added (LOKI-LATER
    §6: ``LLM_ROOT_DIR`` is the config directory) and the key variables removed,
    except those the script's text names (it then evidently needs them).

    What this adds depends only on files and variables that rarely change, so it is
    worked out once per (agent, config dir, their files' mtimes, environment,
    ``variables``: the run's, as recorded; None: the declared defaults).
    """
    from graphrun.actors import secrets

    key = (
        agent_dir,
        config_dir,
        _stamp(agent_dir / "config.yaml"),
        _stamp(agent_dir / "graph.yaml"),
        _stamp(Path(config_dir) / ".env") if config_dir is not None else 0,
        tuple(sorted(env.items())),
        None if variables is None else tuple(sorted(variables.items())),
    )
    cached = _SCRIPT_CACHE.get(key)
    if cached is None:
        base = {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
        full = loki_env(base, agent_dir=agent_dir, config_dir=config_dir, variables=variables)
        if config_dir is not None:
            full["LLM_ROOT_DIR"] = str(config_dir)
        secrets.register_environment(full)
        added = {k: v for k, v in full.items() if base.get(k) != v}
        keys = [k for k in full if secrets.is_key_name(k)]
        if len(_SCRIPT_CACHE) > 32:
            _SCRIPT_CACHE.clear()
        cached = _SCRIPT_CACHE[key] = (added, keys)
    added, keys = cached
    out = dict(env)
    as_bytes = any(isinstance(k, bytes) for k in env)  # os.environb on POSIX
    code = os.fsencode if as_bytes else str
    out.update((code(k), code(v)) for k, v in added.items())
    for name in keys:
        if name.encode() not in script:
            out.pop(code(name), None)
    return out
