"""An agent's ``variables`` (Loki's shape), resolved once when a run starts.

Declarations come from graph.yaml or config.yaml (``name``, ``description``,
``default``); ``$<AGENT>_VARIABLES`` holding a JSON array of declarations replaces
them (Loki), and a JSON object there gives values. For each declared variable, in
order: a preset (``--var NAME=VALUE``), else a value from the JSON object, else the
default, else — on a terminal — a prompt ``name (description):`` that takes no
empty answer; whatever is still missing fails the run before anything is recorded,
naming every missing variable.

The resolved values are recorded in ``RunStarted.config["variables"]``: a resumed,
answered or forked run uses the values it began with, whatever the environment
says later. Scripts and tools get them as ``LLM_AGENT_VAR_<NAME>``. They are not
seeded into a graph's state (Loki); an LLM-loop agent (config.yaml) renders them
into its instructions. A child run started by an ``agent`` node resolves its own
variables (its defaults and environment; no presets, no prompt), as Loki does.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from graphrun.runtime.errors import UsageError
from graphrun.runtime.graph.loader import LoadedGraph

__all__ = [
    "Declared",
    "VariablesMissing",
    "declarations",
    "parse_presets",
    "prompt_variable",
    "resolve",
    "with_variables",
]


class VariablesMissing(UsageError):
    """Declared variables without a value (exit 2, nothing recorded)."""


@dataclass(frozen=True)
class Declared:
    """One declared variable."""

    name: str
    description: str = ""
    default: str | None = None


def parse_presets(values: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``--var NAME=VALUE`` flags as a mapping (a later flag for a name wins)."""
    out: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--var expects NAME=VALUE, got {value!r}")
        out[name.strip()] = rest
    return out


def _agent_names(loaded: LoadedGraph) -> list[str]:
    """The agent's names as ``$<AGENT>_VARIABLES`` may spell them: its directory,
    then the name the agent file gives."""
    names = [loaded.agent_dir.name]
    if loaded.graph.name and loaded.graph.name not in names:
        names.append(loaded.graph.name)
    return names


def _env_name(agent: str) -> str:
    from graphrun.actors.tools.lokienv import env_name

    return f"{env_name(agent)}_VARIABLES"


def _file_declarations(loaded: LoadedGraph) -> list[Any]:
    if loaded.path.name != "config.yaml":
        return [
            {"name": v.name, "description": v.description, "default": v.default}
            for v in loaded.graph.variables
        ]
    import yaml

    try:
        data = yaml.safe_load(loaded.path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return []  # the loader reported it already
    declared = data.get("variables") if isinstance(data, dict) else None
    return declared if isinstance(declared, list) else []


def declarations(
    loaded: LoadedGraph, environ: Mapping[str, str] | None = None
) -> tuple[list[Declared], dict[str, str], str]:
    """The declared variables, the values ``$<AGENT>_VARIABLES`` gives (its object
    form), and that variable's name."""
    env = os.environ if environ is None else environ
    declared: list[Any] = _file_declarations(loaded)
    values: dict[str, str] = {}
    names = _agent_names(loaded)
    variable = _env_name(names[0])
    for name in names:
        raw = env.get(_env_name(name))
        if not raw:
            continue
        variable = _env_name(name)
        try:
            override = json.loads(raw)
        except ValueError:
            break  # Loki ignores invalid JSON here
        if isinstance(override, list):
            declared = override  # Loki: the declarations are replaced
        elif isinstance(override, dict):
            values = {
                str(k): v if isinstance(v, str) else json.dumps(v) for k, v in override.items()
            }
        break
    out: list[Declared] = []
    for var in declared:
        if isinstance(var, dict) and isinstance(var.get("name"), str) and var["name"]:
            default = var.get("default")
            out.append(
                Declared(
                    name=var["name"],
                    description=str(var.get("description") or ""),
                    default=None if default is None else str(default),
                )
            )
    return out, values, variable


def _describe(var: Declared) -> str:
    return f"{var.name} ({var.description})" if var.description else var.name


def prompt_variable(var: Declared) -> str:
    """Ask for ``var`` on the terminal until the answer is not empty."""
    from graphrun.actors.human.prompt import ask_text

    while True:
        text = ask_text(f"{_describe(var)}:", default=None).text
        if text.strip():
            return text
        print("This field is required", file=sys.stderr)


def resolve(
    loaded: LoadedGraph,
    presets: Mapping[str, str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    ask: Callable[[Declared], str] | None = None,
) -> dict[str, str]:
    """The run's variables: preset, else ``$<AGENT>_VARIABLES``' value, else the
    default, else ``ask`` (a terminal prompt), else missing — an error naming every
    missing variable. A preset naming no declared variable is an error too."""
    presets = dict(presets or {})
    declared, from_env, variable = declarations(loaded, environ)
    known = {var.name for var in declared}
    unknown = [name for name in presets if name not in known]
    if unknown:
        listed = ", ".join(sorted(known)) if known else "none"
        raise UsageError(
            f"--var {unknown[0]}: agent '{loaded.graph.name}' declares no variable "
            f"'{unknown[0]}' (its variables: {listed})"
        )
    values: dict[str, str] = {}
    missing: list[Declared] = []
    announced = False
    for var in declared:
        if var.name in presets:
            values[var.name] = presets[var.name]
        elif var.name in from_env:
            values[var.name] = from_env[var.name]
        elif var.default is not None:
            values[var.name] = var.default
        elif ask is not None:
            if not announced:
                print("⚙ Init agent variables...", file=sys.stderr)
                announced = True
            values[var.name] = ask(var)
        else:
            missing.append(var)
    if missing:
        raise VariablesMissing(
            "the following agent variables are required: "
            + ", ".join(_describe(var) for var in missing),
            hint=f"pass --var NAME=VALUE, give them a default, or set ${variable}",
        )
    return values


def with_variables(loaded: LoadedGraph, values: Mapping[str, str]) -> LoadedGraph:
    """``loaded`` ready to run with ``values``: an LLM-loop agent renders its
    variables into its instructions (from its seed state); a graph is unchanged."""
    if loaded.path.name != "config.yaml" or not values:
        return loaded
    import dataclasses

    return dataclasses.replace(loaded, seed_state={**loaded.seed_state, **values})
