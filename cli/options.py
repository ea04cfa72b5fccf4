"""Options shared by several commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

F = Callable[..., Any]


def db_option(fn: F) -> F:
    return click.option(
        "--db",
        "db",
        metavar="FILE|URL",
        envvar="GRAPHRUN_DB",
        help="Event database: an SQLite file or a postgresql:// URL "
        "(default: $GRAPHRUN_DB, else the user data dir).",
    )(fn)


def set_option(fn: F) -> F:
    """``--set KEY=VALUE`` (repeatable), for the commands that start a run."""
    return click.option(
        "--set",
        "sets",
        multiple=True,
        metavar="KEY=VALUE",
        help="Seed a state key (JSON value, else string); wins over initial_state.",
    )(fn)


def var_option(fn: F) -> F:
    """``--var NAME=VALUE`` (repeatable), for the commands that start a run."""
    return click.option(
        "--var",
        "var_flags",
        multiple=True,
        metavar="NAME=VALUE",
        help="Give an agent variable a value (repeatable); wins over $<AGENT>_VARIABLES "
        "and defaults. Scripts and tools see it as LLM_AGENT_VAR_<NAME>.",
    )(fn)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(fn)


def open_store(db: str | None, *, create: bool = False) -> Any:
    import os

    from graphrun.eventstore import open_store as open_by_name
    from graphrun.runtime.graph.config import db_path

    # GRAPHRUN_DURABILITY=full fsyncs every commit (default: WAL, synchronous=NORMAL).
    durability = os.environ.get("GRAPHRUN_DURABILITY", "normal").strip().lower() or "normal"
    url = db_url(db)
    if url is not None:
        return open_by_name(url, create=create, durability=durability)
    return open_by_name(db_path(db), create=create, durability=durability)


def db_url(db: str | None) -> str | None:
    """The PostgreSQL URL ``--db`` / ``$GRAPHRUN_DB`` gives, if it gives one."""
    import os

    value = db or os.environ.get("GRAPHRUN_DB") or ""
    return value if value.startswith(("postgresql://", "postgres://")) else None


def store_missing(db: str | None) -> bool:
    """Whether there is no event store yet (an SQLite file not made yet; a
    PostgreSQL database is made on first use)."""
    from graphrun.runtime.graph.config import db_path

    return db_url(db) is None and not db_path(db).exists()


LATEST = "@last"
"""Names the run started last (child runs aside) wherever a RUN_ID is taken."""


def resolve_run(store: Any, run_id: str) -> str:
    """A full run id from RUN_ID: an id, a unique prefix of one, or ``@last``."""
    if run_id.strip().lower() == LATEST:
        return latest_run(store)
    if store.has_run(run_id):
        return run_id
    return str(store.resolve_run_id(run_id))


def latest_run(store: Any) -> str:
    """The run created last in ``store`` that is not a child run (ids sort by time of
    creation, so a fork is newer than its source; an imported run keeps its id)."""
    from graphrun.eventstore.errors import UnknownRunError

    conn = getattr(store, "conn", None)
    if conn is not None:  # SQLite: ask the runs table
        row = conn.execute(
            "SELECT run_id FROM runs WHERE parent_run_id IS NULL ORDER BY run_id DESC LIMIT 1"
        ).fetchone()
    else:  # any other store: through the Store protocol
        ids = [r.run_id for r in store.runs(limit=100_000) if r.parent_run_id is None]
        row = (max(ids),) if ids else None
    if row is None:
        raise UnknownRunError(
            f"{LATEST}: there is no run in {store.path}", hint="start one with graphrun run"
        )
    return str(row[0])
