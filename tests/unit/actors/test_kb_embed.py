"""The offline hash embedder and embedder selection."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from graphrun.actors.rag.embed import HashEmbedder, OpenAIEmbedder, make_embedder
from graphrun.actors.rag.loaders import RagError

TEXTS = ["Varroa mites feed on honey bees.", "Sourdough starter needs feeding.", ""]


def test_vectors_are_unit_length_float32() -> None:
    vectors = HashEmbedder(384).embed(TEXTS)
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors[:2], axis=1), 1.0, atol=1e-6)
    assert not vectors[2].any()  # empty text: zero vector


def test_related_texts_are_closer() -> None:
    emb = HashEmbedder(384)
    query, bees, bread = emb.embed(["how to treat mites in a bee hive", TEXTS[0], TEXTS[1]])
    assert float(query @ bees) > float(query @ bread) + 0.1


def test_morphological_variants_share_features() -> None:
    a, b, c = HashEmbedder(256).embed(["crystallised", "crystallises", "bicycle"])
    assert float(a @ b) > 0.5 > float(a @ c)


def test_identical_in_another_process_with_another_hash_seed() -> None:
    code = (
        "import sys; from graphrun.actors.rag.embed import HashEmbedder;"
        "sys.stdout.write(HashEmbedder(64).embed([sys.argv[1]]).tobytes().hex())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, TEXTS[0]], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out == HashEmbedder(64).embed([TEXTS[0]]).tobytes().hex()


def test_known_vector_is_stable() -> None:
    # Pins the feature hashing: a change here would invalidate every stored knowledge base.
    vector = HashEmbedder(16).embed(["honey bee"])[0]
    r = 0.408
    expected = [0, r, 0, -r, r, 0, 0, 0, r, -r, 0, 0, 0, 0, 0, -r]
    assert np.round(vector, 3).tolist() == pytest.approx(expected)


def test_make_embedder_picks_by_client(monkeypatch: pytest.MonkeyPatch) -> None:
    assert make_embedder("local:hash").dim == 384  # type: ignore[attr-defined]
    assert make_embedder("local:hash-128").dim == 128  # type: ignore[attr-defined]
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1/")
    emb = make_embedder("openai:text-embedding-3-small", batch_size=7)
    assert isinstance(emb, OpenAIEmbedder)
    assert (emb.url, emb.model, emb.batch_size) == (
        "http://127.0.0.1:9/v1/embeddings",
        "text-embedding-3-small",
        7,
    )
    monkeypatch.setenv("OLLAMA_BASE_URL", "http://127.0.0.1:11434/v1")
    assert make_embedder("ollama:nomic-embed-text").url == (  # type: ignore[attr-defined]
        "http://127.0.0.1:11434/v1/embeddings"
    )


@pytest.mark.parametrize(
    ("model_id", "message"),
    [
        ("nomodel", "embedding_model 'nomodel' is not of the form <client>:<model>"),
        ("local:bert", "unknown local embedding model 'local:bert'"),
        ("mystery:m1", "embedding_model 'mystery:m1': no base URL for client 'mystery'"),
    ],
)
def test_bad_model_ids(model_id: str, message: str) -> None:
    with pytest.raises(RagError) as info:
        make_embedder(model_id, node_id="docs")
    assert info.value.message == f"rag node 'docs': {message}"
