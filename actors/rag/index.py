"""Hybrid search over a knowledge base's chunks: vectors + keywords, fused.

- Vectors: an hnswlib index in cosine space (HNSW, approximate).
- Keywords: rank-bm25's ``BM25Okapi`` over a simple lowercase word tokenizer.
- Fusion: weighted reciprocal rank fusion as Loki does it (its ``hybird_search``):
  each retriever returns its ``top_k`` best chunks (scores must be positive), a
  chunk's fused score is ``sum(weight / (rrf_k + rank))`` over the lists it is
  in (rank from 1), with vector weight 1.125, keyword weight 1.0 and
  ``rrf_k = 2 * top_k`` (Loki's constant, not the 60 of the RRF paper: a small
  constant gives the head of each list more say, which suits short lists).
- Reranking (optional, replaces fusion as in Loki): the union of both candidate
  lists goes to a Jina/Cohere/Voyage-style ``POST /rerank`` endpoint and its
  order is kept (:meth:`Reranker.rerank` blocks; :meth:`Reranker.rerank_async`
  is awaited on a run's event loop).

numpy, hnswlib and rank_bm25 are imported when an index is built or loaded.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphrun.actors.rag.http import describe, http_failure, json_post, post_awaited, tls
from graphrun.actors.rag.loaders import RagError

if TYPE_CHECKING:
    import numpy as np

VECTOR_WEIGHT = 1.125
KEYWORD_WEIGHT = 1.0

#: HNSW parameters. M=16/ef_construction=200 are hnswlib's recommended
#: defaults; the search ef adapts to k (see HybridIndex.vector_search).
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 200
HNSW_EF_SEARCH = 100

_TOKEN = re.compile(r"\w+")
_HTTP_TIMEOUT_S = 60.0


def tokenize(text: str) -> list[str]:
    """Lowercase word tokens (the keyword index's tokenizer)."""
    return _TOKEN.findall(text.lower())


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[int]],
    weights: Sequence[float],
    top_k: int,
    *,
    rrf_k: float | None = None,
) -> list[tuple[int, float]]:
    """Fuse ranked id lists into one, best first, at most ``top_k`` long.

    Args:
        rankings: Each a list of ids, best first.
        weights: One weight per ranking.
        top_k: How many fused ids to return.
        rrf_k: The rank-damping constant; defaults to ``2 * top_k`` (Loki).

    Returns:
        ``(id, fused score)`` pairs; ties keep first-seen order.
    """
    k = float(2 * top_k if rrf_k is None else rrf_k)
    scores: dict[int, float] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + weight / (k + rank)
    fused = sorted(scores.items(), key=lambda kv: -kv[1])  # stable: ties keep insertion order
    return fused[:top_k]


@dataclass
class HybridIndex:
    """Vector + keyword search over a fixed list of chunk texts."""

    texts: list[str]
    vectors: np.ndarray
    hnsw: Any
    bm25: KeywordIndex | None

    @classmethod
    def build(
        cls,
        texts: list[str],
        vectors: np.ndarray,
        *,
        m: int = HNSW_M,
        ef_construction: int = HNSW_EF_CONSTRUCTION,
    ) -> HybridIndex:
        """Index ``vectors`` (row i belongs to ``texts[i]``) and the texts' words."""
        return cls(
            texts=texts,
            vectors=vectors,
            hnsw=build_hnsw(vectors, m=m, ef_construction=ef_construction),
            bm25=build_bm25(texts),
        )

    @classmethod
    def load(cls, texts: list[str], vectors: np.ndarray, hnsw_path: Path | None) -> HybridIndex:
        """Open a saved HNSW index (or rebuild it from the vectors if there is none)."""
        if hnsw_path is not None and hnsw_path.exists():
            hnsw = load_hnsw(hnsw_path, dim=vectors.shape[1], count=vectors.shape[0])
        else:
            hnsw = build_hnsw(vectors)
        return cls(texts=texts, vectors=vectors, hnsw=hnsw, bm25=build_bm25(texts))

    def save_hnsw(self, path: Path) -> None:
        """Write the HNSW graph to ``path`` (not needed for an empty index)."""
        if self.hnsw is not None:
            self.hnsw.save_index(str(path))

    def vector_search(self, query_vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        """The ``k`` nearest chunks by cosine similarity, score > 0, best first."""
        n = len(self.texts)
        k = min(k, n)
        if k <= 0 or self.hnsw is None or not query_vector.any():
            return []
        self.hnsw.set_ef(max(HNSW_EF_SEARCH, 2 * k))
        labels, distances = self.hnsw.knn_query(query_vector.reshape(1, -1), k=k)
        hits = []
        for label, distance in zip(labels[0], distances[0], strict=True):
            score = 1.0 - float(distance)
            if score > 0.0:
                hits.append((int(label), score))
        return hits

    def keyword_search(self, query: str, k: int) -> list[tuple[int, float]]:
        """The ``k`` best chunks by BM25, score > 0, best first."""
        tokens = tokenize(query)
        if not tokens or self.bm25 is None or k <= 0:
            return []
        import numpy as np

        scores = self.bm25.get_scores(tokens)
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.lexsort((top, -scores[top]))]  # by score, then by position
        return [(int(i), float(scores[i])) for i in top if scores[i] > 0.0]

    def hybrid_search(
        self,
        query: str,
        query_vector: np.ndarray,
        top_k: int,
        *,
        reranker: Reranker | None = None,
    ) -> list[tuple[int, float]]:
        """Loki's hybrid search: RRF of vector and keyword results, or a rerank of both."""
        if reranker is None:
            return self.fused_search(query, query_vector, top_k)
        candidates = self.candidates(query, query_vector, top_k)
        if not candidates:
            return []
        ranked = reranker.rerank(query, [self.texts[i] for i in candidates], top_k)
        return reranked(candidates, ranked, top_k)

    def fused_search(
        self, query: str, query_vector: np.ndarray, top_k: int
    ) -> list[tuple[int, float]]:
        """The hybrid search without a reranker: RRF of vector and keyword results."""
        rankings = self._rankings(query, query_vector, top_k)
        return reciprocal_rank_fusion(rankings, [VECTOR_WEIGHT, KEYWORD_WEIGHT], top_k)

    def candidates(self, query: str, query_vector: np.ndarray, top_k: int) -> list[int]:
        """What a reranker orders: the union of both retrievers' ``top_k``, vector first."""
        vector_ids, keyword_ids = self._rankings(query, query_vector, top_k)
        return list(dict.fromkeys(vector_ids + keyword_ids))

    def _rankings(
        self, query: str, query_vector: np.ndarray, top_k: int
    ) -> tuple[list[int], list[int]]:
        """The vector and the keyword retriever's ``top_k`` chunk numbers, best first."""
        vector_ids = [i for i, _ in self.vector_search(query_vector, top_k)]
        keyword_ids = [i for i, _ in self.keyword_search(query, top_k)]
        return vector_ids, keyword_ids


def reranked(
    candidates: list[int], ranked: list[tuple[int, float]], top_k: int
) -> list[tuple[int, float]]:
    """A reranker's answer (indices into ``candidates``) as chunk numbers, best first."""
    return [(candidates[index], score) for index, score in ranked[:top_k]]


def build_hnsw(
    vectors: np.ndarray, *, m: int = HNSW_M, ef_construction: int = HNSW_EF_CONSTRUCTION
) -> Any:
    """An hnswlib cosine index over the rows of ``vectors`` (labels = row numbers).

    Built on one thread so the same vectors always give the same graph.
    """
    if vectors.shape[0] == 0:
        return None
    import hnswlib  # type: ignore[import-untyped]
    import numpy as np

    index = hnswlib.Index(space="cosine", dim=int(vectors.shape[1]))
    index.init_index(max_elements=int(vectors.shape[0]), ef_construction=ef_construction, M=m)
    index.set_num_threads(1)
    index.add_items(vectors, np.arange(vectors.shape[0]))
    return index


def load_hnsw(path: Path, *, dim: int, count: int) -> Any:
    """Open a saved hnswlib index and check it holds ``count`` vectors."""
    if count == 0:
        return None
    import hnswlib

    index = hnswlib.Index(space="cosine", dim=dim)
    index.load_index(str(path), max_elements=count)
    if index.get_current_count() != count:
        raise ValueError(f"index holds {index.get_current_count()} vectors, expected {count}")
    index.set_num_threads(1)
    return index


def build_bm25(texts: Sequence[str]) -> KeywordIndex | None:
    """A BM25Okapi keyword index of the texts (None when there are none)."""
    return KeywordIndex(texts) if texts else None


class KeywordIndex:
    """rank-bm25's ``BM25Okapi`` statistics, scored through an inverted index.

    ``BM25Okapi.get_scores`` walks every document for every query token in
    Python (about 15 ms for 10,000 chunks); scoring only the documents that
    contain a token, from the same idf, k1, b and lengths, gives identical
    scores in a fraction of that.
    """

    def __init__(self, texts: Sequence[str]):
        import numpy as np
        from rank_bm25 import BM25Okapi  # type: ignore[import-untyped]

        # rank_bm25 divides by the corpus length; a chunk with no word tokens is
        # indexed as a placeholder token so positions still line up with texts.
        self.bm25 = BM25Okapi([tokenize(t) or ["\x00"] for t in texts])
        bm = self.bm25
        lengths = np.asarray(bm.doc_len, dtype=np.float64)
        self._norm = bm.k1 * (1 - bm.b + bm.b * lengths / bm.avgdl)
        postings: dict[str, tuple[list[int], list[int]]] = {}
        for doc, freqs in enumerate(bm.doc_freqs):
            for token, freq in freqs.items():
                ids, counts = postings.setdefault(token, ([], []))
                ids.append(doc)
                counts.append(freq)
        self._postings = {
            token: (np.asarray(ids, dtype=np.int64), np.asarray(counts, dtype=np.float64))
            for token, (ids, counts) in postings.items()
        }
        self._size = len(texts)

    def get_scores(self, tokens: Sequence[str]) -> np.ndarray:
        """BM25 score of every document for the query tokens (as ``BM25Okapi``)."""
        import numpy as np

        k1 = self.bm25.k1
        scores = np.zeros(self._size, dtype=np.float64)
        for token in tokens:
            posting = self._postings.get(token)
            if posting is None:
                continue
            ids, freqs = posting
            idf = self.bm25.idf.get(token) or 0.0
            scores[ids] += idf * (freqs * (k1 + 1) / (freqs + self._norm[ids]))
        return scores


# --- reranking ---------------------------------------------------------------------

_RERANK_DEFAULT_URLS = {
    "cohere": "https://api.cohere.com/v2",
    "jina": "https://api.jina.ai/v1",
    "voyage": "https://api.voyageai.com/v1",
}


class Reranker:
    """A ``POST {base_url}/rerank`` client (Jina, Cohere, Voyage and compatible servers).

    Request ``{model, query, documents, top_n}``; response
    ``{results: [{index, relevance_score}]}`` (Voyage's ``{data: [...]}`` too).
    """

    def __init__(
        self,
        *,
        model_id: str,
        model: str,
        base_url: str,
        api_key: str | None,
        node_id: str | None = None,
    ):
        self.model_id = model_id
        self.model = model
        self.url = base_url.rstrip("/") + "/rerank"
        self.api_key = api_key
        self.node_id = node_id

    def rerank(self, query: str, documents: list[str], top_n: int) -> list[tuple[int, float]]:
        """Indices into ``documents`` with relevance scores, best first.

        Raises:
            RagError: the endpoint fails or answers with something unusable.
        """
        import httpx

        try:
            response = httpx.post(self.url, **self._request(query, documents, top_n), verify=tls())
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        return self._ranked(response, documents)

    async def rerank_async(
        self, client: Any, query: str, documents: list[str], top_n: int
    ) -> list[tuple[int, float]]:
        """:meth:`rerank`, awaited with ``client`` (the loop's:
        :func:`~graphrun.actors.rag.http.loop_client`) on its event loop; cancelling
        the awaiting task cancels the request."""
        try:
            response = await post_awaited(
                client, self.url, **self._request(query, documents, top_n)
            )
        except Exception as exc:
            if not http_failure(exc):
                raise
            raise self._unreachable(exc) from None
        return self._ranked(response, documents)

    def _request(self, query: str, documents: list[str], top_n: int) -> dict[str, Any]:
        """The keyword arguments of the POST."""
        payload: dict[str, Any] = {
            "model": self.model,
            "query": query,
            "documents": documents,
            "top_n": top_n,
        }
        if "voyage" in self.model_id.split(":")[0]:
            payload["top_k"] = payload.pop("top_n")
        return json_post(payload, self.api_key, _HTTP_TIMEOUT_S)

    def _unreachable(self, exc: Exception) -> RagError:
        return RagError(
            f"rerank endpoint {self.url} could not be reached: {describe(exc)}",
            node_id=self.node_id,
        )

    def _ranked(self, response: Any, documents: list[str]) -> list[tuple[int, float]]:
        """The endpoint's answer as ``(index, score)`` pairs, best first."""
        if response.status_code >= 400:
            raise RagError(
                f"rerank endpoint {self.url} returned HTTP {response.status_code}: "
                f"{' '.join(response.text.split())[:200]}",
                node_id=self.node_id,
                hint="check reranker_model and the API key",
            )
        try:
            body = response.json()
            results = body["results"] if "results" in body else body["data"]
            ranked = [(int(r["index"]), float(r["relevance_score"])) for r in results]
        except (ValueError, KeyError, TypeError):
            raise RagError(
                f"rerank endpoint {self.url} returned a response without "
                f"results[{{index, relevance_score}}]",
                node_id=self.node_id,
            ) from None
        if any(not 0 <= i < len(documents) for i, _ in ranked):
            raise RagError(
                f"rerank endpoint {self.url} returned an index outside 0..{len(documents) - 1}",
                node_id=self.node_id,
            )
        ranked.sort(key=lambda r: -r[1])
        return ranked


def make_reranker(
    model_id: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    node_id: str | None = None,
) -> Reranker:
    """Build the reranker a ``<client>:<model>`` id names.

    The base URL is ``base_url``, else ``$<CLIENT>_BASE_URL``, else the client's
    public API for cohere/jina/voyage, else ``$OPENAI_BASE_URL``; the key is
    ``$<CLIENT>_API_KEY``, else ``$OPENAI_API_KEY``.
    """
    client, sep, model = model_id.partition(":")
    if not sep or not client or not model:
        raise RagError(
            f"reranker_model '{model_id}' is not of the form <client>:<model>",
            node_id=node_id,
            hint="e.g. jina:jina-reranker-v2-base-multilingual",
        )
    env = client.upper().replace("-", "_")
    url = (
        base_url
        or os.environ.get(f"{env}_BASE_URL")
        or _RERANK_DEFAULT_URLS.get(client)
        or os.environ.get("OPENAI_BASE_URL")
    )
    if not url:
        raise RagError(
            f"reranker_model '{model_id}': no base URL for client '{client}'",
            node_id=node_id,
            hint=f"set {env}_BASE_URL to the API that serves POST /rerank",
        )
    key = api_key
    if key is None:
        key = os.environ.get(f"{env}_API_KEY") or os.environ.get("OPENAI_API_KEY")
    return Reranker(model_id=model_id, model=model, base_url=url, api_key=key, node_id=node_id)
