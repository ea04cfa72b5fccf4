"""The HTTP client a run's rag requests are awaited with, kept with its event loop.

A query's embedding request (and a reranker's) is awaited on the run's
:class:`~graphrun.actors.loop.EffectLoop` with the live client kept for the
loop's life (:func:`graphrun.actors.llm.client.loop_client`): aiohttp, on the
session the run's llm calls use there, so one pool of connections serves both,
and a live run imports no httpx for it. The loop closes it when it stops. The
blocking paths (``graphrun rag rebuild``, a knowledge base built at load time)
use ``httpx.Client``; both send the same requests, read the answers through the
same code and name a failure alike.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphrun.actors.loop import EffectLoop


def loop_client(loop: EffectLoop) -> Any:
    """The client kept with ``loop`` for rag requests (made on first use); to be
    awaited on that loop only, with :func:`post_awaited`."""
    from graphrun.actors.llm.client import loop_client as kept

    return kept(loop)


async def post_awaited(
    client: Any, url: str, *, content: bytes, headers: Any, timeout: float
) -> Any:
    """A ``POST`` awaited with the loop's client: the response, read in full. A
    failure is raised as the httpx exception a blocking request raises (see
    :func:`http_failure`); cancelling the awaiting task cancels the request and
    ends the task cancelled."""
    return await client.post_async(
        url,
        content=content,
        headers=headers,
        timeout=(timeout, timeout),
        cancelled_as_read_error=False,
    )


def http_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is an HTTP failure (httpx's, as either path raises it), not a
    bug or an interrupt. httpx is imported here, on a failure only."""
    import httpx

    return isinstance(exc, httpx.HTTPError)


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
    import httpx

    from graphrun.actors.llm.client import system_error

    if isinstance(exc, httpx.ConnectError):
        return system_error(exc) or str(exc)
    return str(exc)


def tls() -> Any:
    """The process's one TLS context (loading the CA bundle again per client is slow)."""
    from graphrun.actors.llm.client import shared_ssl_context

    return shared_ssl_context()


__all__ = ["describe", "http_failure", "json_post", "loop_client", "post_awaited", "tls"]
