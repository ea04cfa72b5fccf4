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


def tls() -> Any:
    """The process's one TLS context (loading the CA bundle again per client is slow)."""
    from graphrun.actors.llm.client import shared_ssl_context

    return shared_ssl_context()


__all__ = ["loop_client", "tls"]
