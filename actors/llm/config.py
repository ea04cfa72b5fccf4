"""Which server, model name and key a ``provider:model`` id means.

Two clients always exist, configured from the environment as the official SDKs
do:

* ``openai`` — Chat Completions at ``$OPENAI_BASE_URL`` (default
  ``https://api.openai.com/v1``; the URL includes ``/v1``), key ``OPENAI_API_KEY``.
* ``anthropic`` — Messages at ``$ANTHROPIC_BASE_URL`` (default
  ``https://api.anthropic.com``; the URL excludes ``/v1``), key ``ANTHROPIC_API_KEY``.
  ``claude`` names the same client unless the config file defines one.

More clients come from ``<config_dir>/config.yaml`` in Loki's ``clients:`` shape::

    clients:
      - type: openai-compatible     # or openai, claude (anthropic)
        name: ollama
        api_base: http://localhost:11434/v1
        api_key: ...                # optional; else $OLLAMA_API_KEY
        models:
          - name: llama             # what graph.yaml says: ollama:llama
            real_name: llama3.1:8b  # what the server is sent
            max_input_tokens: 128000

A client of type ``openai`` or ``claude`` without a ``name`` takes the name
``openai`` or ``claude`` and replaces the built-in one; ``anthropic:`` also
resolves to the first configured Claude client when no client is named
``anthropic``. A Claude ``api_base`` written Loki's way (ending in ``/v1``) is
accepted.

Keys: a client's ``api_key``, else ``$<NAME>_API_KEY``, else the built-in
variable of its protocol. A key is *required* only where a server certainly
wants one: the official OpenAI and Anthropic endpoints. A client pointed at
another server (``openai-compatible``, or ``OPENAI_BASE_URL`` /
``ANTHROPIC_BASE_URL`` / ``api_base`` set) may have none, and then no
authentication header is sent at all: local servers (Ollama, llama.cpp) need none
and a missing key there is not an error we can detect before the call.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphrun.eventstore.errors import GraphrunError

OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"
ANTHROPIC_DEFAULT_BASE_URL = "https://api.anthropic.com"

GEMINI_DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com/v1beta/openai"

# config.yaml client types -> wire protocol. Gemini and Azure OpenAI are spoken to
# through their OpenAI-compatible endpoints (Gemini's ``/v1beta/openai``, Azure's
# ``/openai/v1``), which take the key as a bearer token.
_CLIENT_TYPES = {
    "openai": "openai",
    "openai-compatible": "openai",
    "gemini": "openai",
    "azure-openai": "openai",
    "claude": "anthropic",
    "anthropic": "anthropic",
}
#: Protocol of a client graphrun knows of but cannot speak (an error only when used).
UNSUPPORTED = "unsupported"
_DEFAULT_NAMES = {"openai": "openai", "claude": "claude", "anthropic": "anthropic"}
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


class LlmConfigError(GraphrunError):
    """A model id or the LLM client configuration is wrong or incomplete."""


@dataclass(frozen=True)
class ModelEntry:
    """A model a client lists: the ``name`` graphs use, the ``real_name`` it sends."""

    name: str
    real_name: str | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    reasoning_effort: str | None = None


@dataclass(frozen=True)
class ClientConfig:
    """One named client: protocol, server, credentials, model aliases."""

    name: str
    provider: str  # wire protocol: "openai" or "anthropic"
    base_url: str
    api_key: str | None = field(default=None, repr=False)
    key_env: str = ""  # where the key is expected, for messages
    key_required: bool = False
    models: Mapping[str, ModelEntry] = field(default_factory=dict)
    kind: str = ""  # config.yaml's ``type``
    where: str = ""  # where in config.yaml it is defined
    #: ``{{NAME}}`` placeholders in api_key / api_base that nothing defines.
    missing: tuple[str, ...] = ()
    problem: str = ""  # why it cannot be called, if it cannot

    def check_usable(self) -> None:
        """Raise :class:`LlmConfigError` if graphrun cannot call this client."""
        if self.provider == UNSUPPORTED:
            raise LlmConfigError(
                f"client '{self.name}' has type '{self.kind}', which graphrun cannot call",
                where=self.where or None,
                hint="graphrun speaks the OpenAI and Anthropic wire protocols: use a client "
                "of type openai, openai-compatible, gemini, azure-openai or claude (an "
                "OpenAI-compatible proxy such as LiteLLM reaches the others)",
            )
        if self.problem:
            raise LlmConfigError(
                f"client '{self.name}' ({self.kind}) {self.problem}", where=self.where or None
            )
        if self.missing:
            names = ", ".join(f"{{{{{n}}}}}" for n in self.missing)
            raise LlmConfigError(
                f"client '{self.name}' uses {names}, which "
                + ("are" if len(self.missing) > 1 else "is")
                + " not set",
                where=self.where or None,
                hint=f"export {self.missing[0]}=... or add it to the .env of the config directory",
            )


@dataclass(frozen=True)
class ResolvedModel:
    """A model id resolved to what a provider needs to call it."""

    provider: str  # wire protocol: "openai" or "anthropic"
    model: str  # the name the server is sent
    base_url: str
    api_key: str | None = field(repr=False)
    client_name: str
    max_output_tokens: int | None = None
    reasoning_effort: str | None = None  # the model entry's default
    #: Merged into the request body (a models table's ``patch.body``; null deletes).
    body_patch: Mapping[str, Any] | None = None

    @property
    def model_id(self) -> str:
        """``client:model`` as resolved (what ``LlmCalled.model`` records)."""
        return f"{self.client_name}:{self.model}"


@dataclass(frozen=True)
class LlmConfig:
    """All known clients; resolves ``provider:model`` ids."""

    clients: Mapping[str, ClientConfig]
    aliases: Mapping[str, str] = field(default_factory=dict)  # client name -> client name
    source: str = ""  # the config file read, if any
    #: config.yaml's ``model:`` — the last link of Loki's default-model chain.
    default_model: str | None = None
    #: Model tables by provider (:mod:`graphrun.actors.llm.models`).
    models: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def model_info(self, client: ClientConfig, model: str) -> Any:
        """The models-table entry for ``model`` of ``client`` (None when none lists it)."""
        providers = [client.name, client.kind]
        if client.provider == "anthropic":
            providers.append("claude")
        for provider in providers:
            found = self.models.get(provider, {}).get(model)
            if found is not None:
                return found
        return None

    def known(self) -> list[str]:
        """Every client name a model id may start with, sorted."""
        return sorted({*self.clients, *self.aliases})

    def client(self, name: str) -> ClientConfig:
        """The client called ``name`` (or that ``name`` aliases)."""
        target = name if name in self.clients else self.aliases.get(name, name)
        try:
            return self.clients[target]
        except KeyError:
            where = f" in {self.source}" if self.source else ""
            raise LlmConfigError(
                f"unknown LLM provider or client '{name}'; known: {', '.join(self.known())}",
                hint=f"use provider:model with one of those, or add a client named "
                f"'{name}' under clients:{where or ' in config.yaml'}",
            ) from None

    def resolve(self, model_id: str) -> ResolvedModel:
        """Resolve ``provider:model`` (``model`` may itself contain ``:``)."""
        name, sep, model = model_id.partition(":")
        if not sep or not name or not model:
            raise LlmConfigError(
                f"model '{model_id}' is not a provider:model id",
                hint=f"write it as e.g. openai:gpt-4o-mini; known providers: "
                f"{', '.join(self.known())}",
            )
        client = self.client(name)
        client.check_usable()
        entry = client.models.get(model)
        if entry is None and (info := self.model_info(client, model)) is not None:
            # A models table: its alias, the limit it requires, its request patch.
            return ResolvedModel(
                provider=client.provider,
                model=info.real_name or info.name,
                base_url=client.base_url,
                api_key=client.api_key,
                client_name=client.name,
                max_output_tokens=info.max_output_tokens if info.require_max_tokens else None,
                reasoning_effort=info.reasoning_effort,
                body_patch=info.body_patch,
            )
        return ResolvedModel(
            provider=client.provider,
            model=(entry.real_name or entry.name) if entry else model,
            base_url=client.base_url,
            api_key=client.api_key,
            client_name=client.name,
            max_output_tokens=entry.max_output_tokens if entry else None,
            reasoning_effort=entry.reasoning_effort if entry else None,
        )

    def check_ready(self, model_id: str) -> None:
        """Raise :class:`LlmConfigError` if ``model_id`` cannot be called as configured.

        The message names the missing variable, never a key's value.
        """
        resolved = self.resolve(model_id)
        client = self.client(model_id.partition(":")[0])
        if client.key_required and not resolved.api_key:
            raise LlmConfigError(
                f"model '{model_id}' needs an API key but {client.key_env} is not set",
                hint=f"export {client.key_env}=... or set api_key for client "
                f"'{client.name}' in config.yaml",
            )


def load_llm_config(config_dir: Path | None, *, env: Mapping[str, str] | None = None) -> LlmConfig:
    """The built-in clients plus those in ``<config_dir>/config.yaml`` (if it exists).

    ``env`` defaults to ``os.environ``; it is read once, here.
    """
    from graphrun.actors import secrets

    environ: Mapping[str, str] = os.environ if env is None else env
    secrets.register_environment(environ)
    clients: dict[str, ClientConfig] = {}
    openai_base = environ.get("OPENAI_BASE_URL") or ""
    clients["openai"] = ClientConfig(
        name="openai",
        provider="openai",
        base_url=openai_base or OPENAI_DEFAULT_BASE_URL,
        api_key=environ.get("OPENAI_API_KEY") or None,
        key_env="OPENAI_API_KEY",
        key_required=not openai_base,
    )
    anthropic_base = environ.get("ANTHROPIC_BASE_URL") or ""
    clients["anthropic"] = ClientConfig(
        name="anthropic",
        provider="anthropic",
        base_url=anthropic_base or ANTHROPIC_DEFAULT_BASE_URL,
        api_key=environ.get("ANTHROPIC_API_KEY") or None,
        key_env="ANTHROPIC_API_KEY",
        key_required=not anthropic_base,
    )
    aliases = {"claude": "anthropic"}
    source = ""
    default_model: str | None = None
    path = Path(config_dir) / "config.yaml" if config_dir is not None else None
    if path is not None and path.is_file():
        source = str(path)
        from graphrun.actors.tools.lokienv import dotenv_values

        # {{NAME}} comes from the environment, else from the config dir's .env.
        environ = {**dotenv_values(path.parent / ".env"), **environ}
        configured, default_model = _read_clients(path, environ, clients)
        for client in configured:
            clients[client.name] = client
            aliases.pop(client.name, None)
        # "anthropic:" (and "claude:") mean the configured Claude client, unless
        # one is explicitly named so.
        claude = next((c for c in configured if c.provider == "anthropic"), None)
        if claude is not None:
            for name in ("anthropic", "claude"):
                if all(c.name != name for c in configured):
                    clients.pop(name, None)
                    aliases[name] = claude.name
    secrets.register_values(*(c.api_key for c in clients.values()))
    secrets.register_values(*(secrets.password_of(c.base_url) for c in clients.values()))
    from graphrun.actors.llm.models import load_tables

    return LlmConfig(
        clients=clients,
        aliases=aliases,
        source=source,
        default_model=default_model,
        models=load_tables(config_dir),
    )


def _read_clients(
    path: Path, environ: Mapping[str, str], builtin: Mapping[str, ClientConfig]
) -> tuple[list[ClientConfig], str | None]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise LlmConfigError(f"config file is not valid YAML: {problem}", where=where) from None
    except OSError as exc:
        raise LlmConfigError(f"cannot read config file: {exc.strerror}", where=str(path)) from None
    if data is None:
        return [], None
    if not isinstance(data, dict):
        raise LlmConfigError("config file must be a mapping", where=str(path))
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise LlmConfigError("'model' must be a provider:model string", where=f"{path} ($.model)")
    raw_clients = data.get("clients") or []
    if not isinstance(raw_clients, list):
        raise LlmConfigError("'clients' must be a list", where=f"{path} ($.clients)")
    clients = [
        _client(raw, f"{path} ($.clients[{index}])", environ, builtin)
        for index, raw in enumerate(raw_clients)
    ]
    return clients, model or None


def _fill(value: Any, environ: Mapping[str, str], missing: list[str]) -> str | None:
    """A config value with ``{{NAME}}`` taken from ``environ`` (missing names collected)."""
    if value is None or value == "":
        return None
    text = str(value)
    from graphrun.actors import secrets

    names = _PLACEHOLDER.findall(text)
    secrets.add_key_names(names)

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in environ:
            return environ[name]
        missing.append(name)
        return ""

    return _PLACEHOLDER.sub(sub, text) or None


def _client(
    raw: Any, where: str, environ: Mapping[str, str], builtin: Mapping[str, ClientConfig]
) -> ClientConfig:
    if not isinstance(raw, dict):
        raise LlmConfigError("each client must be a mapping", where=where)
    kind = str(raw.get("type", ""))
    if not kind:
        raise LlmConfigError("each client needs a type", where=where)
    name = raw.get("name") or _DEFAULT_NAMES.get(kind) or kind
    if not isinstance(name, str):
        raise LlmConfigError(f"a client of type '{kind}' needs a name", where=where)
    if kind not in _CLIENT_TYPES:
        # Loki's other client types load; calling one is the error (see check_usable).
        return ClientConfig(name=name, provider=UNSUPPORTED, base_url="", kind=kind, where=where)
    provider = _CLIENT_TYPES[kind]
    missing: list[str] = []
    key_env = _key_env(name)
    fallback_env = {"openai": "OPENAI_API_KEY", "claude": "ANTHROPIC_API_KEY"}.get(kind, "")
    if kind == "anthropic":
        fallback_env = "ANTHROPIC_API_KEY"
    api_key = _fill(raw.get("api_key"), environ, missing) or environ.get(key_env) or None
    if api_key is None and fallback_env:
        api_key = environ.get(fallback_env) or None
    api_base = _fill(raw.get("api_base"), environ, missing)
    if kind == "gemini":
        base = (api_base or GEMINI_DEFAULT_BASE_URL).rstrip("/")
        api_base = base if base.endswith("/openai") else f"{base}/openai"
    elif kind == "azure-openai" and api_base:
        base = api_base.rstrip("/")
        api_base = base if base.endswith("/openai/v1") else f"{base}/openai/v1"
    problem = ""
    if kind in ("openai-compatible", "azure-openai") and not api_base and not missing:
        example = {
            "azure-openai": "https://<resource>.openai.azure.com",
            "openai-compatible": "http://localhost:11434/v1",
        }[kind]
        problem = f"needs api_base (e.g. api_base: {example})"
    if api_base:
        base_url = str(api_base).rstrip("/")
        if provider == "anthropic" and base_url.endswith("/v1"):
            base_url = base_url[: -len("/v1")]  # Loki writes .../v1; we append /v1/messages
    else:
        base_url = (
            builtin[provider].base_url
            if provider in builtin
            else (OPENAI_DEFAULT_BASE_URL if provider == "openai" else ANTHROPIC_DEFAULT_BASE_URL)
        )
    official = base_url in (OPENAI_DEFAULT_BASE_URL, ANTHROPIC_DEFAULT_BASE_URL)
    return ClientConfig(
        name=name,
        provider=provider,
        base_url=base_url,
        api_key=str(api_key) if api_key else None,
        key_env=key_env,
        key_required=(official and kind != "openai-compatible") or kind in ("gemini",),
        models=_models(raw.get("models"), where),
        kind=kind,
        where=where,
        missing=tuple(dict.fromkeys(missing)),
        problem=problem,
    )


def _models(raw: Any, where: str) -> dict[str, ModelEntry]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise LlmConfigError("'models' must be a list", where=f"{where}.models")
    models: dict[str, ModelEntry] = {}
    for index, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise LlmConfigError("each model needs a name", where=f"{where}.models[{index}]")
        models[item["name"]] = ModelEntry(
            name=item["name"],
            real_name=item.get("real_name") or None,
            max_input_tokens=_int_or_none(item.get("max_input_tokens")),
            max_output_tokens=_int_or_none(item.get("max_output_tokens")),
            # Loki's model entries say default_reasoning_effort.
            reasoning_effort=_str_or_none(
                item.get("reasoning_effort") or item.get("default_reasoning_effort")
            ),
        )
    return models


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _key_env(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", name).upper() + "_API_KEY"


__all__ = [
    "ANTHROPIC_DEFAULT_BASE_URL",
    "GEMINI_DEFAULT_BASE_URL",
    "OPENAI_DEFAULT_BASE_URL",
    "UNSUPPORTED",
    "ClientConfig",
    "LlmConfig",
    "LlmConfigError",
    "ModelEntry",
    "ResolvedModel",
    "load_llm_config",
]
