"""Model tables in Loki's ``models.yaml`` shape: aliases, limits and request patches.

A table lists, per provider (a client ``type`` or a client's name), its models::

    - provider: claude
      models:
        - name: claude-sonnet-4-6:thinking   # what graphs say
          real_name: claude-sonnet-4-6       # what the server is sent
          max_output_tokens: 24000
          require_max_tokens: true           # always send the limit
          patch:
            body:                            # merged into the request (null deletes)
              temperature: null
              thinking: {type: enabled, budget_tokens: 16000}

Tables, later ones winning per model: graphrun's own small table
(:data:`BUILTIN`: the Claude models, with Loki's ``:thinking`` variants), then a
configuration directory's ``models.yaml``, then its ``models-override.yaml``
(Loki's file: ``{version, list}``). A client's own ``models:`` entries in
config.yaml win over all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphrun.eventstore.errors import GraphrunError


@dataclass(frozen=True)
class ModelInfo:
    """One model of a table."""

    name: str
    real_name: str | None = None
    max_output_tokens: int | None = None
    require_max_tokens: bool = False
    reasoning_effort: str | None = None
    patch: Mapping[str, Any] | None = None  # {"body": {...}} merged into the request body

    @property
    def body_patch(self) -> Mapping[str, Any] | None:
        body = (self.patch or {}).get("body")
        return body if isinstance(body, Mapping) else None


Table = dict[str, dict[str, ModelInfo]]  # provider -> model name -> info

_THINKING = {
    "body": {
        "temperature": None,
        "top_p": None,
        "thinking": {"type": "enabled", "budget_tokens": 16000},
    }
}


def _claude(name: str, *, thinking: bool) -> list[ModelInfo]:
    plain = ModelInfo(name, max_output_tokens=8192, require_max_tokens=True)
    if not thinking:
        return [plain]
    return [
        plain,
        ModelInfo(
            f"{name}:thinking",
            real_name=name,
            max_output_tokens=24000,
            require_max_tokens=True,
            patch=_THINKING,
        ),
    ]


#: graphrun's own table: Anthropic's current models with a limit Messages requires,
#: and the extended-thinking variants Loki's configurations name.
BUILTIN: Table = {
    "claude": {
        info.name: info
        for name, thinking in (
            ("claude-opus-4-6", True),
            ("claude-sonnet-4-6", True),
            ("claude-opus-4-5", True),
            ("claude-sonnet-4-5", True),
            ("claude-sonnet-4-5-20250929", True),
            ("claude-haiku-4-5", False),
            ("claude-haiku-4-5-20251001", False),
            ("claude-opus-4-1", True),
            ("claude-opus-4-1-20250805", True),
            ("claude-sonnet-4-0", True),
            ("claude-sonnet-4-20250514", True),
            ("claude-opus-4-0", True),
            ("claude-opus-4-20250514", True),
        )
        for info in _claude(name, thinking=thinking)
    }
}


class ModelsFileError(GraphrunError):
    """A models.yaml that cannot be used."""

    exit_code = 2


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _entries(data: Any, where: str) -> Table:
    if not isinstance(data, list):
        raise ModelsFileError("a models table is a list of {provider, models}", where=where)
    table: Table = {}
    for index, group in enumerate(data):
        if not isinstance(group, dict) or not isinstance(group.get("provider"), str):
            raise ModelsFileError("each entry needs a provider", where=f"{where} [{index}]")
        models = table.setdefault(group["provider"], {})
        for item in group.get("models") or []:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                continue
            patch = item.get("patch")
            effort = item.get("default_reasoning_effort") or item.get("reasoning_effort")
            models[item["name"]] = ModelInfo(
                name=item["name"],
                real_name=item.get("real_name") or None,
                max_output_tokens=_int(item.get("max_output_tokens")),
                require_max_tokens=bool(item.get("require_max_tokens")),
                reasoning_effort=effort if isinstance(effort, str) and effort else None,
                patch=patch if isinstance(patch, dict) else None,
            )
    return table


def _read(path: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ModelsFileError(f"cannot read the models table: {exc}", where=str(path)) from None


def load_tables(config_dir: Path | None) -> Table:
    """The model table for ``config_dir`` (see the module doc)."""
    table: Table = {provider: dict(models) for provider, models in BUILTIN.items()}
    if config_dir is None:
        return table
    layers = []
    own = Path(config_dir) / "models.yaml"
    if own.is_file():
        layers.append(_entries(_read(own), str(own)))
    override = Path(config_dir) / "models-override.yaml"
    if override.is_file():
        data = _read(override)
        listed = data.get("list") if isinstance(data, dict) else data
        layers.append(_entries(listed, str(override)))
    for layer in layers:
        for provider, models in layer.items():
            table.setdefault(provider, {}).update(models)
    return table


def merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``target`` with ``patch`` merged in as a JSON merge patch (RFC 7386): a null
    removes a member, an object merges into an object, anything else replaces."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_patch(out[key], value)
        elif isinstance(value, Mapping):
            out[key] = merge_patch({}, value)
        else:
            out[key] = value
    return out


__all__ = ["BUILTIN", "ModelInfo", "ModelsFileError", "Table", "load_tables", "merge_patch"]
