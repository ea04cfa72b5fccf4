"""The ``graphrun replay`` command's logic (kept out of the click module)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.replay.divergence import ReplayResult, replay_events
from graphrun.runtime.replay.transfer import run_tree


def report(result: ReplayResult, label: str) -> str:
    """One line for a run that replays; the divergence report for one that does not."""
    if result.ok:
        final = result.final.status if result.final else "?"
        note = f" ({'; '.join(result.notes)})" if result.notes else ""
        return (
            f"ok: {label}: {result.events} events, {result.decisions} decisions and "
            f"{result.effects} recorded effects reproduced; run {final}{note}"
        )
    assert result.divergence is not None
    return f"DIVERGED: {label}: {result.describe()}"


def result_dict(run_id: str, result: ReplayResult) -> dict[str, Any]:
    """A replay result as JSON-ready data."""
    return {
        "run_id": run_id,
        "ok": result.ok,
        "events": result.events,
        "decisions": result.decisions,
        "effects": result.effects,
        "status": result.final.status if result.final else None,
        "notes": result.notes,
        "divergence": result.divergence.as_dict() if result.divergence else None,
        "divergences": [d.as_dict() for d in result.divergences],
    }


def replay_command(
    store: SqliteStore,
    run_id: str,
    *,
    graph_path: str | None,
    live: bool,
    as_json: bool,
    db: str | None = None,
    preflight: bool = True,
    rerun_retrieval: bool = False,
) -> int:
    """Replay ``run_id`` and its child runs; 0 when all match, 1 on a divergence.

    With ``graph_path`` the top-level run is checked against that graph (and its
    current script files); with ``live`` as well, a diverging run is re-run on the
    new graph, reusing the recorded effects whose requests did not change.
    """
    if live and not graph_path:
        from graphrun.runtime.errors import UsageError

        raise UsageError(
            "--live and --update need --graph (replaying a run's own graph never needs effects)"
        )
    loaded = None
    if graph_path:
        from graphrun.runtime.agents import load_agent
        from graphrun.runtime.graph.config import config_dir

        loaded = load_agent(Path(graph_path), config_dir=config_dir())
    results = []
    for rid in run_tree(store, run_id):
        # A log that was tampered with is not replayed: its decisions prove nothing.
        # Each recorded LLM call is served whole, never looked into: its wire bodies
        # stay undecoded (a big map's replay holds strings, not their dicts and lists).
        events, problem = store.read_verified(rid, light=True)
        if problem is not None:
            from graphrun.runtime.replay.divergence import Divergence

            broken = ReplayResult(rid, store.run(rid).last_seq)
            broken.divergence = Divergence(
                problem.seq,
                None,
                "integrity",
                f"the stored log does not verify: {problem.reason} (graphrun audit {rid} --verify)",
            )
            results.append((rid, broken))
            continue
        # Child runs are checked against their own recorded graphs.
        result = replay_events(
            events,
            loaded if rid == run_id else None,
            check_files=bool(graph_path),
            rerun_retrieval=rerun_retrieval,
        )
        results.append((rid, result))
    diverged = [(rid, r) for rid, r in results if not r.ok]
    live_data = None
    if live and diverged:
        from graphrun.runtime.replay.regression import rerun_live

        assert loaded is not None
        outcome = rerun_live(store, run_id, loaded, preflight=preflight)
        live_data = outcome.__dict__
        if not as_json:
            click.echo(
                f"▸ re-ran {run_id} on {graph_path} live as run {outcome.run_id}: "
                f"{outcome.status}; reused {len(outcome.reused)} recorded effect(s), "
                f"performed {len(outcome.performed)}"
                + (f" ({', '.join(outcome.performed)})" if outcome.performed else ""),
                err=True,
            )
            if outcome.output is not None:
                click.echo(outcome.output)
    if as_json:
        data: dict[str, Any] = {"runs": [result_dict(rid, r) for rid, r in results]}
        if live_data is not None:
            data["live"] = live_data
        click.echo(json.dumps(data, ensure_ascii=False, default=str))
    else:
        for rid, r in results:
            click.echo(report(r, f"run {rid}"), file=sys.stderr if r.ok else sys.stdout)
        final = results[0][1].final if results and not diverged else None
        # As for run: the result of a run that completed goes to stdout.
        if (
            live_data is None
            and final is not None
            and final.status
            in (
                "completed",
                "completed_with_errors",
            )
        ):
            text = final.output or ""
            click.echo(text, nl=not text.endswith("\n"))
    return 1 if diverged else 0


__all__ = ["replay_command", "report", "result_dict"]
