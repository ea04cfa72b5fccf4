"""``rag`` nodes: knowledge bases built at load time, retrieval recorded as an event.

Knowledge bases are prepared when an agent is loaded (:func:`prepare_knowledge_bases`,
following the spec's four load rules: an existing ``<node-id>.yaml`` is loaded; a
fully specified node builds without prompts; otherwise a terminal asks, and a
non-interactive run fails with a hint). At run time :class:`RagActor` queries and
records ``RetrievalDone``, so replay never needs the index.
"""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphrun.actors.messages import RagTask
from graphrun.eventstore.events import RetrievalDone
from graphrun.eventstore.fold import RunState
from graphrun.runtime.errors import GraphrunError
from graphrun.runtime.graph.expressions import ExpressionError
from graphrun.runtime.graph.loader import LoadedGraph
from graphrun.runtime.graph.model import Graph, RagNode
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


class RagActor:
    """The ``rag`` node actor: query the node's knowledge base, record the result."""

    node_type = "rag"

    def __init__(self, ports: RunPorts) -> None:
        self.agent_dir = ports.agent_dir
        self.config_dir = ports.options.config_dir
        self.cache: dict[str, Any] = dict(ports.options.extra.get("knowledge_bases", {}))

    def _kb(self, node_id: str, config: dict[str, Any]) -> Any:
        kb = self.cache.get(node_id)
        if kb is None:
            from graphrun.actors.rag.retrieval import load_or_build

            kb = self.cache[node_id] = load_or_build(
                self.agent_dir,
                node_id,
                kb_config(config),
                interactive=False,
                ask=None,
                rag_defaults=rag_defaults(self.config_dir),
                config_dir=self.config_dir,
            )
        return kb

    def perform(self, task: Any, ctx: Any) -> None:
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

        try:
            kb = self._kb(task.node_id, task.config)
        except GraphrunError as exc:
            done(error=str(exc))
            return
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        future = pool.submit(kb.query, task.query, task.top_k)
        try:
            result = future.result(timeout=task.timeout)
        except concurrent.futures.TimeoutError:
            done(error=f"retrieval timed out after {task.timeout:g}s")
            return
        except GraphrunError as exc:
            done(error=str(exc))
            return
        finally:
            pool.shutdown(wait=False)
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
