"""``graphrun rag``: knowledge-base maintenance."""

from __future__ import annotations

import click


@click.group("rag")
def rag_group() -> None:
    """Knowledge bases of rag nodes."""


@rag_group.command("rebuild")
@click.argument("agent")
@click.argument("node", required=False)
@click.option("--agents-dir", metavar="DIR", envvar="GRAPHRUN_AGENTS_DIR", help="Agents directory.")
@click.option("--config-dir", metavar="DIR", help="Config directory.")
def rebuild_cmd(
    agent: str, node: str | None, agents_dir: str | None, config_dir: str | None
) -> None:
    """Bring AGENT's knowledge bases (or NODE's) up to date with their documents.

    Only files whose sha256 changed are re-embedded.
    """
    from graphrun.actors.rag.retrieval import rebuild
    from graphrun.runtime.errors import UsageError
    from graphrun.runtime.graph.config import agents_dir as resolve_agents
    from graphrun.runtime.graph.config import config_dir as resolve_config
    from graphrun.runtime.graph.config import resolve_agent
    from graphrun.runtime.graph.loader import load_graph
    from graphrun.runtime.nodes.rag import RagNode, kb_config, rag_defaults

    cfg = resolve_config(config_dir)
    loaded = load_graph(resolve_agent(agent, resolve_agents(agents_dir, config=cfg)))
    nodes = {nid: n for nid, n in loaded.graph.nodes.items() if isinstance(n, RagNode)}
    if node is not None:
        if node not in nodes:
            raise UsageError(f"no rag node '{node}' in {loaded.file}")
        nodes = {node: nodes[node]}
    if not nodes:
        raise UsageError(f"{loaded.file} has no rag nodes")
    for nid, n in nodes.items():
        report = rebuild(
            loaded.agent_dir, nid, kb_config(n), rag_defaults=rag_defaults(cfg), config_dir=cfg
        )
        click.echo(
            f"{nid}: {len(report.added)} added, {len(report.changed)} changed, "
            f"{len(report.removed)} removed, {len(report.unchanged)} unchanged; "
            f"{report.chunks_embedded} chunks embedded, {report.chunks_reused} reused"
        )
