"""The app-level rag defaults: a config.yaml with ``rag_embedding_model: null`` (Loki's
example) still lets a rag node that sets its chunking build with no terminal."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphrun.actors.rag.retrieval import KbConfig, RagError, kb_file, load_or_build
from graphrun.runtime.nodes.rag import DEFAULT_EMBEDDING_MODEL, rag_defaults


def test_no_embedding_model_means_the_offline_embedder(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("rag_embedding_model: null\nrag_top_k: 3\n")
    assert rag_defaults(tmp_path) == {
        "rag_embedding_model": DEFAULT_EMBEDDING_MODEL,
        "rag_top_k": 3,
    }
    assert rag_defaults(None) == {"rag_embedding_model": "local:hash-384"}
    (tmp_path / "config.yaml").write_text("rag_embedding_model: emb:small\n")
    assert rag_defaults(tmp_path) == {"rag_embedding_model": "emb:small"}


def test_a_node_with_its_chunking_builds_without_a_terminal(tmp_path: Path) -> None:
    (tmp_path / "knowledge").mkdir()
    (tmp_path / "knowledge" / "a.md").write_text("Collimation aligns the optics of a telescope.")
    (tmp_path / "config.yaml").write_text("rag_embedding_model: null\n")
    cfg = KbConfig(documents=["./knowledge/"], chunk_size=1000, chunk_overlap=100)
    kb = load_or_build(
        tmp_path, "lookup", cfg, interactive=False, ask=None, rag_defaults=rag_defaults(tmp_path)
    )
    assert kb_file(tmp_path, "lookup").exists()
    assert "Collimation" in kb.query("collimation").context


def test_a_node_without_its_chunking_is_still_an_error(tmp_path: Path) -> None:
    (tmp_path / "knowledge").mkdir()
    cfg = KbConfig(documents=["./knowledge/"])
    with pytest.raises(RagError, match="does not say how to build it"):
        load_or_build(
            tmp_path, "lookup", cfg, interactive=False, ask=None, rag_defaults=rag_defaults(None)
        )
