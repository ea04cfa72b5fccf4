"""Knowledge bases against real HTTP servers on 127.0.0.1: URLs, embeddings, rerank."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from graphrun.actors.rag.embed import HashEmbedder, make_embedder
from graphrun.actors.rag.index import make_reranker
from graphrun.actors.rag.loaders import RagError, load_documents
from graphrun.actors.rag.retrieval import KbConfig, load_or_build, rebuild

DATA = Path(__file__).resolve().parents[2] / "data"

PAGE = """<!doctype html><html><head><title>Kettle care</title>
<script>var tracking = 1;</script></head><body><nav>Home | About</nav>
<article><h1>Descaling a kettle</h1>
<p>Limescale builds up where the water is hard. Fill the kettle halfway with equal parts
white vinegar and water, boil it, and leave it for an hour.</p>
<p>Rinse it twice with fresh water before making tea.</p></article></body></html>"""


@dataclass
class Server:
    url: str
    requests: list[tuple[str, Any]] = field(default_factory=list)

    def embedded_inputs(self) -> list[str]:
        return [
            text
            for path, body in self.requests
            if path.endswith("/embeddings")
            for text in body["input"]
        ]


@pytest.fixture
def server() -> Iterator[Server]:
    embedder = HashEmbedder(32)
    state = Server(url="")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            state.requests.append((self.path, None))
            if self.path == "/kettle.html":
                self._send(200, PAGE.encode(), "text/html; charset=utf-8")
            elif self.path == "/notes.txt":
                self._send(200, b"plain notes about kettles", "text/plain")
            else:
                self._send(404, b"not found", "text/plain")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append((self.path, body))
            if self.path.endswith("/embeddings"):
                self._embeddings(body)
            elif self.path == "/badindex/rerank":
                payload = {"results": [{"index": 5, "relevance_score": 0.9}]}
                self._send(200, json.dumps(payload).encode(), "application/json")
            elif self.path == "/v1/rerank":
                docs = body["documents"]
                # Rank by how often the query's first word occurs, then last document first.
                word = body["query"].split()[0].lower()
                order = sorted(range(len(docs)), key=lambda i: (-docs[i].lower().count(word), -i))
                results = [
                    {"index": i, "relevance_score": 1.0 / (n + 1)}
                    for n, i in enumerate(order[: body["top_n"]])
                ]
                self._send(200, json.dumps({"results": results}).encode(), "application/json")
            else:
                self._send(404, b"{}", "application/json")

        def _embeddings(self, body: dict[str, Any]) -> None:
            if self.path.startswith("/fail/"):
                self._send(500, b'{"error": "model overloaded"}', "application/json")
                return
            if self.path.startswith("/notjson/"):
                self._send(200, b"<html>a proxy's\n  login page</html>", "text/html")
                return
            vectors = embedder.embed(body["input"]).tolist()
            if self.path.startswith("/short/"):
                vectors = vectors[:-1]
            if self.path.startswith("/ragged/") and len(vectors) > 1:
                vectors[1] = vectors[1][:16]
            data = [
                {"object": "embedding", "index": i, "embedding": v}
                for i, v in reversed(list(enumerate(vectors)))
            ]
            payload = {"object": "list", "data": data, "model": body["model"]}
            self._send(200, json.dumps(payload).encode(), "application/json")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_url_html_page_is_loaded_as_text(server: Server, tmp_path: Path) -> None:
    url = f"{server.url}/kettle.html"
    (doc,) = load_documents([url], tmp_path).documents
    assert doc.source == url
    assert "tracking" not in doc.text
    assert doc.text.startswith("Kettle care\n\nHome | About\n\nDescaling a kettle\n\nLimescale")


def test_knowledge_base_from_url_cites_it(server: Server, tmp_path: Path) -> None:
    url = f"{server.url}/kettle.html"
    cfg = KbConfig(
        documents=[url, f"{server.url}/notes.txt"],
        embedding_model="local:hash-128",
        chunk_size=200,
        chunk_overlap=20,
    )
    kb = load_or_build(tmp_path, "web", cfg, interactive=False, ask=None, rag_defaults={})
    result = kb.query("how to remove limescale with vinegar", top_k=2)
    assert result.sources[0] == url
    assert result.context.startswith(f"[Source: {url}]\n")
    assert "vinegar" in result.hits[0]["chunk"]


def test_failing_url_is_an_error_naming_it(server: Server, tmp_path: Path) -> None:
    url = f"{server.url}/gone.html"
    with pytest.raises(RagError) as info:
        load_documents([url], tmp_path, node_id="web")
    assert str(info.value) == (
        f"rag node 'web': document '{url}' could not be fetched: HTTP 404 (check the URL)"
    )


def test_unreachable_url_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RagError, match=r"document 'http://127.0.0.1:9/x' could not be fetched"):
        load_documents(["http://127.0.0.1:9/x"], tmp_path)


def test_embeddings_are_batched_and_reordered_by_index(server: Server) -> None:
    emb = make_embedder("openai:te-small", base_url=f"{server.url}/v1", api_key="k", batch_size=3)
    texts = [f"text number {i} about kettles" for i in range(7)]
    vectors = emb.embed(texts)
    batches = [body["input"] for path, body in server.requests]
    assert [len(b) for b in batches] == [3, 3, 1]
    assert all(path == "/v1/embeddings" for path, _ in server.requests)
    assert server.requests[0][1]["model"] == "te-small"
    assert vectors.shape == (7, 32)
    assert np.allclose(vectors, HashEmbedder(32).embed(texts), atol=1e-6)


def test_embeddings_use_openai_env(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert make_embedder("openai:m").embed(["a"]).shape == (1, 32)


def test_wrong_number_of_vectors_is_an_error(server: Server) -> None:
    emb = make_embedder("openai:m", base_url=f"{server.url}/short/v1", batch_size=4, node_id="kb")
    with pytest.raises(RagError) as info:
        emb.embed(["a", "b", "c"])
    assert info.value.message == (
        f"rag node 'kb': embedding endpoint returned 2 vectors for 3 inputs "
        f"({server.url}/short/v1/embeddings, model 'm')"
    )


def test_inconsistent_vector_size_is_an_error(server: Server) -> None:
    emb = make_embedder("openai:m", base_url=f"{server.url}/ragged/v1")
    with pytest.raises(RagError, match=r"vectors of inconsistent size \(16 and 32\)"):
        emb.embed(["a", "b"])


def test_http_error_from_embeddings_is_an_error(server: Server) -> None:
    emb = make_embedder("openai:m", base_url=f"{server.url}/fail/v1")
    with pytest.raises(RagError, match=r'returned HTTP 500: \{"error": "model overloaded"\}'):
        emb.embed(["a"])


def test_rebuild_embeds_only_the_changed_file(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
    shutil.copytree(DATA / "corpus" / "bikes", tmp_path / "knowledge")
    cfg = KbConfig(
        documents=["./knowledge/"], embedding_model="openai:m", chunk_size=400, chunk_overlap=40
    )
    kb = load_or_build(tmp_path, "bikes", cfg, interactive=False, ask=None, rag_defaults={})
    first = len(server.embedded_inputs())
    assert first == len(kb) > 4
    server.requests.clear()

    brakes = tmp_path / "knowledge" / "brakes.md"
    brakes.write_text(brakes.read_text() + "\n\nCeramic pads run quieter than sintered pads.\n")
    report = rebuild(tmp_path, "bikes", cfg)

    new_chunks = [
        c
        for f in load_or_build(
            tmp_path, "bikes", cfg, interactive=False, ask=None, rag_defaults={}
        ).files
        if f.source.endswith("brakes.md")
        for c in f.chunks
    ]
    assert server.embedded_inputs() == new_chunks
    assert report.changed == ["./knowledge/brakes.md"]
    assert len(report.unchanged) == 3
    assert report.chunks_embedded == len(new_chunks)
    assert report.chunks_reused == first - len(
        [c for f in kb.files if f.source.endswith("brakes.md") for c in f.chunks]
    )


def test_reranker_orders_the_hybrid_candidates(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACME_BASE_URL", f"{server.url}/v1")
    monkeypatch.setenv("ACME_API_KEY", "secret")
    shutil.copytree(DATA / "corpus" / "sky", tmp_path / "knowledge")
    cfg = KbConfig(
        documents=["./knowledge/"],
        embedding_model="local:hash-384",
        chunk_size=500,
        chunk_overlap=50,
        reranker_model="acme:rerank-1",
    )
    kb = load_or_build(tmp_path, "sky", cfg, interactive=False, ask=None, rag_defaults={})
    result = kb.query("mirror collimation of a Newtonian", top_k=3)
    path, body = server.requests[-1]
    assert path == "/v1/rerank"
    assert (body["model"], body["query"], body["top_n"]) == (
        "rerank-1",
        "mirror collimation of a Newtonian",
        3,
    )
    assert len(result.hits) == 3
    counts = [h["chunk"].lower().count("mirror") for h in result.hits]
    assert counts == sorted(counts, reverse=True) and counts[0] > 0
    assert [h["score"] for h in result.hits] == [1.0, 0.5, pytest.approx(1 / 3)]


def test_reranker_answer_with_bad_index_is_an_error(server: Server) -> None:
    reranker = make_reranker("acme:r", base_url=f"{server.url}/badindex", node_id="sky")
    with pytest.raises(RagError) as info:
        reranker.rerank("q", ["a", "b"], 1)
    assert info.value.message == (
        f"rag node 'sky': rerank endpoint {server.url}/badindex/rerank "
        f"returned an index outside 0..1"
    )


def test_reranker_http_error(server: Server) -> None:
    reranker = make_reranker("acme:r", base_url=f"{server.url}/nowhere")
    with pytest.raises(RagError, match=r"rerank endpoint .* returned HTTP 404"):
        reranker.rerank("q", ["a"], 1)


def test_an_embedding_client_of_config_yaml_is_reached_at_its_api_base_with_its_key(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Loki's `rag_embedding_model: <client>:<model>` names a client of config.yaml.
    from graphrun.actors.rag.embed import client_embedder

    monkeypatch.setenv("EMBED_TEST_KEY", "sk-embed-test")
    (tmp_path / "config.yaml").write_text(
        "clients:\n"
        "  - type: openai-compatible\n"
        "    name: embedder\n"
        f"    api_base: {server.url}/v1\n"
        "    api_key: '{{EMBED_TEST_KEY}}'\n",
        encoding="utf-8",
    )
    emb = client_embedder("embedder:nomic", config_dir=tmp_path)
    assert emb.embed(["a", "b"]).shape == (2, 32)
    assert server.requests[-1][0] == "/v1/embeddings"
    assert server.requests[-1][1]["model"] == "nomic"
    # Without the config directory only the environment names a client.
    with pytest.raises(RagError, match="no base URL for client 'embedder'"):
        client_embedder("embedder:nomic", config_dir=None)


# --- the same requests awaited on an event loop ---------------------------------------


def _awaited(coro_fn: Any) -> Any:
    """Run ``coro_fn(client)`` on a run's kind of event loop, with the client kept
    with it (as a rag node awaits its requests)."""
    from graphrun.actors.loop import EffectLoop
    from graphrun.actors.rag.http import loop_client

    loop = EffectLoop("kb-test-loop")
    try:
        return loop.submit(coro_fn(loop_client(loop))).result(timeout=60)
    finally:
        loop.stop()


def _offload() -> Any:
    import functools

    from graphrun.actors.loop import blocking

    return functools.partial(blocking, None)  # the loop's default executor


def test_awaited_embeddings_are_the_blocking_ones(server: Server) -> None:
    emb = make_embedder("openai:te-small", base_url=f"{server.url}/v1", api_key="k", batch_size=3)
    texts = [f"text number {i} about kettles" for i in range(7)]
    blocking = emb.embed(texts)
    sent = list(server.requests)
    server.requests.clear()
    awaited = _awaited(lambda client: emb.embed_async(texts, client))
    assert server.requests == sent  # the same three batches, the same bodies
    assert awaited.dtype == np.float32 and np.array_equal(awaited, blocking)
    assert emb.requests == 6
    assert _awaited(lambda client: emb.embed_async([], client)).shape == (0, 0)


@pytest.mark.parametrize(
    "base",
    [
        "{url}/fail/v1",
        "{url}/short/v1",
        "{url}/ragged/v1",
        "{url}/notjson/v1",
        "http://127.0.0.1:9/v1",  # nothing listens: [Errno 111] Connection refused
        "http://no-such-host.invalid/v1",  # a name that never resolves
    ],
)
def test_awaited_embedding_failures_are_the_blocking_ones(server: Server, base: str) -> None:
    emb = make_embedder("openai:m", base_url=base.format(url=server.url), node_id="kb")
    with pytest.raises(RagError) as blocking:
        emb.embed(["a", "b", "c"])
    with pytest.raises(RagError) as awaited:
        _awaited(lambda client: emb.embed_async(["a", "b", "c"], client))
    assert str(awaited.value) == str(blocking.value)
    assert awaited.value.hint == blocking.value.hint


def test_awaited_rerank_is_the_blocking_one(server: Server) -> None:
    reranker = make_reranker("acme:r", base_url=f"{server.url}/v1", node_id="sky")
    docs = ["no match here", "mirror mirror", "one mirror"]
    blocking = reranker.rerank("mirror care", docs, 2)
    assert _awaited(lambda client: reranker.rerank_async(client, "mirror care", docs, 2)) == (
        blocking
    )
    for base in (f"{server.url}/badindex", f"{server.url}/nowhere", "http://127.0.0.1:9"):
        failing = make_reranker("acme:r", base_url=base, node_id="sky")
        with pytest.raises(RagError) as sync_error:
            failing.rerank("q", ["a", "b"], 1)
        with pytest.raises(RagError) as async_error:
            _awaited(lambda client, r=failing: r.rerank_async(client, "q", ["a", "b"], 1))
        assert str(async_error.value) == str(sync_error.value)


def test_a_query_awaited_on_a_loop_retrieves_what_the_blocking_query_does(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from graphrun.actors.loop import EffectLoop
    from graphrun.actors.rag.http import loop_client

    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
    monkeypatch.setenv("ACME_BASE_URL", f"{server.url}/v1")
    shutil.copytree(DATA / "corpus" / "sky", tmp_path / "knowledge")
    cfg = KbConfig(
        documents=["./knowledge/"],
        embedding_model="openai:m",
        chunk_size=500,
        chunk_overlap=50,
        reranker_model="acme:rerank-1",
    )
    kb = load_or_build(tmp_path, "sky", cfg, interactive=False, ask=None, rag_defaults={})
    query = "mirror collimation of a Newtonian"
    server.requests.clear()
    blocking = kb.query(query, top_k=3)
    sent = list(server.requests)
    server.requests.clear()
    loop = EffectLoop("kb-test-loop")
    try:
        client = loop.submit(_on_loop(loop_client, loop)).result(timeout=10)
        awaited = loop.submit(kb.query_async(query, 3, client=client, offload=_offload())).result(
            timeout=30
        )
    finally:
        loop.stop()
    assert [path for path, _ in sent] == ["/v1/embeddings", "/v1/rerank"]
    assert server.requests == sent
    assert awaited == blocking and len(awaited.hits) == 3


async def _on_loop(fn: Any, *args: Any) -> Any:
    return fn(*args)


def test_cancelling_an_awaited_embedding_closes_its_connection() -> None:
    """The endpoint accepts and never answers; cancelling the awaiting task hangs up."""
    import asyncio
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    emb = make_embedder("openai:m", base_url=f"http://127.0.0.1:{port}/v1")
    accepted: list[socket.socket] = []

    def accept() -> None:
        conn, _ = listener.accept()
        accepted.append(conn)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()

    async def main(client: Any) -> None:
        task = asyncio.ensure_future(emb.embed_async(["a"], client))
        await asyncio.sleep(0.5)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        _awaited(main)
        acceptor.join(timeout=5)
        (conn,) = accepted
        conn.settimeout(5)
        received = b""
        while chunk := conn.recv(65536):  # the request, then EOF: the client hung up
            received += chunk
        assert received.startswith(b"POST /v1/embeddings ")
        conn.close()
    finally:
        listener.close()
