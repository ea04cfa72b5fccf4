"""``rag`` nodes: knowledge bases built at load time, retrieval recorded as an event.

Knowledge bases are prepared when an agent is loaded (:func:`prepare_knowledge_bases`,
following the spec's four load rules: an existing ``<node-id>.yaml`` is loaded; a
fully specified node builds without prompts; otherwise a terminal asks, and a
non-interactive run fails with a hint). At run time :class:`RagActor` queries on
the run's event loop (the query's embedding request awaited there, the index
searched on the run's executor) and records ``RetrievalDone``, so replay never
needs the index.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

from graphrun.actors.messages import RagTask
from graphrun.actors.paths import outside_hint, outside_problem
from graphrun.actors.rag.loaders import document_problem
from graphrun.eventstore.events import RetrievalDone
from graphrun.eventstore.fold import RunState
from graphrun.runtime.errors import GraphrunError
from graphrun.runtime.graph.check import node_path
from graphrun.runtime.graph.expressions import ExpressionError
from graphrun.runtime.graph.loader import LoadedGraph
from graphrun.runtime.graph.model import ErrorRoute, Graph, NodeBase, RetryPolicy, Route
from graphrun.runtime.graph.routing import error_route, pick_route
from graphrun.runtime.graph.templates import render, render_updates
from graphrun.runtime.nodes.error_kinds import kind_of_result
from graphrun.runtime.nodes.kind import NodeKind
from graphrun.runtime.nodes.plan import (
    Append,
    Perform,
    Step,
    completed,
    fail,
    last,
    tolerated,
)

if TYPE_CHECKING:
    from graphrun.eventstore.events import Event
    from graphrun.runtime.nodes.ports import RunPorts


class RagNode(NodeBase, tag="rag", kw_only=True):
    routes: list[Route] = msgspec.field(default_factory=list)
    on_error: list[ErrorRoute] = msgspec.field(default_factory=list)
    retry: RetryPolicy | None = None
    documents: list[str] = msgspec.field(default_factory=list)
    query: str = "{{initial_prompt}}"
    top_k: int | None = None
    timeout: float = 120.0
    embedding_model: str | None = None
    chunk_size: int | None = None
    chunk_overlap: int | None = None
    reranker_model: str | None = None
    batch_size: int | None = None
    # Loki's graph-RAG and storage fields (accepted, not implemented: validation warns).
    extractor_model: str | None = None
    extractor_prompt: str | None = None
    graph_hops: int | None = None
    driver: str | None = None

    DESCRIPTIONS: ClassVar[dict[str | None, str]] = {
        None: "Hybrid (vector + keyword) retrieval over the node's knowledge base; the "
        "result goes to state through state_updates.",
        "documents": "Knowledge sources: files, folders, URLs, relative to the agent "
        "directory (required).",
        "query": "The retrieval query; templated (default {{initial_prompt}}).",
        "top_k": "How many chunks to retrieve (default: the knowledge base's).",
        "timeout": "Retrieval timeout in seconds (default 120).",
        "embedding_model": "Embedding model for the corpus (used when the knowledge base "
        "is built).",
        "chunk_size": "Chunk size when the knowledge base is built.",
        "chunk_overlap": "Overlap between chunks when the knowledge base is built.",
        "reranker_model": "Reranker applied to the hybrid results.",
        "batch_size": "Embedding-request batch size.",
        "extractor_model": "Loki's graph-RAG extractor (accepted; not implemented).",
        "extractor_prompt": "Loki's graph-RAG prompt (accepted; not implemented).",
        "graph_hops": "Loki's graph-RAG depth (accepted; not implemented).",
        "driver": "Loki's knowledge-base storage driver (accepted; not implemented).",
        "next": "Where to go after retrieval (required).",
        "state_updates": "Where the result goes: {{output.context}} (the text block) and "
        "{{output.sources}} (the source list).",
    }
    NEEDS_NEXT: ClassVar[bool] = True
    SCOPED: ClassVar[str] = "output"

    def strict_fields(self) -> list[tuple[str, object]]:
        return [("query", self.query)]

    def rules(self, node_id: str, check: Any) -> list[Any]:
        out = super().rules(node_id, check) + self._document_rules(node_id, check)
        if check.deep and self.documents:
            out += self._sources_unchanged(node_id, check)
        return out

    def _document_rules(self, nid: str, c: Any) -> list[Any]:
        """Knowledge sources inside the agent directory; a result that goes somewhere."""
        out = []
        if not self.documents:
            out.append(
                c.diag(
                    "error",
                    "rag-no-documents",
                    f"rag node '{nid}' has no documents",
                    node_path(nid),
                    node=nid,
                    hint="at least one knowledge source is required",
                )
            )
        for index, entry in enumerate(self.documents):
            problem = document_problem(entry, c.loaded.agent_dir) if entry else None
            if problem is not None:
                out.append(
                    c.diag(
                        "error",
                        "document-outside",
                        f"rag node '{nid}': {problem}",
                        node_path(nid, "documents") + f"[{index}]",
                        node=nid,
                        hint=outside_hint(),
                    )
                )
        kb_file = outside_problem(
            c.loaded.agent_dir, f"{nid}.yaml", what=f"the knowledge base file of rag node '{nid}'"
        )
        if kb_file is not None:
            out.append(c.diag("error", "kb-outside", kb_file, node_path(nid), node=nid))
        if not self.state_updates:
            out.append(
                c.diag(
                    "warning",
                    "rag-no-state-updates",
                    f"rag node '{nid}' has no state_updates: its result goes nowhere",
                    node_path(nid),
                    node=nid,
                )
            )
        return out

    def _sources_unchanged(self, nid: str, c: Any) -> list[Any]:
        """Knowledge bases are never rebuilt silently: warn when their sources changed."""
        from graphrun.actors.rag.retrieval import kb_config, kb_file, sources_changed

        if not kb_file(c.loaded.agent_dir, nid).exists():
            return []
        try:
            changed = sources_changed(c.loaded.agent_dir, nid, kb_config(self))
        except GraphrunError as exc:
            return [c.diag("error", "rag-kb", str(exc), node_path(nid), node=nid)]
        if not changed:
            return []
        shown = ", ".join(changed[:5]) + (", …" if len(changed) > 5 else "")
        return [
            c.diag(
                "warning",
                "rag-sources-changed",
                f"rag node '{nid}': sources changed since its knowledge base was built ({shown})",
                node_path(nid, "documents"),
                node=nid,
                hint=f"graphrun rag rebuild {c.loaded.agent_dir} {nid}",
            )
        ]


#: graphrun's app default for ``rag_embedding_model`` (Loki's example config ships
#: ``null``, which Loki resolves by asking): the offline embedder.
DEFAULT_EMBEDDING_MODEL = "local:hash-384"


def rag_defaults(config_dir: Path | None) -> dict[str, Any]:
    """App-level ``rag_*`` settings from ``<config dir>/config.yaml``;
    ``rag_embedding_model`` is :data:`DEFAULT_EMBEDDING_MODEL` when it sets none."""
    found = _configured(config_dir)
    if not found.get("rag_embedding_model"):
        found["rag_embedding_model"] = DEFAULT_EMBEDDING_MODEL
    return found


def _configured(config_dir: Path | None) -> dict[str, Any]:
    if config_dir is None:
        return {}
    path = config_dir / "config.yaml"
    if not path.exists():
        return {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise GraphrunError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and k.startswith("rag_")}


def kb_config(node: RagNode | dict[str, Any]) -> Any:
    """A knowledge base's settings from a rag node (see ``actors.rag.retrieval``)."""
    from graphrun.actors.rag.retrieval import kb_config as of_node

    return of_node(node)


def _ask(prompt: str, default: str | None) -> str:
    from graphrun.actors.human.prompt import ask_text

    return ask_text(prompt, default=default).text


def prepare_knowledge_bases(
    loaded: LoadedGraph, *, interactive: bool, config_dir: Path | None
) -> dict[str, Any]:
    """Load or build every rag node's knowledge base (at agent load time)."""
    from graphrun.actors.rag.retrieval import load_or_build

    out: dict[str, Any] = {}
    defaults = rag_defaults(config_dir)
    for node_id, node in loaded.graph.nodes.items():
        if isinstance(node, RagNode) and node.documents:
            out[node_id] = load_or_build(
                loaded.agent_dir,
                node_id,
                kb_config(node),
                interactive=interactive,
                ask=_ask if interactive else None,
                rag_defaults=defaults,
                config_dir=config_dir,
            )
    return out


def knowledge_of(loaded: LoadedGraph, options: Any) -> dict[str, Any] | None:
    """A child run's knowledge bases, when its graph has rag nodes (built once, never
    silently: the agent node and the ``agent__*`` tools start children with them)."""
    if not any(isinstance(n, RagNode) for n in loaded.graph.nodes.values()):
        return None
    return prepare_knowledge_bases(loaded, interactive=False, config_dir=options.config_dir)


class RagActor:
    """The ``rag`` node actor: query the node's knowledge base, record the result."""

    node_type = "rag"

    def __init__(self, ports: RunPorts) -> None:
        self.agent_dir = ports.agent_dir
        self.config_dir = ports.options.config_dir
        self.loop = ports.loop
        self.cache: dict[str, Any] = dict(ports.options.extra.get("knowledge_bases", {}))
        # One load or build of a node's knowledge base at a time (parallel branches).
        self._loading: dict[str, Any] = {}

    async def _kb(self, node_id: str, config: dict[str, Any], client: Any, offload: Any) -> Any:
        import asyncio

        lock = self._loading.setdefault(node_id, asyncio.Lock())
        async with lock:
            kb = self.cache.get(node_id)
            if kb is None:
                from graphrun.actors.rag.retrieval import load_or_build_async

                kb = self.cache[node_id] = await load_or_build_async(
                    self.agent_dir,
                    node_id,
                    kb_config(config),
                    rag_defaults=await offload(rag_defaults, self.config_dir),
                    config_dir=self.config_dir,
                    client=client,
                    offload=offload,
                )
        return kb

    async def run(self, task: Any, ctx: Any) -> None:
        """Query the knowledge base (loading it first, the first time) on the run's
        event loop: the query's embedding (and rerank) request is awaited there with
        the loop's HTTP client; the index search, a local embedder and reading or
        building the knowledge base go to the run's executor. The node's timeout
        bounds the query (a loop timer): past it, the request is cancelled and the
        visit fails. The visit's token (the run's timeout, a cancel, an interrupt)
        cancels the build or the query where it awaits, its request closed: the
        task ends cancelled, which the driver reads as the effect cancelled."""
        import asyncio

        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        assert me is not None
        unhook = ctx.cancel.on_cancel(lambda: loop.call_soon_threadsafe(me.cancel))
        try:
            await self._visit(task, ctx)
        finally:
            unhook()

    async def _visit(self, task: Any, ctx: Any) -> None:
        """The visit :meth:`run` describes, without the hook to its token."""
        import asyncio
        import functools

        from graphrun.actors.loop import blocking
        from graphrun.actors.rag.http import loop_client

        started = time.monotonic()

        def done(**fields: Any) -> None:
            ctx.record(
                RetrievalDone(
                    node_id=task.node_id,
                    visit=task.visit,
                    query=task.query,
                    top_k=task.top_k,
                    duration_ms=round((time.monotonic() - started) * 1000, 3),
                    **fields,
                )
            )

        offload = functools.partial(blocking, ctx)
        client = loop_client(self.loop)
        try:
            kb = await self._kb(task.node_id, task.config, client, offload)
        except GraphrunError as exc:
            done(error=str(exc))
            return
        query = kb.query_async(task.query, task.top_k, client=client, offload=offload)
        try:
            result = await asyncio.wait_for(query, task.timeout)
        except TimeoutError:
            done(error=f"retrieval timed out after {task.timeout:g}s")
            return
        except GraphrunError as exc:
            done(error=str(exc))
            return
        done(result=result.as_output(), hits=list(result.hits))


# --- the kind -----------------------------------------------------------------------


def request(graph: Graph, node: RagNode, node_id: str, state: RunState) -> Step:
    query = render(node.query, state.state, strict=True, field=f"{node_id}.query")
    config = {
        "documents": list(node.documents),
        "embedding_model": node.embedding_model,
        "chunk_size": node.chunk_size,
        "chunk_overlap": node.chunk_overlap,
        "reranker_model": node.reranker_model,
        "batch_size": node.batch_size,
    }
    task = RagTask(node_id, state.current_visit, query, node.top_k, node.timeout, config)
    return Perform(node_id, "rag", task)


def complete(
    graph: Graph, node: RagNode, node_id: str, state: RunState, done: RetrievalDone
) -> Step:
    visit = state.current_visit
    if done.error is not None:
        kind = kind_of_result(done)
        target = error_route(node, done.error, kind)
        if target is not None:
            return tolerated(node_id, visit, node, state.state, target, done.error, kind)
        return fail(node_id, visit, done.error, kind)
    updates = render_updates(node.state_updates, state.state, {"output": done.result or {}})
    try:
        routed = pick_route(node, {**state.state, **updates}, node.next)
    except ExpressionError as exc:
        return fail(node_id, visit, str(exc), "ExpressionError")
    if routed is None:
        return fail(node_id, visit, "rag node has no next to route to")
    return Append((completed(node_id, visit, routed, updates=updates),))


def primary(node: RagNode, effects: tuple[Event, ...], done: Any) -> Any:
    """A map item's result (D3): the retrieval's output."""
    retrieved = last(effects, RetrievalDone)
    return (retrieved.result if retrieved is not None else None) or {}


def effect(ports: RunPorts) -> tuple[type, tuple[Any, ...]]:
    return RagActor, (ports,)


KIND = NodeKind(
    type="rag",
    struct=RagNode,
    result=RetrievalDone,
    request=request,
    complete=complete,
    primary=primary,
    effect=effect,
)
