"""``upgrade``: move runs in flight onto a fixed graph, checked."""

from __future__ import annotations

import json
from typing import Any

import click

from graphrun.cli.options import db_option, json_option, open_store, resolve_run


@click.command("upgrade")
@click.argument("run_ids", nargs=-1, metavar="[RUN]...")
@click.option("--graph", "graph_dir", required=True, metavar="DIR", help="The new graph.")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(["waiting", "failed", "interrupted"]),
    help="Upgrade every run with this status (repeatable).",
)
@click.option("--agent", "agent_name", metavar="NAME", help="Only runs of this graph name.")
@click.option("--dry-run", is_flag=True, help="Check and say what would happen; write nothing.")
@click.option(
    "--from-seq",
    type=int,
    metavar="N",
    help="Continue from seq N instead, as a new run (a fork) on the new graph.",
)
@click.option("--as", "as_user", metavar="NAME", help="Who upgrades (default: the OS user).")
@click.option("--agents-dir", metavar="DIR", envvar="GRAPHRUN_AGENTS_DIR", help="Agents directory.")
@click.option("--config-dir", "--loki-dir", "config_dir", metavar="DIR", help="Config directory.")
@click.option("--limit", default=1000, show_default=True, help="At most this many runs.")
@json_option
@db_option
def upgrade_cmd(
    run_ids: tuple[str, ...],
    graph_dir: str,
    statuses: tuple[str, ...],
    agent_name: str | None,
    dry_run: bool,
    from_seq: int | None,
    as_user: str | None,
    agents_dir: str | None,
    config_dir: str | None,
    limit: int,
    as_json: bool,
    db: str | None,
) -> None:
    """Move runs onto the graph in DIR: each run's recorded history is replayed
    against it, and only if it reproduces up to where the run stopped (its wait, its
    interruption, the node that failed) does the run continue on the new graph,
    with a GraphUpgraded event naming the old and new graph and who upgraded it. A
    failed run enters the node that failed again; an interrupted one goes on; a
    waiting one still waits (on the new graph). When the history does not
    reproduce, the divergence is shown and nothing is written.

    Runs: RUN ids, or every run with --status (and --agent NAME). Exit 0 when every
    run was upgraded (one run: its outcome's exit code, as for `run`), 1 when any
    was refused, 2 for bad input.
    """
    from graphrun.eventstore.errors import BrokenLogError
    from graphrun.runtime.agents import load_agent
    from graphrun.runtime.engine.driver import check_graph, whoami
    from graphrun.runtime.engine.runs import load_run
    from graphrun.runtime.errors import UsageError
    from graphrun.runtime.graph.config import agents_dir as resolve_agents
    from graphrun.runtime.graph.config import config_dir as resolve_config
    from graphrun.runtime.graph.config import resolve_agent
    from graphrun.runtime.replay.upgrade import check_upgrade, record_upgrade

    if not run_ids and not statuses:
        raise UsageError("name the runs to upgrade: RUN ids, or --status (and --agent NAME)")
    if from_seq is not None and len(run_ids) != 1:
        raise UsageError("--from-seq continues one run: give exactly one RUN")
    cfg = resolve_config(config_dir)
    agents = resolve_agents(agents_dir, config=cfg)
    loaded = load_agent(resolve_agent(graph_dir, agents), config_dir=cfg)
    found = check_graph(loaded, agents_dir=agents, config_dir=cfg)
    if any(d.severity == "error" for d in found):
        from graphrun.cli.render import print_diagnostics

        print_diagnostics(found)
        raise SystemExit(2)
    store = open_store(db)
    targets = [resolve_run(store, r) for r in run_ids]
    if statuses:
        targets += _select(store, statuses, agent_name, limit)
    targets = list(dict.fromkeys(targets))
    if not targets:
        click.echo("no runs to upgrade", err=True)
        return
    who = whoami(as_user)
    results: list[dict[str, Any]] = []
    refused = 0
    to_drive: list[str] = []
    # Each run is read and verified once; what upgrade appends extends it, and the
    # driver that continues it takes it from there.
    opened: dict[str, Any] = {}
    for run_id in targets:
        if from_seq is not None:
            run_id = _fork(store, run_id, from_seq, who, dry_run)
        try:
            run = load_run(store, run_id)
        except BrokenLogError as exc:
            if len(targets) == 1:
                raise
            # One damaged run never stops the others; it is refused, untouched.
            refused += 1
            results.append({"run_id": run_id, "result": "refused", "why": exc.message})
            if not as_json:
                click.echo(f"▸ run {run_id}: not upgraded: {exc.message}", err=True)
            continue
        check = check_upgrade(store, run_id, loaded, run=run)
        data = check.as_dict()
        if not check.ok:
            refused += 1
            data["result"] = "refused"
            if not as_json:
                click.echo(f"▸ run {run_id} ({check.status}): not upgraded: {check.why}", err=True)
        elif dry_run:
            data["result"] = "would upgrade"
            if not as_json:
                click.echo(
                    f"▸ run {run_id} ({check.status}): would move from graph "
                    f"{_v(check.old_hash)} to {_v(check.new_hash)}"
                    + (f", entering '{check.retry_node}' again" if check.retry_node else ""),
                    err=True,
                )
        else:
            opened[run_id] = run.extended([record_upgrade(store, check, loaded, by=who)])
            data["result"] = "upgraded"
            if not as_json:
                click.echo(
                    f"▸ run {run_id} ({check.status}): upgraded from graph "
                    f"{_v(check.old_hash)} to {_v(check.new_hash)} by {who}",
                    err=True,
                )
            if check.status in ("failed", "interrupted"):
                to_drive.append(run_id)
        results.append(data)
    if len(targets) == 1 and to_drive and not dry_run:
        # One run: continue it here, as `resume` would, and exit with its outcome.
        from graphrun.cli.run import finish

        outcome = _continue(store, opened[to_drive[0]], as_user, agents_dir, config_dir, as_json)
        finish(outcome, as_json=as_json, db=db)
    outcomes: dict[str, str] = {}
    for run_id in to_drive if not dry_run else []:
        outcome = _continue(store, opened[run_id], as_user, agents_dir, config_dir, True)
        outcomes[run_id] = outcome.status
        if not as_json:
            click.echo(f"▸ run {run_id} {outcome.status}", err=True)
    if as_json:
        for data in results:
            data["outcome"] = outcomes.get(str(data["run_id"]))
            click.echo(json.dumps(data, ensure_ascii=False))
    else:
        done = "would upgrade" if dry_run else "upgraded"
        click.echo(f"{done} {len(targets) - refused} of {len(targets)} run(s)", err=True)
    if refused:
        raise SystemExit(1)
    if len(targets) == 1 and not to_drive and not dry_run:
        _say_waiting(store, opened.get(targets[0]) or targets[0], db, as_json)


def _v(graph_hash: str) -> str:
    from graphrun.eventstore.projections import graph_version

    return graph_version(graph_hash)


def _select(store: Any, statuses: tuple[str, ...], agent: str | None, limit: int) -> list[str]:
    """Runs with one of ``statuses`` (of graph ``agent``), oldest first."""
    from graphrun.runtime.inspect import display_status

    rows = []
    for status in statuses:
        if status == "interrupted":
            rows += [
                r
                for r in store.runs(status="running", limit=limit)
                if display_status(store, r) == "interrupted"
            ]
        rows += store.runs(status=status, limit=limit)
    rows = [r for r in rows if agent is None or r.graph_name == agent]
    rows.sort(key=lambda r: r.started_at)
    return [r.run_id for r in rows][:limit]


def _fork(store: Any, run_id: str, at_seq: int, who: str, dry_run: bool) -> str:
    from graphrun.runtime.replay.fork import fork_run

    if dry_run:
        from graphrun.runtime.errors import UsageError

        raise UsageError("--from-seq with --dry-run: fork with `graphrun fork` to try it")
    new_id = fork_run(store, run_id, at_seq, by=who)
    click.echo(f"▸ forked run {run_id} at seq {at_seq} as run {new_id}", err=True)
    return new_id


def _continue(
    store: Any,
    run: Any,
    as_user: str | None,
    agents_dir: str | None,
    config_dir: str | None,
    quiet: bool,
) -> Any:
    from graphrun.cli.run import _check_continuation, _drive, _options
    from graphrun.runtime.engine.driver import Driver

    options = _options(
        answers=(),
        as_user=as_user,
        agents_dir=agents_dir,
        config_dir=config_dir,
        llm_replay=None,
        store=store,
        quiet=quiet,
        continuing=run,
    )
    _check_continuation(run, options, resuming=True)
    return _drive(Driver(store, run.run_id, options, resumed_by=as_user, loaded=run))


def _say_waiting(store: Any, run: Any, db: str | None, as_json: bool) -> None:
    """An upgraded waiting run (its id, or as it was opened and upgraded) still
    waits: say for what, and how to answer."""
    from graphrun.cli.render import render_waiting
    from graphrun.eventstore.fold import fold
    from graphrun.runtime.engine.driver import RunOutcome

    if isinstance(run, str):
        run_id, state = run, fold(store.read(run))
    else:
        run_id, state = run.run_id, run.state
    if state.status == "waiting" and not as_json:
        render_waiting(RunOutcome(run_id, "waiting", waiting=state.waiting), db)
