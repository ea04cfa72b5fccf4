"""Run the graphrun CLI with counters around the log reads and folds.

``python count_reads.py OUT.json ARGS...`` runs ``graphrun ARGS...`` in this process
and writes how often it read a run's log (``read``, ``read_verified``, ``raw_rows``
of the SQLite store), folded one (``fold``) and swept the host for what a killed
graphrun left running (``end_orphans``) to OUT.json, whatever the exit code.
"""

from __future__ import annotations

import atexit
import collections
import json
import sys
from collections.abc import Callable
from typing import Any

from graphrun.actors import process
from graphrun.eventstore import fold as fold_module
from graphrun.eventstore.store import SqliteStore

calls: collections.Counter[str] = collections.Counter()


def counted(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return real(*args, **kwargs)

    return wrapper


def main() -> None:
    out, args = sys.argv[1], sys.argv[2:]
    for name in ("read", "read_verified", "raw_rows", "append"):
        setattr(SqliteStore, name, counted(name, getattr(SqliteStore, name)))
    process.end_orphans = counted("end_orphans", process.end_orphans)  # type: ignore[assignment]
    real_fold = fold_module.fold
    fold_module.fold = counted("fold", real_fold)
    # Modules that imported ``fold`` by name before it was wrapped.
    for module in list(sys.modules.values()):
        if getattr(module, "fold", None) is real_fold:
            module.fold = fold_module.fold  # type: ignore[attr-defined]

    def write() -> None:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(dict(calls), f)

    atexit.register(write)
    from graphrun.cli import main as cli

    cli(args)


if __name__ == "__main__":
    main()
