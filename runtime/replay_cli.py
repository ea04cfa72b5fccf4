"""The ``graphrun replay`` command's logic (kept out of the click module)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.loader import load_graph
from graphrun.runtime.replay import ReplayResult, replay_events
from graphrun.runtime.transfer import run_tree


def report(result: ReplayResult, label: str) -> str:
    if result.ok:
        final = result.final.status if result.final else "?"
        note = f" ({'; '.join(result.notes)})" if result.notes else ""
        return (
            f"ok: {label}: {result.events} events, {result.decisions} decisions and "
            f"{result.effects} recorded effects reproduced; run {final}{note}"
        )
    assert result.divergence is not None
    return f"DIVERGED: {label}: {result.divergence.format()}"


def replay_command(
    store: SqliteStore,
    run_id: str,
    *,
    graph_path: str | None,
    live: bool,
    as_json: bool,
    db: str | None,
) -> int:
    if live and not graph_path:
        from graphrun.runtime.errors import UsageError

        raise UsageError("--live needs --graph (replaying a run's own graph never needs effects)")
    loaded = load_graph(graph_path) if graph_path else None
    results = []
    for rid in run_tree(store, run_id):
        events = store.read(rid)
        # Child runs are checked against their own recorded graphs.
        result = replay_events(
            events, loaded if rid == run_id else None, check_files=bool(graph_path)
        )
        results.append((rid, result))
    diverged = [(rid, r) for rid, r in results if not r.ok]
    if live and diverged:
        from graphrun.runtime.regression import rerun_live

        assert loaded is not None
        outcome = rerun_live(store, run_id, loaded)
        click.echo(
            f"▸ re-ran {run_id} against {graph_path} live as run {outcome.run_id}: "
            f"{outcome.status}",
            err=True,
        )
    if as_json:
        data = [
            {
                "run_id": rid,
                "ok": r.ok,
                "events": r.events,
                "decisions": r.decisions,
                "effects": r.effects,
                "divergence": None
                if r.ok
                else {
                    **{k: v for k, v in r.divergence.__dict__.items()},  # type: ignore[union-attr]
                    "diff": r.divergence.diff(),  # type: ignore[union-attr]
                },
            }
            for rid, r in results
        ]
        click.echo(json.dumps(data, ensure_ascii=False, default=str))
    else:
        for rid, r in results:
            click.echo(report(r, f"run {rid}"), file=sys.stderr if r.ok else sys.stdout)
    return 1 if diverged else 0


__all__ = ["Path", "replay_command", "report"]
