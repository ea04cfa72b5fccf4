"""Hybrid index: hnswlib vectors, BM25 keywords, Loki's weighted RRF."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graphrun.actors.rag.embed import HashEmbedder
from graphrun.actors.rag.index import (
    HybridIndex,
    make_reranker,
    reciprocal_rank_fusion,
    tokenize,
)

TEXTS = [
    "Varroa mites are treated with oxalic acid in winter.",
    "A sourdough starter doubles within eight hours of feeding.",
    "Bleed hydraulic disc brakes when the lever feels spongy.",
    "The Bortle scale rates how dark the night sky is.",
    "git bisect finds the commit that introduced a bug.",
    "Honey is harvested once the bees have capped the cells.",
]


@pytest.fixture(scope="module")
def index() -> HybridIndex:
    emb = HashEmbedder(256)
    return HybridIndex.build(TEXTS, emb.embed(TEXTS))


def test_rrf_uses_loki_weights_and_constant() -> None:
    fused = reciprocal_rank_fusion([[1, 2, 3], [3, 4]], [1.125, 1.0], top_k=3)
    k = 6  # 2 * top_k
    expected = {
        1: 1.125 / (k + 1),
        2: 1.125 / (k + 2),
        3: 1.125 / (k + 3) + 1.0 / (k + 1),
        4: 1.0 / (k + 2),
    }
    best = sorted(expected.items(), key=lambda kv: -kv[1])[:3]
    assert [i for i, _ in fused] == [i for i, _ in best] == [3, 1, 2]
    assert [s for _, s in fused] == pytest.approx([s for _, s in best])


def test_rrf_vector_weight_breaks_rank_ties() -> None:
    assert [i for i, _ in reciprocal_rank_fusion([[7], [8]], [1.125, 1.0], 2)] == [7, 8]


def test_tokenize() -> None:
    assert tokenize("Git's HEAD@{3}, re-base!") == ["git", "s", "head", "3", "re", "base"]


def test_vector_search_matches_exact_search(index: HybridIndex) -> None:
    query = HashEmbedder(256).embed(["mites oxalic acid winter treatment"])[0]
    hits = index.vector_search(query, 3)
    exact = np.argsort(-(index.vectors @ query))[:3]
    assert [i for i, _ in hits] == exact.tolist()
    assert hits[0][0] == 0
    assert hits[0][1] == pytest.approx(float(index.vectors[0] @ query), abs=1e-5)


def test_keyword_search_ranks_by_bm25(index: HybridIndex) -> None:
    hits = index.keyword_search("spongy brake lever", 10)
    assert hits[0][0] == 2
    assert all(score > 0 for _, score in hits)
    assert index.keyword_search("zebra", 3) == []


def test_hybrid_prefers_chunks_both_retrievers_found(index: HybridIndex) -> None:
    query = "when to harvest honey from capped cells"
    qv = HashEmbedder(256).embed([query])[0]
    hits = index.hybrid_search(query, qv, 2)
    assert hits[0][0] == 5
    assert len(hits) == 2


def test_k_larger_than_corpus_is_clamped(index: HybridIndex) -> None:
    qv = HashEmbedder(256).embed(["sky"])[0]
    assert len(index.vector_search(qv, 50)) <= len(TEXTS)


def test_saved_index_gives_the_same_answers(index: HybridIndex, tmp_path: Path) -> None:
    path = tmp_path / "index.hnsw"
    index.save_hnsw(path)
    loaded = HybridIndex.load(TEXTS, index.vectors, path)
    qv = HashEmbedder(256).embed(["night sky darkness"])[0]
    assert loaded.vector_search(qv, 4) == index.vector_search(qv, 4)


def test_reranker_base_url_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JINA_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    assert make_reranker("jina:jina-reranker-v2").url == "https://api.jina.ai/v1/rerank"
    assert make_reranker("local:bge").url == "http://127.0.0.1:1/v1/rerank"
    assert make_reranker("x:y", base_url="http://h/v2").url == "http://h/v2/rerank"


def test_keyword_scores_equal_rank_bm25(index: HybridIndex) -> None:
    from rank_bm25 import BM25Okapi

    reference = BM25Okapi([tokenize(t) for t in TEXTS])
    for query in ("honey bees capped cells", "the the git", "nothing matches"):
        assert index.bm25 is not None
        ours = index.bm25.get_scores(tokenize(query))
        assert np.allclose(ours, reference.get_scores(tokenize(query)))
