"""The HTTP client a run's rag requests are awaited with, kept with its event loop.

A query's embedding request (and a reranker's) is awaited on the run's
:class:`~graphrun.actors.loop.EffectLoop`, with one ``httpx.AsyncClient`` kept
for the loop's life (:meth:`EffectLoop.keep`): its connections are reused by
every rag visit of the run, its child runs, or a worker's runs, and it is closed
when the loop stops. The blocking paths (``graphrun rag rebuild``, a knowledge
base built at load time) use ``httpx.Client``; both send the same requests and
read the answers through the same code, so they fail alike.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

    from graphrun.actors.loop import EffectLoop

#: The key of the client in :meth:`EffectLoop.keep`.
_KEY = ("httpx.AsyncClient", "rag")


class _Kept:
    """The loop's client, closed by :meth:`EffectLoop.stop` (an async ``close``)."""

    def __init__(self) -> None:
        import httpx

        self.client = httpx.AsyncClient(verify=tls())

    async def close(self) -> None:
        await self.client.aclose()


def loop_client(loop: EffectLoop) -> httpx.AsyncClient:
    """The ``httpx.AsyncClient`` kept with ``loop`` for rag requests (made on first
    use); to be awaited on that loop only."""
    kept: _Kept = loop.keep(_KEY, _Kept)
    return kept.client


def json_post(payload: Any, api_key: str | None, timeout: float) -> dict[str, Any]:
    """The keyword arguments of a JSON ``POST`` (``client.post(url, **them)``, blocking
    or awaited): the body as compact UTF-8 JSON bytes, a bearer key if there is one."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    content = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return {"content": content.encode("utf-8"), "headers": headers, "timeout": timeout}


def describe(exc: Exception) -> str:
    """What an httpx failure says, the same whether the request blocked or was
    awaited: a connection that failed is named by the system's error
    (``[Errno 111] Connection refused``), as a blocking connect names it, where the
    async transport says only ``All connection attempts failed``. A TLS failure is
    named by what TLS said (its errno is OpenSSL's reason, not a system error)."""
    import ssl

    import httpx

    if isinstance(exc, httpx.ConnectError):
        found = _os_error(exc)
        if found is not None and found.errno is not None and not isinstance(found, ssl.SSLError):
            code = found.errno
            return f"[Errno {code}] {os.strerror(code) if code > 0 else found.strerror}"
    return str(exc)


def _os_error(exc: BaseException) -> OSError | None:
    """The system error with an errno that ``exc`` comes from, if any: down its
    causes (the first of a group's), a bounded number of steps."""
    current: BaseException | None = exc
    for _ in range(16):
        if current is None:
            return None
        if isinstance(current, OSError) and current.errno is not None:
            return current
        if isinstance(current, BaseExceptionGroup):
            current = current.exceptions[0]
        else:
            current = current.__cause__ or current.__context__
    return None


def tls() -> Any:
    """The process's one TLS context (loading the CA bundle again per client is slow)."""
    from graphrun.actors.llm.client import shared_ssl_context

    return shared_ssl_context()


__all__ = ["describe", "json_post", "loop_client", "tls"]
