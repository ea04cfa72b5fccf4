"""A rag node's HTTP is awaited on the run's event loop: the query's embedding request
(and a knowledge base's build) is made from the loop's thread with the loop's kept
client, parallel rag branches overlap their requests, and a timeout or a failing
endpoint fails the node as the blocking path does. Real HTTP on 127.0.0.1
(tests/support/fake_llm.py's ``/v1/embeddings``), real SQLite, in-process driver."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from graphrun.actors.loop import EffectLoop
from graphrun.actors.rag.embed import make_embedder
from graphrun.actors.rag.http import loop_client
from graphrun.actors.rag.loaders import RagError
from graphrun.actors.rag.retrieval import KnowledgeBase, kb_config, load_or_build
from graphrun.eventstore.events import NodeFailed, RetrievalDone
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine.driver import Driver, RunOptions, RunOutcome, drive, start_run
from graphrun.runtime.graph.loader import load_graph
from tests.support.fake_llm import FakeLlm, http_error

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"
QUESTION = "How do bees turn nectar into honey?"

ONE = """\
name: rag-loop
version: "1.0"
start: retrieve
nodes:
  retrieve:
    type: rag
    documents: [./knowledge/]
    embedding_model: emb:fake-embed
    chunk_size: 800
    chunk_overlap: 80
    top_k: 2
    timeout: {timeout}
    state_updates:
      sources: "{{{{output.sources}}}}"
    next: done
  done:
    type: end
    output: "{{{{sources[0]}}}}"
"""

MAP = """\
name: rag-map
version: "1.0"
start: ask
initial_state: {{questions: {questions}}}
nodes:
  ask:
    type: map
    over: "{{{{questions}}}}"
    as: question
    branch: retrieve
    collect_into: found
    max_concurrency: {cap}
    next: done
  retrieve:
    type: rag
    documents: [./knowledge/]
    query: "{{{{question}}}}"
    embedding_model: emb:fake-embed
    chunk_size: 800
    chunk_overlap: 80
    top_k: 1
    state_updates: {{}}
  done:
    type: end
    output: "{{{{found}}}}"
"""


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "events.db")
    yield s
    s.close()


@pytest.fixture
def server(fake_llm: FakeLlm, monkeypatch: pytest.MonkeyPatch) -> FakeLlm:
    """The fake server as the ``emb`` client's OpenAI-compatible embeddings API."""
    monkeypatch.setenv("EMB_BASE_URL", fake_llm.url_openai)
    monkeypatch.setenv("EMB_API_KEY", "sk-embed")
    return fake_llm


def _agent(tmp_path: Path, graph: str) -> Path:
    root = tmp_path / "agent"
    shutil.copytree(CORPUS, root / "knowledge")
    (root / "graph.yaml").write_text(graph, encoding="utf-8")
    return root


def _prebuilt(root: Path) -> KnowledgeBase:
    """Build the knowledge base before the run (blocking, off any loop)."""
    node = load_graph(root).graph.nodes["retrieve"]
    return load_or_build(
        root, "retrieve", kb_config(node), interactive=False, ask=None, rag_defaults={}
    )


def _run(store: SqliteStore, root: Path, **options: Any) -> RunOutcome:
    run_id = start_run(store, load_graph(root), prompt=QUESTION)
    return drive(Driver(store, run_id, RunOptions(**options)))


def _embedding_inputs(server: FakeLlm) -> list[list[str]]:
    return [r.body["input"] for r in server.requests if r.path == "/v1/embeddings"]


def test_the_query_embedding_is_requested_from_the_runs_loop_thread(
    store: SqliteStore, tmp_path: Path, server: FakeLlm
) -> None:
    root = _agent(tmp_path, ONE.format(timeout=30))
    loop = EffectLoop("rag-test-loop")
    sent: list[tuple[str, str]] = []  # (thread name, request path), as each request goes out

    # The client the run's rag requests share, kept with the loop the run is given.
    client = loop_client(loop)
    post = client.post_async

    async def watched(url: str, **request: Any) -> Any:
        sent.append((threading.current_thread().name, urlsplit(url).path))
        return await post(url, **request)

    client.post_async = watched
    try:
        outcome = _run(store, root, effect_loop=loop)
        assert loop_client(loop) is client
        session = client._session  # its pooled connections, made on first use
    finally:
        loop.stop()
    assert session is not None and session.closed  # closed with the loop
    assert outcome.status == "completed", outcome.error
    assert outcome.output is not None and outcome.output.startswith("./knowledge/bees/")
    # The knowledge base was built during the run: its chunks and then the query were
    # embedded, every request awaited on the loop's thread (none from an executor's).
    inputs = _embedding_inputs(server)
    assert inputs[-1] == [QUESTION]
    assert len(inputs) >= 2 and (root / "retrieve.yaml").exists()
    assert sent == [("rag-test-loop", "/v1/embeddings")] * len(inputs)
    assert all(r.headers["authorization"] == "Bearer sk-embed" for r in server.requests)
    # One connection for all of them: the loop's client keeps it.
    assert len({r.peer for r in server.requests}) == 1
    (done,) = [e for e in store.read(outcome.run_id) if isinstance(e, RetrievalDone)]
    assert done.error is None and done.query == QUESTION and len(done.hits or []) == 2


def test_parallel_rag_branches_overlap_their_embedding_requests(
    store: SqliteStore, tmp_path: Path, server: FakeLlm
) -> None:
    questions = [
        "How do bees turn nectar into honey?",
        "What to look for when inspecting a hive?",
        "How do I oil a bicycle chain?",
        "How long should shaped dough proof?",
    ]
    root = _agent(tmp_path, MAP.format(questions=json.dumps(questions), cap=4))
    # What the blocking path retrieves for each question.
    expected = [r.as_output() for r in map(_prebuilt(root).query, questions)]
    server.reset()
    server.embedding_delay = 1.5  # each query's embedding request takes 1.5 s
    started = time.monotonic()
    outcome = _run(store, root)
    elapsed = time.monotonic() - started
    assert outcome.status == "completed", outcome.error
    assert sorted(q for (q,) in _embedding_inputs(server)) == sorted(questions)
    assert server.embeddings_in_flight_max == 4
    assert elapsed < 4.5, elapsed  # about one delay, not four (6 s)
    found = json.loads(outcome.output or "[]")
    assert found == expected
    assert [item["sources"][0].split("/")[2] for item in found] == [
        "bees",
        "bees",
        "bikes",
        "bread",
    ]


def test_a_timeout_fails_the_node_and_cancels_the_request(
    store: SqliteStore, tmp_path: Path, server: FakeLlm
) -> None:
    root = _agent(tmp_path, ONE.format(timeout=0.5))
    _prebuilt(root)
    server.reset()
    server.embedding_delay = 10.0
    started = time.monotonic()
    outcome = _run(store, root)
    assert time.monotonic() - started < 5.0
    assert outcome.status == "failed"
    events = store.read(outcome.run_id)
    (done,) = [e for e in events if isinstance(e, RetrievalDone)]
    assert done.error == "retrieval timed out after 0.5s"
    (failed,) = [e for e in events if isinstance(e, NodeFailed)]
    assert failed.node_id == "retrieve" and failed.error == "retrieval timed out after 0.5s"
    assert failed.error_kind == "TimeoutError"
    # The request was cancelled, not left running: its connection was closed under
    # the server while it was still holding the answer back.
    deadline = time.monotonic() + 5
    while not server.embeddings_abandoned and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.embeddings_abandoned == 1
    assert len(_embedding_inputs(server)) == 1


def test_a_failing_endpoint_fails_the_node_as_the_blocking_path_does(
    store: SqliteStore, tmp_path: Path, server: FakeLlm
) -> None:
    root = _agent(tmp_path, ONE.format(timeout=30))
    _prebuilt(root)
    server.embedding_reply = http_error(500, "model overloaded")
    with pytest.raises(RagError) as blocking:
        make_embedder("emb:fake-embed", node_id="retrieve").embed([QUESTION])
    assert "returned HTTP 500" in str(blocking.value)
    outcome = _run(store, root)
    assert outcome.status == "failed"
    events = store.read(outcome.run_id)
    (done,) = [e for e in events if isinstance(e, RetrievalDone)]
    assert done.error == str(blocking.value)
    (failed,) = [e for e in events if isinstance(e, NodeFailed)]
    assert failed.error == str(blocking.value) and failed.error_kind == "RetrievalError"


def test_an_unreachable_endpoint_fails_the_node_as_the_blocking_path_does(
    store: SqliteStore, tmp_path: Path, server: FakeLlm, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _agent(tmp_path, ONE.format(timeout=30))
    _prebuilt(root)
    monkeypatch.setenv("EMB_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens there
    with pytest.raises(RagError) as blocking:
        make_embedder("emb:fake-embed", node_id="retrieve").embed([QUESTION])
    assert "could not be reached: [Errno 111] Connection refused" in str(blocking.value)
    outcome = _run(store, root)
    assert outcome.status == "failed"
    (done,) = [e for e in store.read(outcome.run_id) if isinstance(e, RetrievalDone)]
    assert done.error == str(blocking.value)


def test_the_runs_timeout_stops_a_knowledge_base_build(
    store: SqliteStore, tmp_path: Path, server: FakeLlm
) -> None:
    """A knowledge base the run has to build (none was built before it) is stopped by
    the run's timeout like any effect in flight: its embedding request is cancelled
    and the run fails as timed out then, not once the build would have finished."""
    graph = ONE.format(timeout=30).replace(
        "start: retrieve\n", "start: retrieve\nsettings:\n  timeout: 1\n"
    )
    root = _agent(tmp_path, graph)
    server.embedding_delay = 10.0
    started = time.monotonic()
    outcome = _run(store, root)
    elapsed = time.monotonic() - started
    assert outcome.status == "failed", outcome
    assert outcome.error == "run timed out after 1s (settings.timeout) in node 'retrieve'"
    assert elapsed < 5.0, elapsed
    deadline = time.monotonic() + 5
    while not server.embeddings_abandoned and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.embeddings_abandoned == 1
    assert not (root / "retrieve.yaml").exists()  # no knowledge base half written


def test_a_live_rag_run_awaits_its_requests_on_aiohttp_and_imports_no_httpx(
    tmp_path: Path, server: FakeLlm
) -> None:
    """`graphrun run` (a real process) answers the query with its embedding request
    on the loop's aiohttp session: httpx, whose package loads its command line's
    modules, is not imported for it. (A knowledge base the command builds before
    the run, at load time as Loki does, is built with httpx's blocking client.)"""
    import os
    import subprocess
    import sys

    root = _agent(tmp_path, ONE.format(timeout=30))
    _prebuilt(root)
    server.reset()
    environ = dict(os.environ, GRAPHRUN_DB=str(tmp_path / "cli.db"))
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "graphrun.cli", "run", str(root), QUESTION],
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("./knowledge/bees/")
    assert _embedding_inputs(server) == [[QUESTION]]
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "aiohttp" in modules
    assert "httpx" not in modules and "pygments" not in modules
