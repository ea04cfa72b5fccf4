"""graphrun.eventstore."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def open_store(url_or_path: str | Path, *, create: bool = True, durability: str = "normal") -> Any:
    """The event store ``url_or_path`` names: a ``postgresql://`` URL opens the
    PostgreSQL store, anything else is an SQLite file."""
    if isinstance(url_or_path, str) and url_or_path.startswith(("postgresql://", "postgres://")):
        from graphrun.eventstore.postgres import PostgresStore

        return PostgresStore(url_or_path, create=create, durability=durability)
    from graphrun.eventstore.store import SqliteStore

    return SqliteStore(url_or_path, create=create, durability=durability)
