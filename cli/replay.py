"""``validate``, ``replay``, ``test``, ``schema``."""

from __future__ import annotations

import json

import click

from graphrun.cli.options import db_option, json_option, open_store, resolve_run


@click.command("validate")
@click.argument("agent")
@click.option("--agents-dir", metavar="DIR", envvar="GRAPHRUN_AGENTS_DIR", help="Agents directory.")
@click.option(
    "--config-dir",
    "--loki-dir",
    "config_dir",
    metavar="DIR",
    help="Config directory (a Loki configuration directory works as it is).",
)
@click.option(
    "--strict", is_flag=True, help="Unknown fields are errors (by default, warnings Loki ignores)."
)
@json_option
def validate_cmd(
    agent: str, agents_dir: str | None, config_dir: str | None, as_json: bool, strict: bool
) -> None:
    """Check AGENT's graph.yaml: every error and warning, each with file, line and node.

    Exit 2 if there is any error; warnings alone exit 0. An unknown field is a
    warning (Loki ignores it), an error with --strict.
    """
    from graphrun.cli.render import print_diagnostics
    from graphrun.runtime.graph.config import agents_dir as resolve_agents
    from graphrun.runtime.graph.config import config_dir as resolve_config
    from graphrun.runtime.graph.config import resolve_agent
    from graphrun.runtime.graph.validate import validate_all

    cfg = resolve_config(config_dir)
    agents = resolve_agents(agents_dir, config=cfg)
    found = validate_all(resolve_agent(agent, agents), agents_dir=agents, config_dir=cfg)
    if strict:
        import dataclasses

        found = [
            dataclasses.replace(d, severity="error") if d.rule == "unknown-field" else d
            for d in found
        ]
    if as_json:
        click.echo(json.dumps([d.__dict__ for d in found], ensure_ascii=False))
    else:
        print_diagnostics(found)
    errors = sum(d.severity == "error" for d in found)
    warnings = len(found) - errors
    if not as_json:
        status = "invalid" if errors else "valid"
        click.echo(f"{status}: {errors} error(s), {warnings} warning(s)", err=True)
    if errors:
        raise SystemExit(2)


@click.command("replay")
@click.argument("run_id")
@click.option(
    "--graph",
    "graph_path",
    metavar="PATH",
    help="Check the recorded run against this graph instead of its own (regression).",
)
@click.option(
    "--live",
    is_flag=True,
    help="With --graph: perform changed requests for real and record a new run.",
)
@click.option(
    "--update",
    is_flag=True,
    help="With --graph: like --live, without checking model keys first: only changed "
    "LLM requests are sent (the new run is recorded in the database).",
)
@click.option(
    "--rerun-retrieval",
    is_flag=True,
    help="Query today's knowledge bases again instead of serving recorded retrievals.",
)
@click.option(
    "--config-dir",
    "--loki-dir",
    "config_dir",
    metavar="DIR",
    help="Config directory for --graph and --live (clients, tools, MCP servers).",
)
@json_option
@db_option
def replay_cmd(
    run_id: str,
    graph_path: str | None,
    live: bool,
    update: bool,
    rerun_retrieval: bool,
    config_dir: str | None,
    as_json: bool,
    db: str | None,
) -> None:
    """Re-drive RUN_ID through the run loop with every effect served from the log.

    Nothing is performed and nothing is written (with --graph, a script whose file
    changed is re-run offline and judged by its output). Exit 0 if everything
    matches the recording, 1 with every divergence (the nodes first, then each:
    node, event, recorded vs now).
    """
    from graphrun.runtime.replay.command import replay_command

    if config_dir:  # what every later lookup of the config directory reads
        import os

        os.environ["GRAPHRUN_CONFIG_DIR"] = config_dir
    store = open_store(db)
    run_id = resolve_run(store, run_id)
    code = replay_command(
        store,
        run_id,
        graph_path=graph_path,
        live=live or update,
        as_json=as_json,
        db=db,
        preflight=not update,
        rerun_retrieval=rerun_retrieval,
    )
    raise SystemExit(code)


@click.command("test")
@click.argument("paths", nargs=-1)
@click.option("-q", "--quiet", is_flag=True, help="Only the summary and failures.")
@click.option(
    "--update",
    is_flag=True,
    help="Re-record each divergent run against today's graph and rewrite its file: "
    "unchanged effects are reused, only changed ones performed (no API key unless an "
    "LLM request changed).",
)
@click.option("--dry-run", is_flag=True, help="With --update: only say what would be re-recorded.")
@click.option(
    "--answer",
    "answers",
    multiple=True,
    metavar="NODE=VALUE",
    help="With --update: the answer to a question whose text and options changed "
    "(repeatable; a question whose options did not change keeps its recorded answer).",
)
@click.option(
    "--rerun-retrieval",
    is_flag=True,
    help="Query today's knowledge bases again instead of serving recorded retrievals "
    "(offline with a local embedding model), so a changed knowledge base fails a test.",
)
@click.option(
    "--config-dir",
    "--loki-dir",
    "config_dir",
    metavar="DIR",
    help="Config directory the agents' graphs are loaded with (clients, tools, the "
    "default model). Without one a model Loki's config would choose is the recorded one.",
)
@json_option
def test_cmd(
    paths: tuple[str, ...],
    quiet: bool,
    update: bool,
    dry_run: bool,
    answers: tuple[str, ...],
    rerun_retrieval: bool,
    config_dir: str | None,
    as_json: bool,
) -> None:
    """Replay every recorded run (exported files) in PATHs (default: replays/).

    Each run is checked against its agent's current graph.yaml and scripts; a
    changed script is re-run offline and judged by its output. One line per run,
    then `N passed, M failed`; exit 1 on any divergence (every divergence of a run
    is listed).
    """
    if dry_run and not update:
        raise click.UsageError("--dry-run goes with --update")
    if answers and not update:
        raise click.UsageError("--answer goes with --update")
    if config_dir:  # what every later lookup of the config directory reads
        import os

        os.environ["GRAPHRUN_CONFIG_DIR"] = config_dir
    if update:
        from graphrun.actors.human.prompt import is_interactive
        from graphrun.cli.run import _answers
        from graphrun.runtime.replay.update import update_suite

        raise SystemExit(
            update_suite(
                list(paths) or ["replays"],
                dry_run=dry_run,
                answers=_answers(answers),
                interactive=is_interactive(),
            )
        )
    from graphrun.runtime.replay.testing import run_suite

    raise SystemExit(
        run_suite(
            list(paths) or ["replays"],
            quiet=quiet,
            as_json=as_json,
            rerun_retrieval=rerun_retrieval,
        )
    )


@click.command("schema")
def schema_cmd() -> None:
    """Print the JSON Schema of graph.yaml (for editors: yaml-language-server)."""
    from graphrun.runtime.graph.schema import schema_text

    click.echo(schema_text(), nl=False)
