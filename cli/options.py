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
        metavar="FILE",
        envvar="GRAPHRUN_DB",
        help="Event database (default: $GRAPHRUN_DB, else the user data dir).",
    )(fn)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(fn)


def open_store(db: str | None, *, create: bool = False) -> Any:
    import os

    from graphrun.eventstore.store import SqliteStore
    from graphrun.runtime.config import db_path

    # GRAPHRUN_DURABILITY=full fsyncs every commit (default: WAL, synchronous=NORMAL).
    durability = os.environ.get("GRAPHRUN_DURABILITY", "normal").strip().lower() or "normal"
    return SqliteStore(db_path(db), create=create, durability=durability)


def resolve_run(store: Any, run_id: str) -> str:
    if store.has_run(run_id):
        return run_id
    return str(store.resolve_run_id(run_id))
