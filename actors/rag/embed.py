"""Embedders: text to unit-length float32 vectors.

Model ids are ``<client>:<model>``:

- ``openai:<model>`` calls ``POST $OPENAI_BASE_URL/embeddings`` (the base URL
  includes ``/v1``; default ``https://api.openai.com/v1``) with
  ``OPENAI_API_KEY``. Any other client name ``x`` speaks the same protocol to
  ``$X_BASE_URL`` with ``$X_API_KEY`` (Ollama, vLLM, LM Studio, ... all serve
  OpenAI-style embeddings). Inputs go in batches of ``batch_size``.
- ``local:hash-<dim>`` (``local:hash`` is ``local:hash-384``) needs no model, no
  download and no network: signed feature hashing of word unigrams and character
  trigrams, L2-normalised. It is lexical, not semantic, but deterministic across
  processes and platforms (blake2b, not Python's salted ``hash()``), which makes
  offline runs, tests and benchmarks possible.

Every embedder returns a ``(len(texts), dim)`` float32 array with unit rows, so
cosine similarity is a dot product. On a run's event loop, :func:`embed_async`
awaits an HTTP embedder's requests there and hands a local one's hashing (CPU)
to the run's executor.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from graphrun.actors.rag.http import describe, http_failure, json_post, post_awaited
from graphrun.actors.rag.http import tls as _tls
from graphrun.actors.rag.loaders import RagError

if TYPE_CHECKING:
    import numpy as np

DEFAULT_BATCH_SIZE = 64
DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
_HTTP_TIMEOUT_S = 120.0
_WORD = re.compile(r"\w+")

# Function words carry no topic; without IDF weighting (the embedder is
# stateless) they would dominate short queries, so they are not hashed.
_STOPWORDS = frozenset(
    [
        "a",
        "about",
        "above",
        "after",
        "again",
        "against",
        "all",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "because",
        "been",
        "before",
        "being",
        "below",
        "between",
        "both",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "down",
        "during",
        "each",
        "else",
        "few",
        "for",
        "from",
        "further",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "herself",
        "him",
        "himself",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "itself",
        "just",
        "me",
        "more",
        "most",
        "my",
        "myself",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "ours",
        "ourselves",
        "out",
        "over",
        "own",
        "same",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "themselves",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "very",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
    ]
)


#: ``offload(fn, *args)``: ``fn(*args)`` awaited on the run's bounded executor
#: (:func:`graphrun.actors.loop.blocking` bound to the effect's context).
Offload = Callable[..., Awaitable[Any]]


class Embedder(Protocol):
    """Turns texts into unit-length vectors."""

    model_id: str

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return a ``(len(texts), dim)`` float32 array of L2-normalised rows."""
        ...


async def embed_async(
    embedder: Embedder,
    texts: Sequence[str],
    *,
    client: Any,
    offload: Offload,
) -> np.ndarray:
    """``embedder.embed(texts)`` from a coroutine on a run's event loop: an HTTP
    embedder's requests awaited there with ``client``, anything else (the local
    hash embedder: CPU) through ``offload`` (the run's executor)."""
    if isinstance(embedder, OpenAIEmbedder):
        return await embedder.embed_async(texts, client)
    return await offload(embedder.embed, texts)


def make_embedder(
    model_id: str,
    *,
    batch_size: int | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    node_id: str | None = None,
) -> Embedder:
    """Build the embedder a ``<client>:<model>`` id names.

    Raises:
        RagError: the id is malformed, names an unknown local model, or names a
            client with no base URL configured.
    """
    client, sep, model = model_id.partition(":")
    if not sep or not client or not model:
        raise RagError(
            f"embedding_model '{model_id}' is not of the form <client>:<model>",
            node_id=node_id,
            hint="e.g. openai:text-embedding-3-small or local:hash-384",
        )
    if client == "local":
        return HashEmbedder(dim=_local_dim(model, model_id, node_id), model_id=model_id)
    env = client.upper().replace("-", "_")
    url = base_url or os.environ.get(f"{env}_BASE_URL")
    if url is None and client == "openai":
        url = DEFAULT_OPENAI_BASE_URL
    if url is None:
        raise RagError(
            f"embedding_model '{model_id}': no base URL for client '{client}'",
            node_id=node_id,
            hint=f"set {env}_BASE_URL to its OpenAI-compatible API (ending in /v1)",
        )
    key = api_key if api_key is not None else os.environ.get(f"{env}_API_KEY")
    return OpenAIEmbedder(
        model_id=model_id,
        model=model,
        base_url=url,
        api_key=key,
        batch_size=batch_size or DEFAULT_BATCH_SIZE,
        node_id=node_id,
    )


def client_embedder(
    model_id: str,
    *,
    config_dir: Path | None,
    batch_size: int | None = None,
    node_id: str | None = None,
) -> Embedder:
    """:func:`make_embedder`, reaching a ``<client>`` of the config directory's
    ``config.yaml`` (Loki's ``rag_embedding_model: <client>:<model>``) at its
    ``api_base`` with its ``api_key``; the environment's ``<CLIENT>_BASE_URL`` and
    ``<CLIENT>_API_KEY`` otherwise."""
    client, sep, _ = model_id.partition(":")
    base_url: str | None = None
    api_key: str | None = None
    if sep and client != "local" and config_dir is not None:
        from graphrun.actors.llm.config import load_llm_config

        found = load_llm_config(config_dir).clients.get(client)
        if found is not None and found.provider == "openai":  # the embeddings wire protocol
            base_url, api_key = found.base_url, found.api_key
    return make_embedder(
        model_id, batch_size=batch_size, base_url=base_url, api_key=api_key, node_id=node_id
    )


def _local_dim(model: str, model_id: str, node_id: str | None) -> int:
    if model == "hash":
        return 384
    match = re.fullmatch(r"hash-(\d+)", model)
    if match and 16 <= int(match.group(1)) <= 65536:
        return int(match.group(1))
    raise RagError(
        f"unknown local embedding model '{model_id}'",
        node_id=node_id,
        hint="the offline embedder is local:hash-<dim>, e.g. local:hash-384",
    )


class HashEmbedder:
    """Offline embeddings by signed feature hashing (no model, no network).

    Features: each lowercase word other than common English function words
    (weight 1) and each character trigram of the word padded with ``#`` (weight
    0.5, so morphological variants share features); term counts are damped with
    ``1 + log(tf)``. A feature's bucket
    and sign come from its blake2b digest, so vectors are identical in every
    process and on every platform.
    """

    def __init__(self, dim: int = 384, *, model_id: str | None = None):
        self.dim = dim
        self.model_id = model_id or f"local:hash-{dim}"
        self._cache: dict[str, tuple[list[int], list[float]]] = {}

    def _word_features(self, word: str) -> tuple[list[int], list[float]]:
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        keys = ["w:" + word]
        weights = [1.0]
        padded = f"#{word}#"
        for i in range(len(padded) - 2):
            keys.append("c:" + padded[i : i + 3])
            weights.append(0.5)
        buckets: list[int] = []
        signed: list[float] = []
        for key, weight in zip(keys, weights, strict=True):
            h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
            buckets.append(h % self.dim)
            signed.append(weight if (h >> 63) & 1 else -weight)
        if len(self._cache) < 500_000:  # bounded: vocabularies are finite, inputs may not be
            self._cache[word] = (buckets, signed)
        return buckets, signed

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts; an empty text gets the zero vector."""
        import numpy as np

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            words = _WORD.findall(text.lower())
            content = [w for w in words if w not in _STOPWORDS]
            counts: dict[str, int] = {}
            for word in content or words:  # a text of only function words keeps them
                counts[word] = counts.get(word, 0) + 1
            buckets: list[int] = []
            weights: list[float] = []
            for word, tf in counts.items():
                b, w = self._word_features(word)
                damp = 1.0 + math.log(tf)
                buckets.extend(b)
                weights.extend(x * damp for x in w)
            if buckets:
                vec = np.bincount(buckets, weights=weights, minlength=self.dim)
                norm = float(np.linalg.norm(vec))
                if norm > 0:
                    out[row] = vec / norm
        return out


class OpenAIEmbedder:
    """Embeddings over the OpenAI ``/embeddings`` wire protocol (httpx).

    :meth:`embed` blocks (a client of its own per call: callers off any event
    loop, such as ``graphrun rag rebuild``); :meth:`embed_async` is awaited on a
    run's event loop with that loop's client (:func:`loop_client`). Both send
    the same bytes and read the answer through the same code, so they fail
    with the same errors.
    """

    def __init__(
        self,
        *,
        model_id: str,
        model: str,
        base_url: str,
        api_key: str | None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        node_id: str | None = None,
    ):
        self.model_id = model_id
        self.model = model
        self.url = base_url.rstrip("/") + "/embeddings"
        self.api_key = api_key
        self.batch_size = max(1, batch_size)
        self.node_id = node_id
        self.requests = 0  # HTTP requests made, for progress and tests

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts in batches; every batch must return one vector per input.

        Raises:
            RagError: the endpoint fails, or returns the wrong number of vectors
                or vectors of inconsistent size.
        """
        import httpx

        rows = _Rows(self)
        if texts:
            with httpx.Client(timeout=_HTTP_TIMEOUT_S, verify=_tls()) as client:
                for batch in self._batches(texts):
                    try:
                        response = client.post(self.url, **self._request(batch))
                    except httpx.HTTPError as exc:
                        raise self._unreachable(exc) from None
                    rows.add(self._vectors(response, batch))
        return rows.array()

    async def embed_async(self, texts: Sequence[str], client: Any) -> np.ndarray:
        """:meth:`embed`, each batch an awaited request with ``client`` (the loop's:
        :func:`~graphrun.actors.rag.http.loop_client`) on its event loop; cancelling
        the awaiting task cancels the request in flight."""
        rows = _Rows(self)
        for batch in self._batches(texts):
            try:
                response = await post_awaited(client, self.url, **self._request(batch))
            except Exception as exc:
                if not http_failure(exc):
                    raise
                raise self._unreachable(exc) from None
            rows.add(self._vectors(response, batch))
        return rows.array()

    def _batches(self, texts: Sequence[str]) -> list[list[str]]:
        return [
            list(texts[start : start + self.batch_size])
            for start in range(0, len(texts), self.batch_size)
        ]

    def _request(self, batch: list[str]) -> dict[str, Any]:
        """The keyword arguments of the POST for one batch."""
        payload = {"model": self.model, "input": batch, "encoding_format": "float"}
        self.requests += 1
        return json_post(payload, self.api_key, _HTTP_TIMEOUT_S)

    def _unreachable(self, exc: Exception) -> RagError:
        return RagError(
            f"embedding endpoint {self.url} could not be reached: {describe(exc)}",
            node_id=self.node_id,
            hint="check the base URL (…_BASE_URL, ending in /v1) and that the server runs",
        )

    def _vectors(self, response: Any, batch: list[str]) -> list[list[float]]:
        """One batch's vectors from the endpoint's answer, in input order."""
        if response.status_code >= 400:
            raise RagError(
                f"embedding endpoint {self.url} returned HTTP {response.status_code}: "
                f"{_excerpt(response.text)}",
                node_id=self.node_id,
                hint="check the model name and the API key",
            )
        try:
            data = response.json()["data"]
            items = sorted(data, key=lambda d: d.get("index", 0)) if _has_index(data) else data
            vectors = [[float(x) for x in item["embedding"]] for item in items]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise RagError(
                f"embedding endpoint {self.url} returned a response that is not "
                f"OpenAI embeddings JSON: {_excerpt(response.text)}",
                node_id=self.node_id,
            ) from None
        if len(vectors) != len(batch):
            raise RagError(
                f"embedding endpoint returned {len(vectors)} vectors for {len(batch)} inputs "
                f"({self.url}, model '{self.model}')",
                node_id=self.node_id,
            )
        return vectors


class _Rows:
    """The vectors of an embedding call's batches, checked as they come, then
    L2-normalised into one float32 array."""

    def __init__(self, embedder: OpenAIEmbedder) -> None:
        self.embedder = embedder
        self.rows: list[list[float]] = []
        self.dim: int | None = None

    def add(self, vectors: list[list[float]]) -> None:
        for vec in vectors:
            if self.dim is None:
                self.dim = len(vec)
            if len(vec) != self.dim or self.dim == 0:
                raise RagError(
                    f"embedding endpoint {self.embedder.url} returned vectors of inconsistent "
                    f"size ({len(vec)} and {self.dim}) for model '{self.embedder.model}'",
                    node_id=self.embedder.node_id,
                )
        self.rows.extend(vectors)

    def array(self) -> np.ndarray:
        import numpy as np

        if not self.rows:
            return np.zeros((0, 0), dtype=np.float32)
        array = np.asarray(self.rows, dtype=np.float32)
        norms = np.linalg.norm(array, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return array / norms


def _has_index(data: list[Any]) -> bool:
    return all(isinstance(d, dict) and isinstance(d.get("index"), int) for d in data)


def _excerpt(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"
