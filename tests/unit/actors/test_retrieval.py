"""Knowledge bases for rag nodes: the four load rules, the file, rebuild, retrieval."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from graphrun.actors.rag.embed import HashEmbedder
from graphrun.actors.rag.retrieval import (
    KbConfig,
    KnowledgeBase,
    RagError,
    kb_file,
    load_or_build,
    rebuild,
    sources_changed,
)

DATA = Path(__file__).resolve().parents[2] / "data"
FULL = {"embedding_model": "local:hash-384", "chunk_size": 800, "chunk_overlap": 80}


@pytest.fixture
def agent_dir(tmp_path: Path) -> Path:
    shutil.copytree(DATA / "corpus", tmp_path / "knowledge")
    return tmp_path


def full_cfg(**overrides: object) -> KbConfig:
    return KbConfig(documents=["./knowledge/"], **{**FULL, **overrides})  # type: ignore[arg-type]


def build(agent_dir: Path, cfg: KbConfig | None = None, node: str = "research") -> KnowledgeBase:
    return load_or_build(
        agent_dir, node, cfg or full_cfg(), interactive=False, ask=None, rag_defaults={}
    )


class Asker:
    """Answers prompts from a script and remembers what it was asked."""

    def __init__(self, *answers: str):
        self.answers = list(answers)
        self.asked: list[tuple[str, str | None]] = []

    def __call__(self, prompt: str, default: str | None) -> str:
        self.asked.append((prompt, default))
        return self.answers.pop(0)


# --- configuration -------------------------------------------------------------------


def test_defaults_fill_only_unset_fields() -> None:
    cfg = KbConfig(documents=["a"], chunk_size=300).with_defaults(
        {
            "rag_embedding_model": "local:hash",
            "rag_chunk_size": 999,
            "rag_chunk_overlap": 0,
            "rag_top_k": 4,
            "rag_batch_size": 16,
            "rag_reranker_model": None,
        }
    )
    assert cfg == KbConfig(
        documents=["a"],
        embedding_model="local:hash",
        chunk_size=300,
        chunk_overlap=0,
        top_k=4,
        batch_size=16,
    )
    assert cfg.fully_specified
    assert not KbConfig(documents=["a"], embedding_model="m", chunk_size=5).fully_specified


# --- rule 2: missing + fully specified -> built directly -----------------------------


def test_built_directly_when_fully_specified(agent_dir: Path) -> None:
    kb = build(agent_dir)
    assert len(kb) > 20
    data = yaml.safe_load(kb_file(agent_dir, "research").read_text())
    assert data["embedding_model"] == "local:hash-384"
    assert (data["chunk_size"], data["chunk_overlap"], data["top_k"]) == (800, 80, 5)
    assert data["documents"] == ["./knowledge/"]
    assert data["chunk_count"] == len(kb)
    first = data["files"][0]
    assert first["source"] == "./knowledge/bees/hive-inspection.md"
    assert first["path"] == "knowledge/bees/hive-inspection.md"
    assert len(first["sha256"]) == 64 and first["chunks"][0].startswith("# Hive inspections")
    vectors = np.load(agent_dir / data["vectors"])
    assert vectors.shape == (len(kb), 384)
    assert (agent_dir / data["index"]).exists()
    assert data["vectors"].startswith("research.kb/")


def test_built_from_app_defaults(agent_dir: Path) -> None:
    kb = load_or_build(
        agent_dir,
        "r",
        KbConfig(documents=["./knowledge/git"]),
        interactive=False,
        ask=None,
        rag_defaults={
            "rag_embedding_model": "local:hash-64",
            "rag_chunk_size": 500,
            "rag_chunk_overlap": 25,
            "rag_top_k": 2,
        },
    )
    assert (kb.config.embedding_model, kb.config.top_k) == ("local:hash-64", 2)
    assert len(kb.query("git bisect run exit code").hits) == 2


# --- rule 1: existing file is loaded as is --------------------------------------------


def test_existing_file_is_loaded_not_rebuilt(agent_dir: Path) -> None:
    built = build(agent_dir)
    before = kb_file(agent_dir, "research").read_bytes()
    (agent_dir / "knowledge" / "bees" / "hive-inspection.md").write_text("# Changed\n\nnew text")
    changed_cfg = KbConfig(documents=["./knowledge/bees/", "./extra.md"])  # not even complete
    loaded = load_or_build(
        agent_dir, "research", changed_cfg, interactive=False, ask=None, rag_defaults={}
    )
    assert kb_file(agent_dir, "research").read_bytes() == before
    assert loaded.chunk_texts == built.chunk_texts
    assert np.array_equal(loaded.vectors, built.vectors)
    assert loaded.config.documents == ["./knowledge/"]
    q = "Pagden artificial swarm"
    assert loaded.query(q) == built.query(q)


def test_loading_never_embeds_the_corpus(agent_dir: Path) -> None:
    build(agent_dir)

    class Counting(HashEmbedder):
        texts = 0

        def embed(self, texts):  # type: ignore[no-untyped-def]
            Counting.texts += len(texts)
            return super().embed(texts)

    kb = load_or_build(
        agent_dir,
        "research",
        full_cfg(),
        interactive=False,
        ask=None,
        rag_defaults={},
        embedder=Counting(384),
    )
    kb._embedder = Counting(384)
    kb.query("collimation")
    assert Counting.texts == 1  # the query only


# --- rules 3 and 4: missing and not fully specified ----------------------------------


def test_non_interactive_without_build_settings_is_an_error(agent_dir: Path) -> None:
    cfg = KbConfig(documents=["./knowledge/"], embedding_model="local:hash", chunk_size=500)
    with pytest.raises(RagError) as info:
        load_or_build(agent_dir, "research", cfg, interactive=False, ask=None, rag_defaults={})
    assert str(info.value) == (
        "rag node 'research': the knowledge base research.yaml is not built and the node does "
        "not say how to build it (set embedding_model, chunk_size and chunk_overlap on the "
        "node (or the rag_* defaults), or run the agent once interactively)"
    )
    assert not kb_file(agent_dir, "research").exists()


def test_interactive_asks_to_initialise_then_for_missing_values(agent_dir: Path) -> None:
    ask = Asker("y", "local:hash-128", "")  # chunk_size given; overlap: take the default
    cfg = KbConfig(documents=["./knowledge/sky/"], chunk_size=600)
    kb = load_or_build(agent_dir, "sky", cfg, interactive=True, ask=ask, rag_defaults={})
    assert ask.asked == [
        ("Rag node 'sky' has no knowledge base yet (sky.yaml). Initialize it now? [y/n]", "y"),
        (
            "Embedding model (<client>:<model>, e.g. openai:text-embedding-3-small or "
            "local:hash-384)",
            None,
        ),
        ("Chunk overlap (characters)", "30"),
    ]
    assert (kb.config.embedding_model, kb.config.chunk_size, kb.config.chunk_overlap) == (
        "local:hash-128",
        600,
        30,
    )
    assert kb_file(agent_dir, "sky").exists()


def test_interactive_reasks_after_a_bad_answer(agent_dir: Path) -> None:
    ask = Asker("yes", "local:hash-64", "lots", "400", "400", "40")
    cfg = KbConfig(documents=["./knowledge/sky/"])
    kb = load_or_build(agent_dir, "sky", cfg, interactive=True, ask=ask, rag_defaults={})
    assert (kb.config.chunk_size, kb.config.chunk_overlap) == (400, 40)
    assert ask.asked[3] == ("Chunk size (characters) ('lots' is not a whole number)", "1000")
    assert ask.asked[5][0] == "Chunk overlap (characters) (must be smaller than the chunk size 400)"


def test_interactive_decline_is_an_error(agent_dir: Path) -> None:
    ask = Asker("n")
    with pytest.raises(RagError) as info:
        load_or_build(
            agent_dir,
            "research",
            KbConfig(documents=["./knowledge/"]),
            interactive=True,
            ask=ask,
            rag_defaults={},
        )
    assert str(info.value) == (
        "rag node 'research': knowledge base initialization declined; the graph cannot run "
        "without research.yaml (answer yes, or set embedding_model, chunk_size and "
        "chunk_overlap on the node)"
    )
    assert len(ask.asked) == 1
    assert not kb_file(agent_dir, "research").exists()


def test_fully_specified_interactive_run_asks_nothing(agent_dir: Path) -> None:
    ask = Asker()
    load_or_build(agent_dir, "research", full_cfg(), interactive=True, ask=ask, rag_defaults={})
    assert ask.asked == []


def test_bad_build_values_are_errors(agent_dir: Path) -> None:
    with pytest.raises(RagError, match=r"chunk_overlap \(900\) must be smaller than chunk_size"):
        build(agent_dir, full_cfg(chunk_overlap=900))


# --- damaged knowledge bases ---------------------------------------------------------


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda d: kb_file(d, "research").write_text("files: [unclosed"), "not valid YAML"),
        (lambda d: kb_file(d, "research").write_text("- a list\n"), "not a mapping"),
        (
            lambda d: [p.unlink() for p in (d / "research.kb").glob("*.npy")],
            "its vectors file .* is missing",
        ),
        (
            lambda d: [
                np.save(p, np.zeros((3, 384), np.float32))
                for p in (d / "research.kb").glob("*.npy")
            ],
            r"holds vectors of shape \(3, 384\) but the file lists \d+ chunks of dimension 384",
        ),
    ],
    ids=["bad-yaml", "not-mapping", "missing-vectors", "shape-mismatch"],
)
def test_damaged_knowledge_base_is_an_error_not_a_rebuild(
    agent_dir: Path,
    damage,
    problem: str,  # type: ignore[no-untyped-def]
) -> None:
    build(agent_dir)
    damage(agent_dir)
    before = kb_file(agent_dir, "research").read_bytes()
    with pytest.raises(RagError) as info:
        build(agent_dir)
    message = str(info.value)
    assert message.startswith(
        f"rag node 'research': knowledge base {kb_file(agent_dir, 'research')} is damaged: "
    )
    assert message.endswith("(delete research.yaml and research.kb/ to rebuild it on the next run)")
    import re

    assert re.search(problem, message)
    assert kb_file(agent_dir, "research").read_bytes() == before


def test_missing_index_file_is_rebuilt_from_stored_vectors(agent_dir: Path) -> None:
    built = build(agent_dir)
    for p in (agent_dir / "research.kb").glob("*.hnsw"):
        p.unlink()
    loaded = build(agent_dir)
    assert loaded.query("chain wear") == built.query("chain wear")


# --- rebuild and change detection ---------------------------------------------------


def test_sources_changed_and_rebuild_reuse(agent_dir: Path) -> None:
    cfg = full_cfg()
    build(agent_dir, cfg)
    assert sources_changed(agent_dir, "research", cfg) == []
    (agent_dir / "knowledge" / "git" / "branching.md").write_text("# Branches\n\nRewritten.")
    (agent_dir / "knowledge" / "git" / "tags.md").write_text("# Tags\n\nAnnotated tags.")
    (agent_dir / "knowledge" / "sky" / "collimation.md").unlink()
    cfg2 = KbConfig(documents=["./knowledge/", "./notes.md"], **FULL)  # type: ignore[arg-type]
    assert sources_changed(agent_dir, "research", cfg2) == [
        "./notes.md",
        "./knowledge/git/branching.md",
        "./knowledge/git/tags.md",
        "./knowledge/sky/collimation.md",
    ]
    assert sources_changed(agent_dir, "never-built", cfg) == []

    report = rebuild(agent_dir, "research", KbConfig(documents=["./knowledge/"]))
    assert report.changed == ["./knowledge/git/branching.md"]
    assert report.added == ["./knowledge/git/tags.md"]
    assert report.removed == ["./knowledge/sky/collimation.md"]
    assert len(report.unchanged) == 18
    assert report.chunks_embedded == 2  # one short chunk per new or changed file
    kb = build(agent_dir)
    assert kb.query("annotated tags").sources[0] == "./knowledge/git/tags.md"
    assert sources_changed(agent_dir, "research", cfg) == []
    assert len(list((agent_dir / "research.kb").iterdir())) == 2  # old files cleaned up


def test_rebuild_with_another_model_reembeds_everything(agent_dir: Path) -> None:
    kb = build(agent_dir)
    report = rebuild(agent_dir, "research", full_cfg(embedding_model="local:hash-64"))
    assert report.chunks_reused == 0
    assert report.chunks_embedded == len(kb)
    assert build(agent_dir).vectors.shape[1] == 64


# --- retrieval --------------------------------------------------------------------------


def test_query_output_shape(agent_dir: Path) -> None:
    kb = build(agent_dir)
    result = kb.query("How do I bleed hydraulic disc brakes with mineral oil?", top_k=3)
    assert len(result.hits) == 3
    assert result.hits[0]["source"] == "./knowledge/bikes/brakes.md"
    blocks = result.context.split("\n\n[Source: ")
    assert len(blocks) == 3
    assert result.context.startswith("[Source: ./knowledge/bikes/brakes.md]\n")
    assert result.sources == list(dict.fromkeys(h["source"] for h in result.hits))
    assert result.as_output() == {"context": result.context, "sources": result.sources}
    assert json.loads(json.dumps(result.as_output())) == result.as_output()
    scores = [h["score"] for h in result.hits]
    assert scores == sorted(scores, reverse=True)


def test_empty_query_retrieves_nothing(agent_dir: Path) -> None:
    assert build(agent_dir).query("   ").hits == []


def test_pdf_knowledge_base(tmp_path: Path) -> None:
    shutil.copy(DATA / "sample.pdf", tmp_path / "compost.pdf")
    cfg = KbConfig(documents=["compost.pdf"], **{**FULL, "chunk_size": 200, "chunk_overlap": 20})  # type: ignore[arg-type]
    kb = build(tmp_path, cfg, node="compost")
    result = kb.query("what temperature kills weed seeds in a hot heap", top_k=1)
    assert result.sources == ["compost.pdf"]
    assert "60 degrees Celsius" in result.context


def recall_at_5(kb: KnowledgeBase, labelled: list[dict[str, str]], mode: str) -> float:
    found = 0
    for item in labelled:
        hits = kb.search(item["question"], 5, mode=mode)
        found += any(
            kb.chunk_sources[i] == "./knowledge/" + item["file"]
            and item["phrase"] in kb.chunk_texts[i]
            for i, _ in hits
        )
    return found / len(labelled)


def test_hybrid_recall_at_least_the_better_retriever(agent_dir: Path) -> None:
    labelled = json.loads((DATA / "labelled.json").read_text())
    assert len(labelled) >= 25
    kb = build(agent_dir)
    recall = {mode: recall_at_5(kb, labelled, mode) for mode in ("vector", "keyword", "hybrid")}
    print(f"\nrecall@5 over {len(labelled)} questions (chunk 800/80, local:hash-384): {recall}")
    assert recall["hybrid"] >= max(recall["vector"], recall["keyword"])
    assert recall["hybrid"] >= 0.9


def test_awkward_text_round_trips_through_the_file(tmp_path: Path) -> None:
    text = (
        "Tabs\there, trailing spaces   \nunicode café – ✓\n\n  indented first\r\nline: - [x] {y}\n"
    )
    (tmp_path / "odd.txt").write_text(text, newline="")
    cfg = KbConfig(documents=["odd.txt"], **{**FULL, "chunk_size": 40, "chunk_overlap": 5})  # type: ignore[arg-type]
    built = build(tmp_path, cfg, node="odd")
    assert build(tmp_path, cfg, node="odd").chunk_texts == built.chunk_texts
    assert len(built) > 1
