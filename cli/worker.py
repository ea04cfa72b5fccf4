"""``submit``, ``worker``, ``migrate``: runs driven by workers on a shared database."""

from __future__ import annotations

import click

from graphrun.cli.options import (
    db_option,
    db_url,
    json_option,
    open_store,
    set_option,
    var_option,
)


@click.command("submit")
@click.argument("agent")
@click.argument("prompt", required=False, default="")
@set_option
@var_option
@click.option("--as", "as_user", metavar="USER", help="Who submits (default: the OS user).")
@click.option("--agents-dir", metavar="DIR", envvar="GRAPHRUN_AGENTS_DIR", help="Agents directory.")
@click.option("--config-dir", "--loki-dir", "config_dir", metavar="DIR", help="Config directory.")
@json_option
@db_option
def submit_cmd(
    agent: str,
    prompt: str,
    sets: tuple[str, ...],
    var_flags: tuple[str, ...],
    as_user: str | None,
    agents_dir: str | None,
    config_dir: str | None,
    as_json: bool,
    db: str | None,
) -> None:
    """Queue a run of AGENT with PROMPT for `graphrun worker`; print its id.

    The graph is checked here, as `graphrun run` checks it; a worker (on any
    machine sharing the PostgreSQL database, with the agent at the same path)
    drives it. Needs --db postgresql://… or $GRAPHRUN_DB.
    """
    import json

    from graphrun.cli.render import print_diagnostics
    from graphrun.cli.run import _parse_set
    from graphrun.runtime.agents import load_agent
    from graphrun.runtime.engine.driver import RunOptions, check_graph
    from graphrun.runtime.engine.workers import needs_queue, submit_run
    from graphrun.runtime.graph.config import agents_dir as resolve_agents
    from graphrun.runtime.graph.config import config_dir as resolve_config
    from graphrun.runtime.graph.config import resolve_agent
    from graphrun.runtime.graph.preflight import preflight

    overrides = _parse_set(sets)
    store = open_store(db, create=True)
    needs_queue(store)
    cfg = resolve_config(config_dir)
    agents = resolve_agents(agents_dir, config=cfg)
    loaded = load_agent(resolve_agent(agent, agents), config_dir=cfg)
    if loaded.graph.settings.validate_before_run:
        print_diagnostics(check_graph(loaded, agents_dir=agents, config_dir=cfg))
    from graphrun.runtime.graph.variables import parse_presets, with_variables
    from graphrun.runtime.graph.variables import resolve as resolve_variables

    # Resolved here, where the command runs: a worker has no one to ask.
    variables = resolve_variables(loaded, parse_presets(var_flags))
    loaded = with_variables(loaded, variables)
    preflight(loaded, RunOptions(agents_dir=agents, config_dir=cfg))
    run_id = submit_run(
        store,
        loaded,
        prompt=prompt,
        overrides=overrides,
        as_user=as_user,
        agents_dir=agents,
        config_dir=cfg,
        config={"variables": variables},
    )
    if as_json:
        click.echo(json.dumps({"run_id": run_id, "status": "queued"}))
    else:
        click.echo(run_id)


@click.command("worker")
@click.option(
    "--concurrency", "-c", type=int, default=1, show_default=True, help="Runs driven at once."
)
@click.option("--once", is_flag=True, help="Exit when no run is left to claim.")
@click.option(
    "--lease",
    "lease_seconds",
    type=float,
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="How long a claimed run stays this worker's without a heartbeat.",
)
@click.option(
    "--grace",
    type=float,
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="On SIGTERM/Ctrl-C: how long runs in flight may take to finish before "
    "they are handed back to the queue.",
)
@click.option("--poll", type=float, default=0.2, show_default=True, metavar="SECONDS", hidden=True)
@db_option
def worker_cmd(
    concurrency: int,
    once: bool,
    lease_seconds: float,
    grace: float,
    poll: float,
    db: str | None,
) -> None:
    """Drive submitted runs: claim queued ones and those whose worker died.

    A run that waits for a person is released; `graphrun approve`/`answer`
    queue it again for any worker. SIGTERM (or Ctrl-C) stops claiming, lets the
    runs in flight finish for --grace seconds, and hands back the rest.
    Needs --db postgresql://… or $GRAPHRUN_DB.
    """
    import os
    import signal
    import sys

    from graphrun.runtime.engine.workers import Worker

    def say(line: str) -> None:
        click.echo(line, err=True)

    stopping: list[str] = []  # a signal before the worker exists stops it at once
    for signum, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "interrupted")):
        signal.signal(signum, lambda *_a, _name=name: stopping.append(_name))
    url = db_url(db)
    if url is not None and concurrency + 4 > 16:
        # A connection per slot, and some for the heartbeat and claims.
        from graphrun.eventstore.postgres import PostgresStore

        durability = os.environ.get("GRAPHRUN_DURABILITY", "normal").strip().lower() or "normal"
        store = PostgresStore(url, durability=durability, max_connections=concurrency + 4)
    else:
        store = open_store(db, create=True)
    worker = Worker(
        store,
        concurrency=concurrency,
        lease_seconds=lease_seconds,
        poll=poll,
        once=once,
        grace=grace,
        say=say,
    )
    for signum, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "interrupted")):
        signal.signal(signum, lambda *_a, _name=name: worker.stop(_name))
    if stopping:
        worker.stop(stopping[0])
    say(f"▸ {worker.name}: {concurrency} slot(s) on {store.path}")
    stats = worker.run()
    say(
        f"▸ worker done: {stats.claimed} claimed, {stats.completed} completed, "
        f"{stats.failed} failed, {stats.waiting} waiting, {stats.handed_back} handed back"
    )
    if stats.handed_back:
        # Runs handed back are still being driven by threads of this process:
        # leave now, without waiting for them (another worker continues them).
        sys.stderr.flush()
        os._exit(0)
    store.close()


@click.command("migrate")
@click.option("--from", "source", required=True, metavar="FILE|URL", help="Copy runs from here.")
@click.option("--to", "target", required=True, metavar="FILE|URL", help="Copy runs to here.")
@click.option("--run", "run_ids", multiple=True, metavar="RUN", help="Only this run (repeatable).")
def migrate_cmd(source: str, target: str, run_ids: tuple[str, ...]) -> None:
    """Copy runs between event stores (SQLite file ↔ postgresql://), hash chains intact.

    Every copied run verifies in the target with the hashes it had; a run
    already there with the same events is skipped.
    """
    from pathlib import Path

    from graphrun.eventstore import open_store as open_by_name
    from graphrun.eventstore.errors import StoreError
    from graphrun.eventstore.postgres import copy_runs, is_postgres_url

    def opened(name: str, *, create: bool) -> object:
        if not is_postgres_url(name) and not create and not Path(name).exists():
            raise StoreError(f"no event database at {name}")
        return open_by_name(name, create=create)

    src = opened(source, create=False)
    dst = opened(target, create=True)
    copied, present = copy_runs(
        src, dst, say=lambda line: click.echo(line, err=True), run_ids=run_ids or None
    )
    click.echo(f"copied {copied} run(s), {present} already there", err=True)
