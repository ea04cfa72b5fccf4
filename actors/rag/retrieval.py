"""Per-node knowledge bases for ``rag`` nodes: build once, load fast, search hybrid.

A rag node's knowledge base lives beside the graph as ``<agent-dir>/<node-id>.yaml``
(build config, documents, per-file sha256, chunk texts with their sources) plus
``<agent-dir>/<node-id>.kb/`` (the chunk vectors as ``.npy`` and the HNSW index),
so loading never re-embeds. :func:`load_or_build` applies the spec's four rules:

1. the file exists -> it is loaded, as is (changed ``documents`` do not rebuild it;
   delete the file to rebuild, or call :func:`rebuild`);
2. missing, and ``embedding_model`` + ``chunk_size`` + ``chunk_overlap`` are all set
   (on the node or in the app's ``rag_*`` defaults) -> built directly, no prompts;
3. missing, not fully specified, interactive -> the user is asked to initialise it
   (declining is an error), then asked for each missing value;
4. missing, not fully specified, non-interactive -> :class:`RagError` with a hint.

A damaged knowledge base (bad YAML, missing or mismatched vectors) is an error
naming the node and the file; it is never silently rebuilt over.

:meth:`KnowledgeBase.query` returns what the node puts in ``{{output}}``: the
chunks as one context block, each under a ``[Source: ...]`` line, and the ordered
unique list of sources.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphrun.actors.rag.chunk import split_text
from graphrun.actors.rag.embed import (
    Embedder,
    Offload,
    client_embedder,
    embed_async,
    make_embedder,
)
from graphrun.actors.rag.index import HybridIndex, Reranker, make_reranker, reranked
from graphrun.actors.rag.loaders import (
    LoadedDocument,
    RagError,
    is_url,
    load_documents,
    resolve_sources,
    sha256_of_file,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "DEFAULT_TOP_K",
    "KbConfig",
    "KnowledgeBase",
    "RagError",
    "RebuildReport",
    "RetrievalResult",
    "kb_config",
    "kb_file",
    "load_knowledge_base",
    "load_or_build",
    "load_or_build_async",
    "rebuild",
    "sources_changed",
]

DEFAULT_TOP_K = 5
KB_FORMAT_VERSION = 1

#: ask(prompt, default) -> answer: how interactive initialisation talks to a person.
AskFn = Callable[[str, "str | None"], str]

_DEFAULT_KEYS = {
    "embedding_model": "rag_embedding_model",
    "chunk_size": "rag_chunk_size",
    "chunk_overlap": "rag_chunk_overlap",
    "reranker_model": "rag_reranker_model",
    "batch_size": "rag_batch_size",
    "top_k": "rag_top_k",
}
_MAX_ASKS = 3


@dataclass(frozen=True)
class KbConfig:
    """A rag node's knowledge-base settings (build config + retrieval defaults).

    Attributes:
        documents: The node's knowledge sources (files, folders, globs, URLs).
        embedding_model: ``<client>:<model>``, e.g. ``openai:text-embedding-3-small``.
        chunk_size: Chunk size in characters.
        chunk_overlap: Overlap between consecutive chunks, in characters.
        reranker_model: Optional ``<client>:<model>`` reranker.
        batch_size: Embedding-request batch size.
        top_k: Chunks to retrieve when the query does not say.
    """

    documents: list[str]
    embedding_model: str | None = None
    chunk_size: int | None = None
    chunk_overlap: int | None = None
    reranker_model: str | None = None
    batch_size: int | None = None
    top_k: int | None = None

    def with_defaults(self, rag_defaults: Mapping[str, Any] | None) -> KbConfig:
        """Fill unset fields from the app-level ``rag_*`` settings."""
        if not rag_defaults:
            return self
        updates = {
            name: rag_defaults[key]
            for name, key in _DEFAULT_KEYS.items()
            if getattr(self, name) is None and rag_defaults.get(key) is not None
        }
        return replace(self, **updates)

    @property
    def fully_specified(self) -> bool:
        """Whether the knowledge base can be built with no questions asked."""
        return (
            bool(self.embedding_model)
            and self.chunk_size is not None
            and self.chunk_overlap is not None
        )

    def check(self, node_id: str | None = None) -> None:
        """Raise :class:`RagError` if a set value is out of range."""

        def bad(message: str) -> RagError:
            return RagError(message, node_id=node_id)

        if not self.documents:
            raise bad("documents is empty (a rag node needs at least one knowledge source)")
        for name in ("chunk_size", "batch_size", "top_k"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise bad(f"{name} must be a positive integer, got {value!r}")
        overlap = self.chunk_overlap
        if overlap is not None and (not isinstance(overlap, int) or overlap < 0):
            raise bad(f"chunk_overlap must be a non-negative integer, got {overlap!r}")
        if self.chunk_size is not None and overlap is not None and overlap >= self.chunk_size:
            raise bad(
                f"chunk_overlap ({overlap}) must be smaller than chunk_size ({self.chunk_size})"
            )


@dataclass(frozen=True)
class RetrievalResult:
    """What a rag node retrieved.

    Attributes:
        context: The chunks, best first, each preceded by a ``[Source: <source>]``
            line, separated by blank lines.
        sources: The chunks' sources, unique, in order of first appearance.
        hits: ``{"source", "chunk", "score"}`` per chunk, best first.
    """

    context: str
    sources: list[str]
    hits: list[dict[str, Any]]

    def as_output(self) -> dict[str, Any]:
        """The node's ``{{output}}``: ``{"context": ..., "sources": [...]}``."""
        return {"context": self.context, "sources": list(self.sources)}


@dataclass
class RebuildReport:
    """What :func:`rebuild` did, by source."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    chunks_embedded: int = 0
    chunks_reused: int = 0


@dataclass
class _FileEntry:
    source: str
    entry: str
    path: str | None
    sha256: str
    extension: str
    chunks: list[str]


class KnowledgeBase:
    """A loaded knowledge base: chunks, their vectors and the hybrid index."""

    def __init__(
        self,
        *,
        node_id: str,
        path: Path,
        config: KbConfig,
        files: list[_FileEntry],
        vectors: np.ndarray,
        index: HybridIndex,
    ):
        self.node_id = node_id
        self.path = path
        self.config = config
        self.files = files
        self.vectors = vectors
        self.index = index
        self.chunk_sources: list[str] = [f.source for f in files for _ in f.chunks]
        self.chunk_texts: list[str] = [c for f in files for c in f.chunks]
        self._embedder: Embedder | None = None
        self._reranker: Reranker | None = None
        # Where a <client>:<model> embedding model's client is configured (config.yaml).
        self.config_dir: Path | None = None

    @property
    def embedder(self) -> Embedder:
        """The embedder the corpus was embedded with (for queries)."""
        if self._embedder is None:
            assert self.config.embedding_model
            self._embedder = client_embedder(
                self.config.embedding_model,
                config_dir=self.config_dir,
                batch_size=self.config.batch_size,
                node_id=self.node_id,
            )
        return self._embedder

    @property
    def reranker(self) -> Reranker | None:
        """The configured reranker, if any."""
        if self._reranker is None and self.config.reranker_model:
            self._reranker = make_reranker(self.config.reranker_model, node_id=self.node_id)
        return self._reranker

    def __len__(self) -> int:
        return len(self.chunk_texts)

    def search(
        self, query: str, top_k: int | None = None, *, mode: str = "hybrid"
    ) -> list[tuple[int, float]]:
        """Chunk numbers with scores, best first.

        Args:
            query: The query text.
            top_k: How many chunks (default: the knowledge base's ``top_k``).
            mode: ``"hybrid"`` (what rag nodes use), ``"vector"`` or ``"keyword"``.
        """
        k = top_k or self.config.top_k or DEFAULT_TOP_K
        if not query.strip() or not self.chunk_texts:
            return []
        if mode == "keyword":
            return self.index.keyword_search(query, k)
        query_vector = self.embedder.embed([query])[0]
        if mode == "vector":
            return self.index.vector_search(query_vector, k)
        if mode != "hybrid":
            raise ValueError(f"unknown search mode {mode!r}")
        return self.index.hybrid_search(query, query_vector, k, reranker=self.reranker)

    async def search_async(
        self,
        query: str,
        top_k: int | None = None,
        *,
        client: Any,
        offload: Offload,
    ) -> list[tuple[int, float]]:
        """:meth:`search` (hybrid) from a coroutine on a run's event loop: the query's
        embedding request and a reranker's are awaited there with ``client``; the
        vector and keyword search (hnswlib, BM25: CPU), a local embedder's hashing
        and resolving the clients (``config.yaml``) go through ``offload``."""
        k = top_k or self.config.top_k or DEFAULT_TOP_K
        if not query.strip() or not self.chunk_texts:
            return []
        resolved = self._embedder is not None and (
            self._reranker is not None or not self.config.reranker_model
        )
        embedder, reranker = (
            (self.embedder, self.reranker) if resolved else await offload(self._clients)
        )
        vectors = await embed_async(embedder, [query], client=client, offload=offload)
        if reranker is None:
            return await offload(self.index.fused_search, query, vectors[0], k)
        candidates = await offload(self.index.candidates, query, vectors[0], k)
        if not candidates:
            return []
        texts = [self.index.texts[i] for i in candidates]
        return reranked(candidates, await reranker.rerank_async(client, query, texts, k), k)

    def _clients(self) -> tuple[Embedder, Reranker | None]:
        return self.embedder, self.reranker

    def query(self, query: str, top_k: int | None = None) -> RetrievalResult:
        """Retrieve the chunks for ``query`` and format them for a prompt."""
        return self._result(self.search(query, top_k))

    async def query_async(
        self,
        query: str,
        top_k: int | None = None,
        *,
        client: Any,
        offload: Offload,
    ) -> RetrievalResult:
        """:meth:`query` from a coroutine on a run's event loop (see :meth:`search_async`)."""
        return self._result(await self.search_async(query, top_k, client=client, offload=offload))

    def _result(self, found: list[tuple[int, float]]) -> RetrievalResult:
        hits = [
            {"source": self.chunk_sources[i], "chunk": self.chunk_texts[i], "score": score}
            for i, score in found
        ]
        context = "\n\n".join(f"[Source: {h['source']}]\n{h['chunk']}" for h in hits)
        sources = list(dict.fromkeys(str(h["source"]) for h in hits))
        return RetrievalResult(context=context, sources=sources, hits=hits)


# --- files -------------------------------------------------------------------------


def kb_file(agent_dir: Path, node_id: str) -> Path:
    """Where a rag node's knowledge base file lives (inside the agent folder, by
    the path rule of :mod:`graphrun.actors.paths`: a node id may hold ``/``)."""
    return _inside(agent_dir, f"{node_id}.yaml", f"the knowledge base file of rag node '{node_id}'")


def _data_dir(agent_dir: Path, node_id: str) -> Path:
    return _inside(agent_dir, f"{node_id}.kb", f"the knowledge base folder of rag node '{node_id}'")


def _inside(agent_dir: Path, name: str, what: str) -> Path:
    from graphrun.actors.paths import require_inside

    require_inside(agent_dir, name, what=what, error=RagError)
    return Path(agent_dir) / name


def _yaml() -> Any:
    import yaml

    return yaml


def _corrupt(node_id: str, path: Path, problem: str) -> RagError:
    return RagError(
        f"knowledge base {path} is damaged: {problem}",
        node_id=node_id,
        hint=f"delete {path.name} and {path.stem}.kb/ to rebuild it on the next run",
    )


def _read_kb_yaml(agent_dir: Path, node_id: str) -> dict[str, Any]:
    path = kb_file(agent_dir, node_id)
    yaml = _yaml()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
    except yaml.YAMLError as exc:
        raise _corrupt(node_id, path, f"not valid YAML ({' '.join(str(exc).split())})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _corrupt(node_id, path, f"cannot be read ({exc})") from None
    if not isinstance(data, dict):
        raise _corrupt(node_id, path, "not a mapping")
    if data.get("version") != KB_FORMAT_VERSION:
        raise _corrupt(node_id, path, f"unknown format version {data.get('version')!r}")
    required = ("embedding_model", "chunk_size", "chunk_overlap", "documents", "files", "vectors")
    missing = [k for k in required if k not in data]
    if missing:
        raise _corrupt(node_id, path, f"missing {', '.join(missing)}")
    if not isinstance(data["files"], list) or not isinstance(data["documents"], list):
        raise _corrupt(node_id, path, "files and documents must be lists")
    return data


def _files_from_yaml(data: dict[str, Any], node_id: str, path: Path) -> list[_FileEntry]:
    files = []
    for i, item in enumerate(data["files"]):
        try:
            chunks = item["chunks"]
            if not isinstance(chunks, list) or not all(isinstance(c, str) for c in chunks):
                raise TypeError
            files.append(
                _FileEntry(
                    source=str(item["source"]),
                    entry=str(item.get("entry", item["source"])),
                    path=item.get("path"),
                    sha256=str(item["sha256"]),
                    extension=str(item.get("extension", "")),
                    chunks=chunks,
                )
            )
        except (KeyError, TypeError):
            raise _corrupt(node_id, path, f"files[{i}] is malformed") from None
    return files


def _config_from_yaml(data: dict[str, Any]) -> KbConfig:
    return KbConfig(
        documents=[str(d) for d in data["documents"]],
        embedding_model=data["embedding_model"],
        chunk_size=data["chunk_size"],
        chunk_overlap=data["chunk_overlap"],
        reranker_model=data.get("reranker_model"),
        batch_size=data.get("batch_size"),
        top_k=data.get("top_k"),
    )


def load_knowledge_base(agent_dir: Path, node_id: str) -> KnowledgeBase:
    """Load ``<agent_dir>/<node_id>.yaml`` and its vectors and index.

    Raises:
        RagError: the file is missing or damaged.
    """
    import numpy as np

    agent_dir = Path(agent_dir)
    path = kb_file(agent_dir, node_id)
    if not path.exists():
        raise RagError(f"knowledge base {path} does not exist", node_id=node_id)
    data = _read_kb_yaml(agent_dir, node_id)
    config = _config_from_yaml(data)
    files = _files_from_yaml(data, node_id, path)
    count = sum(len(f.chunks) for f in files)
    vectors_path = _inside(agent_dir, str(data["vectors"]), f"the vectors file of {path.name}")
    try:
        vectors = np.load(vectors_path, allow_pickle=False)
    except FileNotFoundError:
        raise _corrupt(node_id, path, f"its vectors file {vectors_path} is missing") from None
    except (OSError, ValueError) as exc:
        raise _corrupt(
            node_id, path, f"its vectors file {vectors_path} is unreadable ({exc})"
        ) from None
    dim = data.get("dimension")
    if (
        vectors.ndim != 2
        or vectors.shape[0] != count
        or (dim is not None and vectors.shape[1] != dim)
    ):
        raise _corrupt(
            node_id,
            path,
            f"{vectors_path.name} holds vectors of shape {tuple(vectors.shape)} "
            f"but the file lists {count} chunks of dimension {dim}",
        )
    index_rel = data.get("index")
    index_path = None
    if index_rel:
        index_path = _inside(agent_dir, str(index_rel), f"the index of {path.name}")
    try:
        index = HybridIndex.load(
            [c for f in files for c in f.chunks], vectors.astype(np.float32, copy=False), index_path
        )
    except (RuntimeError, ValueError, OSError) as exc:
        raise _corrupt(node_id, path, f"its index {index_path} is unreadable ({exc})") from None
    return KnowledgeBase(
        node_id=node_id, path=path, config=config, files=files, vectors=vectors, index=index
    )


def _relative(path: str | None, agent_dir: Path) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).relative_to(agent_dir.resolve()).as_posix()
    except ValueError:
        return path


def _save(
    agent_dir: Path, node_id: str, kb: KnowledgeBase, dimension: int, skipped: list[str]
) -> None:
    """Write vectors and index under fresh names, then the YAML that points at them.

    The YAML is replaced last and atomically, so a crash leaves either the old
    knowledge base or the new one, never a mix; superseded files are removed after.
    """
    import numpy as np

    yaml = _yaml()
    data_dir = _data_dir(agent_dir, node_id)
    data_dir.mkdir(parents=True, exist_ok=True)
    tag = hashlib.sha256(np.ascontiguousarray(kb.vectors).tobytes()).hexdigest()[:12]
    vectors_path = data_dir / f"vectors-{tag}.npy"
    index_path = data_dir / f"index-{tag}.hnsw"
    np.save(vectors_path, kb.vectors, allow_pickle=False)
    kb.index.save_hnsw(index_path)
    cfg = kb.config
    document = {
        "version": KB_FORMAT_VERSION,
        "node_id": node_id,
        "embedding_model": cfg.embedding_model,
        "chunk_size": cfg.chunk_size,
        "chunk_overlap": cfg.chunk_overlap,
        "reranker_model": cfg.reranker_model,
        "batch_size": cfg.batch_size,
        "top_k": cfg.top_k,
        "documents": list(cfg.documents),
        "dimension": dimension,
        "chunk_count": len(kb.chunk_texts),
        "vectors": vectors_path.relative_to(agent_dir).as_posix(),
        "index": index_path.relative_to(agent_dir).as_posix() if index_path.exists() else None,
        "skipped": skipped,
        "files": [
            {
                "source": f.source,
                "entry": f.entry,
                "path": _relative(f.path, agent_dir),
                "sha256": f.sha256,
                "extension": f.extension,
                "chunks": f.chunks,
            }
            for f in kb.files
        ],
    }
    base = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

    class Dumper(base):  # type: ignore[misc, valid-type]
        """Multi-line chunks as literal blocks, so the file reads like the documents."""

    def represent_str(dumper: Any, value: str) -> Any:
        style = "|" if "\n" in value else None  # the emitter falls back if a block can't hold it
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, represent_str)
    header = (
        f"# Knowledge base of rag node '{node_id}', written by graphrun. Do not edit.\n"
        f"# Delete this file and {data_dir.name}/ to rebuild it on the next run.\n"
    )
    text = header + yaml.dump(
        document, Dumper=Dumper, sort_keys=False, allow_unicode=True, width=1_000_000
    )
    target = kb_file(agent_dir, node_id)
    fd, tmp = tempfile.mkstemp(prefix=f".{node_id}.", suffix=".yaml.tmp", dir=agent_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    keep = {vectors_path.name, index_path.name}
    for old in data_dir.iterdir():
        if old.name not in keep and old.suffix in (".npy", ".hnsw"):
            old.unlink(missing_ok=True)


# --- building ----------------------------------------------------------------------


@dataclass
class _BuildPlan:
    """A build up to its embedding: the files, the vectors reused, the chunks to embed."""

    agent_dir: Path
    node_id: str
    cfg: KbConfig
    embedder: Embedder
    report: RebuildReport
    files: list[_FileEntry]
    pieces: list[np.ndarray | None]  # a file's reused vectors, or None: embedded now
    to_embed: list[str]


def _build(
    agent_dir: Path,
    node_id: str,
    cfg: KbConfig,
    *,
    previous: KnowledgeBase | None,
    loaders: Mapping[str, str] | None,
    embedder: Embedder | None,
    config_dir: Path | None = None,
) -> tuple[KnowledgeBase, RebuildReport]:
    plan = _plan_build(
        agent_dir,
        node_id,
        cfg,
        previous=previous,
        loaders=loaders,
        embedder=embedder,
        config_dir=config_dir,
    )
    parts = [plan.embedder.embed(part) for part in _slices(plan.to_embed, node_id)]
    return _finish_build(plan, parts)


async def _build_async(
    agent_dir: Path,
    node_id: str,
    cfg: KbConfig,
    *,
    config_dir: Path | None,
    client: Any,
    offload: Offload,
) -> tuple[KnowledgeBase, RebuildReport]:
    """:func:`_build` from a coroutine on a run's event loop: documents are loaded and
    chunked, and the index built and saved, through ``offload``; the embedding
    requests are awaited on the loop with ``client``."""
    plan = await offload(
        functools.partial(
            _plan_build,
            agent_dir,
            node_id,
            cfg,
            previous=None,
            loaders=None,
            embedder=None,
            config_dir=config_dir,
        )
    )
    parts = [
        await embed_async(plan.embedder, part, client=client, offload=offload)
        for part in _slices(plan.to_embed, node_id)
    ]
    result: tuple[KnowledgeBase, RebuildReport] = await offload(_finish_build, plan, parts)
    return result


def _plan_build(
    agent_dir: Path,
    node_id: str,
    cfg: KbConfig,
    *,
    previous: KnowledgeBase | None,
    loaders: Mapping[str, str] | None,
    embedder: Embedder | None,
    config_dir: Path | None,
) -> _BuildPlan:
    """Load and chunk the documents; keep the vectors of files that did not change."""

    assert cfg.embedding_model and cfg.chunk_size is not None and cfg.chunk_overlap is not None
    cfg.check(node_id)
    embedder = embedder or client_embedder(
        cfg.embedding_model, config_dir=config_dir, batch_size=cfg.batch_size, node_id=node_id
    )
    loaded = load_documents(cfg.documents, agent_dir, node_id=node_id, loaders=loaders)
    report = RebuildReport(skipped=[s for s, _ in loaded.skipped])

    # Vectors can be reused only if they were made the same way.
    reusable: dict[str, tuple[_FileEntry, np.ndarray]] = {}
    if previous is not None:
        same = (
            previous.config.embedding_model == cfg.embedding_model
            and previous.config.chunk_size == cfg.chunk_size
            and previous.config.chunk_overlap == cfg.chunk_overlap
        )
        row = 0
        for f in previous.files:
            n = len(f.chunks)
            if same:
                reusable[f.source] = (f, previous.vectors[row : row + n])
            row += n
        current = {d.source for d in loaded.documents}
        report.removed = [f.source for f in previous.files if f.source not in current]

    files: list[_FileEntry] = []
    pieces: list[np.ndarray | None] = []
    to_embed: list[str] = []
    for doc in loaded.documents:
        old = reusable.get(doc.source)
        if old is not None and old[0].sha256 == doc.sha256:
            files.append(old[0])
            pieces.append(old[1])
            report.unchanged.append(doc.source)
            report.chunks_reused += len(old[0].chunks)
            continue
        if previous is not None:
            known = any(f.source == doc.source for f in previous.files)
            (report.changed if known else report.added).append(doc.source)
        else:
            report.added.append(doc.source)
        chunks = split_text(
            doc.text,
            chunk_size=cfg.chunk_size,
            chunk_overlap=cfg.chunk_overlap,
            extension=doc.extension,
        )
        files.append(_entry(doc, chunks))
        pieces.append(None)
        to_embed.extend(chunks)

    if not any(f.chunks for f in files):
        raise RagError(
            "the documents contain no text to index",
            node_id=node_id,
            hint="check that documents points at text, markdown, HTML or PDF files",
        )
    report.chunks_embedded = len(to_embed)
    return _BuildPlan(agent_dir, node_id, cfg, embedder, report, files, pieces, to_embed)


def _finish_build(plan: _BuildPlan, parts: list[np.ndarray]) -> tuple[KnowledgeBase, RebuildReport]:
    """Put reused and fresh vectors (``parts``: the slices embedded, in order) in
    place, index them and save the knowledge base."""
    import numpy as np

    agent_dir, node_id, files = plan.agent_dir, plan.node_id, plan.files
    fresh = None if not parts else parts[0] if len(parts) == 1 else np.vstack(parts)
    dims = {p.shape[1] for p in plan.pieces if p is not None and len(p)}
    if fresh is not None:
        dims.add(fresh.shape[1])
    if len(dims) > 1:
        raise RagError(
            f"embedding size changed ({sorted(dims)}) while reusing stored vectors",
            node_id=node_id,
            hint=f"delete {kb_file(agent_dir, node_id).name} to rebuild from scratch",
        )
    dim = dims.pop()
    total = sum(len(f.chunks) for f in files)
    vectors = np.zeros((total, dim), dtype=np.float32)
    row = fresh_row = 0
    for f, piece in zip(files, plan.pieces, strict=True):
        n = len(f.chunks)
        if piece is not None:
            vectors[row : row + n] = piece
        else:
            assert fresh is not None
            vectors[row : row + n] = fresh[fresh_row : fresh_row + n]
            fresh_row += n
        row += n
    texts = [c for f in files for c in f.chunks]
    kb = KnowledgeBase(
        node_id=node_id,
        path=kb_file(agent_dir, node_id),
        config=plan.cfg,
        files=files,
        vectors=vectors,
        index=HybridIndex.build(texts, vectors),
    )
    kb._embedder = plan.embedder
    _save(agent_dir, node_id, kb, dim, plan.report.skipped)
    return kb, plan.report


def _entry(doc: LoadedDocument, chunks: list[str]) -> _FileEntry:
    return _FileEntry(
        source=doc.source,
        entry=doc.entry,
        path=doc.path,
        sha256=doc.sha256,
        extension=doc.extension,
        chunks=chunks,
    )


def _ask_until(
    ask: AskFn, prompt: str, default: str | None, parse: Callable[[str], Any], node_id: str
) -> Any:
    problem = ""
    for _ in range(_MAX_ASKS):
        answer = ask(prompt + problem, default)
        answer = (answer or "").strip() or (default or "")
        try:
            return parse(answer)
        except (ValueError, RagError) as exc:
            problem = f" ({exc})"
    raise RagError(f"no valid answer to '{prompt}' after {_MAX_ASKS} tries", node_id=node_id)


def _parse_int(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"'{text}' is not a whole number") from None
        if value < minimum:
            raise ValueError(f"must be at least {minimum}")
        return value

    return parse


def _parse_model(text: str) -> str:
    if not text:
        raise ValueError("an embedding model is required")
    make_embedder(text)  # validates the <client>:<model> form and local names
    return text


def _complete_interactively(cfg: KbConfig, node_id: str, path: Path, ask: AskFn) -> KbConfig:
    answer = ask(
        f"Rag node '{node_id}' has no knowledge base yet ({path.name}). Initialize it now? [y/n]",
        "y",
    )
    if (answer or "").strip().lower() not in ("y", "yes"):
        raise RagError(
            f"knowledge base initialization declined; the graph cannot run without {path.name}",
            node_id=node_id,
            hint="answer yes, or set embedding_model, chunk_size and chunk_overlap on the node",
        )
    model = cfg.embedding_model or _ask_until(
        ask,
        "Embedding model (<client>:<model>, e.g. openai:text-embedding-3-small or local:hash-384)",
        None,
        _parse_model,
        node_id,
    )
    size = cfg.chunk_size
    if size is None:
        size = _ask_until(ask, "Chunk size (characters)", "1000", _parse_int(1), node_id)
    overlap = cfg.chunk_overlap
    if overlap is None:
        assert size is not None

        def parse_overlap(text: str) -> int:
            value = _parse_int(0)(text)
            if value >= size:
                raise ValueError(f"must be smaller than the chunk size {size}")
            return value

        overlap = _ask_until(
            ask, "Chunk overlap (characters)", str(size // 20), parse_overlap, node_id
        )
    return replace(cfg, embedding_model=model, chunk_size=size, chunk_overlap=overlap)


def _slices(texts: list[str], node_id: str) -> Iterator[list[str]]:
    """``texts`` in slices to embed one after the other, with a transient progress
    bar on a terminal (advanced as the next slice is asked for)."""
    from graphrun.actors.progress import progress_bar

    if not texts:
        return
    step = 256
    with progress_bar(f"indexing {node_id}", len(texts)) as advance:
        for start in range(0, len(texts), step):
            part = texts[start : start + step]
            yield part
            advance(len(part))


def load_or_build(
    agent_dir: Path,
    node_id: str,
    cfg: KbConfig,
    *,
    interactive: bool,
    ask: AskFn | None,
    rag_defaults: Mapping[str, Any] | None,
    loaders: Mapping[str, str] | None = None,
    embedder: Embedder | None = None,
    config_dir: Path | None = None,
) -> KnowledgeBase:
    """Load a rag node's knowledge base, or build it following the spec's rules.

    Args:
        agent_dir: The agent directory (relative documents resolve against it).
        node_id: The rag node's id; the file is ``<agent_dir>/<node_id>.yaml``.
        cfg: The node's settings.
        interactive: Whether a person can be asked (a TTY is attached).
        ask: ``ask(prompt, default) -> answer``, used only when interactive.
        rag_defaults: App-level ``rag_*`` settings for fields the node leaves unset.
        loaders: Loader commands by protocol, for ``protocol:resource`` documents.
        embedder: An embedder to use instead of the one ``embedding_model`` names.
        config_dir: The config directory whose ``config.yaml`` clients a
            ``<client>:<model>`` embedding model may name.

    Raises:
        RagError: the file is damaged; or it is missing and cannot be built
            (not fully specified and non-interactive, initialization declined,
            bad documents, a failing embedding endpoint).
    """
    found = _loaded_or_settings(
        Path(agent_dir), node_id, cfg, interactive, ask, rag_defaults, config_dir
    )
    if isinstance(found, KnowledgeBase):
        return found
    kb, _ = _build(
        Path(agent_dir),
        node_id,
        found,
        previous=None,
        loaders=loaders,
        embedder=embedder,
        config_dir=config_dir,
    )
    kb.config_dir = config_dir
    return kb


async def load_or_build_async(
    agent_dir: Path,
    node_id: str,
    cfg: KbConfig,
    *,
    rag_defaults: Mapping[str, Any] | None,
    config_dir: Path | None,
    client: Any,
    offload: Offload,
) -> KnowledgeBase:
    """:func:`load_or_build` (non-interactive) from a coroutine on a run's event
    loop: reading and building go through ``offload`` (the run's executor), a
    build's embedding requests are awaited on the loop with ``client``.

    Raises:
        RagError: as :func:`load_or_build`.
    """
    agent_dir = Path(agent_dir)
    found = await offload(
        _loaded_or_settings, agent_dir, node_id, cfg, False, None, rag_defaults, config_dir
    )
    if isinstance(found, KnowledgeBase):
        return found
    kb, _ = await _build_async(
        agent_dir, node_id, found, config_dir=config_dir, client=client, offload=offload
    )
    kb.config_dir = config_dir
    return kb


def _loaded_or_settings(
    agent_dir: Path,
    node_id: str,
    cfg: KbConfig,
    interactive: bool,
    ask: AskFn | None,
    rag_defaults: Mapping[str, Any] | None,
    config_dir: Path | None,
) -> KnowledgeBase | KbConfig:
    """The knowledge base when its file exists; else the settings to build it with
    (completed by asking, when interactive)."""
    path = kb_file(agent_dir, node_id)
    if path.exists():
        loaded = load_knowledge_base(agent_dir, node_id)
        loaded.config_dir = config_dir
        return loaded
    full = cfg.with_defaults(rag_defaults)
    full.check(node_id)
    if not full.fully_specified:
        if not interactive or ask is None:
            raise RagError(
                f"the knowledge base {path.name} is not built and the node does not say "
                f"how to build it",
                node_id=node_id,
                hint="set embedding_model, chunk_size and chunk_overlap on the node "
                "(or the rag_* defaults), or run the agent once interactively",
            )
        full = _complete_interactively(full, node_id, path, ask)
    if full.top_k is None:
        full = replace(full, top_k=DEFAULT_TOP_K)
    return full


def rebuild(
    agent_dir: Path,
    node_id: str,
    cfg: KbConfig,
    *,
    rag_defaults: Mapping[str, Any] | None = None,
    loaders: Mapping[str, str] | None = None,
    embedder: Embedder | None = None,
    config_dir: Path | None = None,
) -> RebuildReport:
    """Bring a knowledge base up to date with ``cfg.documents``, re-embedding little.

    Files whose sha256 is unchanged keep their chunks and vectors; new and
    changed files are chunked and embedded; files no longer found are dropped.
    Build settings come from ``cfg``, then ``rag_defaults``, then the existing
    knowledge base; changing the embedding model or chunking re-embeds all.
    An explicit rebuild also replaces a damaged knowledge base.

    Raises:
        RagError: the settings are incomplete (no existing knowledge base and
            not fully specified), or loading/embedding fails.
    """
    agent_dir = Path(agent_dir)
    previous: KnowledgeBase | None = None
    if kb_file(agent_dir, node_id).exists():
        try:
            previous = load_knowledge_base(agent_dir, node_id)
        except RagError:
            previous = None  # asked for explicitly: the damaged one is replaced
    full = cfg.with_defaults(rag_defaults)
    if previous is not None:
        pc = previous.config
        full = replace(
            full,
            embedding_model=full.embedding_model or pc.embedding_model,
            chunk_size=full.chunk_size if full.chunk_size is not None else pc.chunk_size,
            chunk_overlap=full.chunk_overlap
            if full.chunk_overlap is not None
            else pc.chunk_overlap,
            reranker_model=full.reranker_model or pc.reranker_model,
            batch_size=full.batch_size or pc.batch_size,
            top_k=full.top_k or pc.top_k,
        )
    if not full.fully_specified:
        raise RagError(
            "cannot rebuild the knowledge base: the build settings are incomplete",
            node_id=node_id,
            hint="set embedding_model, chunk_size and chunk_overlap on the node",
        )
    if full.top_k is None:
        full = replace(full, top_k=DEFAULT_TOP_K)
    _, report = _build(
        agent_dir,
        node_id,
        full,
        previous=previous,
        loaders=loaders,
        embedder=embedder,
        config_dir=config_dir,
    )
    return report


def sources_changed(
    agent_dir: Path,
    node_id: str,
    cfg: KbConfig,
    *,
    loaders: Mapping[str, str] | None = None,
) -> list[str]:
    """Sources that differ from what the knowledge base was built from.

    Lists ``documents`` entries added or removed since the build, local files
    that are new, gone, or whose sha256 changed. URLs and loader-protocol
    documents are not fetched (only their presence in ``documents`` is
    compared). Returns ``[]`` when there is no knowledge base yet.

    Raises:
        RagError: the knowledge base file is damaged.
    """
    agent_dir = Path(agent_dir)
    if not kb_file(agent_dir, node_id).exists():
        return []
    data = _read_kb_yaml(agent_dir, node_id)
    files = _files_from_yaml(data, node_id, kb_file(agent_dir, node_id))
    stored_docs = [str(d) for d in data["documents"]]
    changed: list[str] = []
    changed += [d for d in cfg.documents if d not in stored_docs]
    changed += [d for d in stored_docs if d not in cfg.documents]
    stored = {f.source: f for f in files}
    skipped = {str(s) for s in data.get("skipped") or []}
    seen: set[str] = set()
    for entry in cfg.documents:
        if entry not in stored_docs or is_url(entry):
            continue
        try:
            refs = resolve_sources([entry], agent_dir, loaders=loaders)
        except RagError:
            changed.append(entry)  # it no longer resolves: a file or folder is gone
            continue
        for ref in refs:
            seen.add(ref.source)
            if ref.path is None:
                continue
            old = stored.get(ref.source)
            if old is None and ref.source in skipped:
                continue  # a non-text file in a folder, skipped at build time too
            try:
                digest = sha256_of_file(ref.path)
            except OSError:
                changed.append(ref.source)
                continue
            if old is None or old.sha256 != digest:
                changed.append(ref.source)
    for f in files:
        gone = f.path is not None and f.entry in cfg.documents and f.source not in seen
        if gone and f.entry not in changed:
            changed.append(f.source)
    return list(dict.fromkeys(changed))


def kb_config(node: Any) -> KbConfig:
    """A knowledge base's settings from a rag node (its graph.yaml Struct or a mapping)."""
    get = node.get if isinstance(node, dict) else lambda k, d=None: getattr(node, k, d)
    return KbConfig(
        documents=list(get("documents") or []),
        embedding_model=get("embedding_model"),
        chunk_size=get("chunk_size"),
        chunk_overlap=get("chunk_overlap"),
        reranker_model=get("reranker_model"),
        batch_size=get("batch_size"),
        top_k=get("top_k"),
    )
