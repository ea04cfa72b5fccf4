"""Which values are keys, which processes get them, and keeping them out of the log.

A *key variable* is an environment variable holding a credential graphrun was
configured with: ``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``, every ``<NAME>_API_KEY``,
and every variable a client in ``config.yaml`` names as ``{{NAME}}`` in its
``api_key`` or ``api_base``. Their values, the keys written literally in
``config.yaml`` and the passwords in base URLs' userinfo are registered with
:mod:`graphrun.eventstore.redaction`, so the store masks them (``***``) in
everything it records.

Processes (tools, scripts, MCP servers) get the environment without the key
variables, except those they declare they need: a Bash tool's ``# @env NAME``, a
``{{NAME}}`` or ``$NAME`` in an MCP server's configuration, or an explicit
``env:`` entry.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit, urlunsplit

from graphrun.eventstore import redaction

__all__ = [
    "add_key_names",
    "child_env",
    "is_key_name",
    "key_names",
    "password_of",
    "redact",
    "redact_url",
    "register_environment",
    "register_values",
]

_BUILTIN = frozenset({"OPENAI_API_KEY", "ANTHROPIC_API_KEY"})
_KEY_SUFFIX = re.compile(r"_API_KEY$")
_lock = threading.Lock()
_configured: set[str] = set()  # names config.yaml's clients reference


def add_key_names(names: Iterable[str]) -> None:
    """Treat these environment variables as keys too (names a client config references)."""
    with _lock:
        _configured.update(names)


def is_key_name(name: str) -> bool:
    """Whether the environment variable ``name`` holds a configured key."""
    return name in _BUILTIN or bool(_KEY_SUFFIX.search(name)) or name in _configured


def key_names(environ: Mapping[str, str] | None = None) -> list[str]:
    """The key variables set in ``environ`` (default: this process's environment)."""
    env = os.environ if environ is None else environ
    return sorted(name for name in env if is_key_name(name))


def register_values(*values: str | None) -> None:
    """Never record these values (see :mod:`graphrun.eventstore.redaction`)."""
    redaction.register(*values)


def register_environment(environ: Mapping[str, str] | None = None) -> None:
    """Register the values of every key variable, and the passwords in ``*_BASE_URL``
    / ``*_API_BASE`` variables, as secrets."""
    env = os.environ if environ is None else environ
    values: list[str | None] = [env[name] for name in key_names(env)]
    for name, value in env.items():
        if name.endswith(("_BASE_URL", "_API_BASE")):
            values.append(password_of(value))
    redaction.register(*values)


def password_of(url: str) -> str | None:
    """The password in ``url``'s userinfo, if any."""
    try:
        return urlsplit(url).password
    except ValueError:
        return None


def redact(value: object) -> object:
    """``value`` with every registered secret replaced by ``***``."""
    return redaction.redact(value)


@functools.lru_cache(maxsize=256)
def redact_url(url: str) -> str:
    """``url`` without the password of its userinfo (``https://user:***@host``; worked
    out once per URL)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:{redaction.MASK}@{host}"))


def child_env(needs: Iterable[str] = (), base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process: ``base`` (default: ours) without the key
    variables, except the ones named in ``needs``."""
    env = dict(os.environ if base is None else base)
    keep = set(needs)
    register_environment(env)
    for name in list(env):
        if name not in keep and is_key_name(name):
            del env[name]
    return env
