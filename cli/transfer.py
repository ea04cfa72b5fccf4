"""``export`` and ``import``: runs as versioned JSON-lines files."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from graphrun.cli.options import db_option, open_store, resolve_run


@click.command("export")
@click.argument("run_id")
@click.option("-o", "--output", metavar="FILE", help="Write here instead of stdout.")
@click.option(
    "--with-origin",
    is_flag=True,
    help="Keep host names, OS accounts, process ids and absolute paths in the events.",
)
@db_option
def export_cmd(run_id: str, output: str | None, with_origin: bool, db: str | None) -> None:
    """Write RUN_ID and its child runs to a JSON-lines file (format: graphrun-export v2,
    ending with a trailer of each run's event count and head hash).

    Paths in the events are made relative to the file's folder (to the working
    directory when writing to stdout); host names, OS accounts, process ids and
    configuration directories outside the folder the file and the agent share (a
    config dir in your home) are left out unless --with-origin. Names given with
    --as are kept. A run with signed decisions or signed heads is always written
    exactly as stored: its signatures are bound to its log's hashes.
    """
    from graphrun.runtime.replay.transfer import has_signatures, run_tree, write_export

    store = open_store(db)
    run_id = resolve_run(store, run_id)
    if not with_origin and has_signatures(store, run_tree(store, run_id)):
        click.echo(
            f"▸ run {run_id} holds signatures: exported exactly as stored (with hosts and "
            "OS accounts), as its signatures are bound to its log",
            err=True,
        )
    if output:
        from graphrun.runtime.errors import UsageError

        target = Path(output)
        if target.is_dir():
            raise UsageError(f"-o {output}: is a directory", hint="give a file name")
        try:
            # A missing folder is created, like the file itself.
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(
                f"-o {output}: cannot create {target.parent}: {exc.strerror}"
            ) from None
        try:
            fh = open(output, "w", encoding="utf-8")  # noqa: SIM115 (closed below)
        except OSError as exc:
            raise UsageError(f"-o {output}: cannot write: {exc.strerror}") from None
        with fh:
            count = write_export(
                store, run_id, fh, relative_to=Path(output).parent, with_origin=with_origin
            )
        click.echo(f"▸ exported {count} events of run {run_id} to {output}", err=True)
    else:
        write_export(store, run_id, sys.stdout, with_origin=with_origin)


@click.command("import")
@click.argument("file")
@click.option(
    "--agent-dir",
    "agent_dirs",
    multiple=True,
    metavar="DIR",
    help="Trust DIR as the agent directory of runs that have not ended (repeatable).",
)
@db_option
def import_cmd(file: str, agent_dirs: tuple[str, ...], db: str | None) -> None:
    """Load the runs in FILE (made by `graphrun export`), verifying every hash.

    The file is untrusted: it is checked whole before anything is written. A run
    that has not ended is imported only if its agent directory is named with
    --agent-dir, since resuming it runs that folder's scripts. Paths the file
    holds relative to its folder are stored resolved against that folder.
    """
    from graphrun.runtime.replay.transfer import import_runs

    store = open_store(db, create=True)
    trusted = [Path(d) for d in agent_dirs]
    for run_id, status in import_runs(store, Path(file), trusted_dirs=trusted, against_disk=True):
        click.echo(f"{status}: {run_id}")
