"""rag nodes through the CLI: load rules, recorded retrieval, replay without the index,
the sources-changed warning and ``graphrun rag rebuild``."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from graphrun.eventstore.codec import unpack_body

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"

GRAPH = """
name: rag-test
version: "1.0"
start: retrieve
nodes:
  retrieve:
    type: rag
    documents: [./knowledge/]
    embedding_model: local:hash-384
    chunk_size: 800
    chunk_overlap: 80
    top_k: 2
    state_updates:
      context: "{{output.context}}"
      sources: "{{output.sources}}"
    next: done
  done:
    type: end
    output: "{{sources[0]}}"
"""


def _agent(tmp_path: Path, graph: str = GRAPH) -> Path:
    root = tmp_path / "rag-agent"
    shutil.copytree(CORPUS, root / "knowledge")
    (root / "graph.yaml").write_text(graph.lstrip(), encoding="utf-8")
    return root


def _events(db: Path, run_id: str) -> list[dict]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT seq, body FROM run_events WHERE run_id = ? ORDER BY seq", (run_id,)
        ).fetchall()
    return [json.loads(unpack_body(body)) | {"seq": seq} for seq, body in rows]


def test_a_rag_run_is_recorded_and_replays_without_the_index(graphrun, tmp_path: Path) -> None:
    root = _agent(tmp_path)
    result = graphrun("run", str(root), "How do bees turn nectar into honey?")
    assert result.code == 0, result.stderr
    assert result.stdout.startswith("./knowledge/bees/")
    assert (root / "retrieve.yaml").exists()
    run_id = graphrun.last_run()
    (done,) = [e for e in _events(graphrun.db, run_id) if e["type"] == "RetrievalDone"]
    assert done["query"] == "How do bees turn nectar into honey?"
    assert done["result"]["context"].startswith("[Source: ./knowledge/bees/")
    assert len(done["hits"]) == 2
    # The knowledge base is gone: replay serves the recorded retrieval.
    (root / "retrieve.yaml").unlink()
    shutil.rmtree(root / "retrieve.kb")
    replay = graphrun("replay", run_id)
    assert replay.code == 0, replay.stdout + replay.stderr


def test_not_fully_specified_and_non_interactive_is_a_clear_error(graphrun, tmp_path) -> None:
    root = _agent(tmp_path, GRAPH.replace("    chunk_overlap: 80\n", ""))
    result = graphrun("run", str(root), "bees")
    assert result.code == 2
    assert "Traceback" not in result.stderr
    assert "rag node 'retrieve'" in result.stderr
    assert "chunk_overlap" in result.stderr
    assert graphrun("runs", "--json").stdout == ""


def test_changed_sources_warn_and_rebuild_reembeds_only_them(graphrun, tmp_path: Path) -> None:
    root = _agent(tmp_path)
    assert graphrun("run", str(root), "bees").code == 0
    assert graphrun("validate", str(root)).stderr.strip().endswith("0 warning(s)")
    changed = next(iter(sorted((root / "knowledge").rglob("*.md"))))
    changed.write_text(changed.read_text(encoding="utf-8") + "\nA new paragraph.\n")
    validate = graphrun("validate", str(root))
    assert validate.code == 0
    assert "sources changed since its knowledge base was built" in validate.stderr
    assert "graphrun rag rebuild" in validate.stderr
    rebuilt = graphrun("rag", "rebuild", str(root))
    assert rebuilt.code == 0, rebuilt.stderr
    line = rebuilt.stdout.strip()
    assert line.startswith("retrieve: 0 added, 1 changed, 0 removed, ")
    assert "reused" in line
    assert graphrun("validate", str(root)).stderr.strip().endswith("0 warning(s)")


def test_rerun_retrieval_fails_a_recording_when_the_knowledge_base_changed(
    graphrun, tmp_path: Path
) -> None:
    root = _agent(tmp_path)
    assert graphrun("run", str(root), "How do bees turn nectar into honey?").code == 0
    run_id = graphrun.last_run()
    export = tmp_path / "rag.run.jsonl"
    assert graphrun("export", run_id, "-o", str(export)).code == 0
    # Unchanged knowledge base: retrieval re-run offline finds the same passages.
    same = graphrun("test", "--rerun-retrieval", str(export))
    assert same.code == 0, same.stdout
    assert "retrieval re-run against today's knowledge base" in same.stdout
    # The bees documents go and the index is rebuilt: served retrievals still pass,
    # a re-run retrieval is a divergence naming the node.
    shutil.rmtree(root / "knowledge" / "bees")
    assert graphrun("rag", "rebuild", str(root)).code == 0
    assert graphrun("test", str(export)).code == 0
    changed = graphrun("test", "--rerun-retrieval", str(export))
    assert changed.code == 1, changed.stdout
    assert "node 'retrieve'" in changed.stdout and "RetrievalDone" in changed.stdout
    replayed = graphrun("replay", run_id, "--graph", str(root), "--rerun-retrieval")
    assert replayed.code == 1 and "RetrievalDone" in replayed.stdout


def test_a_run_embedding_over_http_replays_with_the_server_gone(
    graphrun, tmp_path: Path, fake_llm
) -> None:
    root = _agent(tmp_path, GRAPH.replace("local:hash-384", "emb:fake-embed"))
    url = fake_llm.url_openai
    result = graphrun("run", str(root), "How do bees turn nectar into honey?", EMB_BASE_URL=url)
    assert result.code == 0, result.stderr
    assert result.stdout.startswith("./knowledge/bees/")
    embedded = [r.body["input"] for r in fake_llm.requests if r.path == "/v1/embeddings"]
    assert embedded[-1] == ["How do bees turn nectar into honey?"]  # the query, last
    run_id = graphrun.last_run()
    fake_llm.stop()
    # Nothing answers at that URL now: replay serves the recorded retrieval.
    replay = graphrun("replay", run_id, EMB_BASE_URL=url)
    assert replay.code == 0, replay.stdout + replay.stderr
    # A run that must embed its query now fails the node with the endpoint named.
    failed = graphrun("run", str(root), "bees", EMB_BASE_URL=url)
    assert failed.code != 0
    assert f"embedding endpoint {url}/embeddings could not be reached: [Errno 111]" in (
        failed.stdout + failed.stderr
    )
    assert "Traceback" not in failed.stderr
