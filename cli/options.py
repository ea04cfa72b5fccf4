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


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(fn)


def open_store(db: str | None, *, create: bool = False) -> Any:
    import os

    from graphrun.eventstore import open_store as open_by_name
    from graphrun.runtime.config import db_path

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
    from graphrun.runtime.config import db_path

    return db_url(db) is None and not db_path(db).exists()


def resolve_run(store: Any, run_id: str) -> str:
    if store.has_run(run_id):
        return run_id
    return str(store.resolve_run_id(run_id))
