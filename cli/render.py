"""Rendering: the result on stdout, diagnostics and narration on stderr, --json."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import click


def print_diagnostics(diagnostics: Iterable[Any]) -> None:
    for d in diagnostics:
        click.echo(f"{d.severity}: {d.format()}", err=True)


def answer_command(outcome: Any, db: str | None) -> str:
    waiting = outcome.waiting
    run_id = waiting.run_id or outcome.run_id
    db_part = f" --db {shlex.quote(db)}" if db else ""
    if waiting.kind == "approval":
        choices = "|".join(waiting.options) or "CHOICE"
        return f"graphrun approve {run_id} <{choices}> --as <you>{db_part}"
    return f"graphrun answer {run_id} <text> --as <you>{db_part}"


def outcome_dict(outcome: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "run_id": outcome.run_id,
        "status": outcome.status,
        "output": outcome.output,
        "error": outcome.error,
    }
    if outcome.waiting is not None:
        w = outcome.waiting
        data["waiting"] = {
            "node_id": w.node_id,
            "kind": w.kind,
            "question": w.question,
            "options": list(w.options),
            "default": w.default,
            "approvers": list(w.approvers),
        }
    return data


def render_outcome(outcome: Any, *, as_json: bool, db: str | None) -> int:
    """Print a run's outcome; return the exit code."""
    codes = {"completed": 0, "failed": 1, "cancelled": 1, "waiting": 3}
    code = codes.get(outcome.status, 1)
    if as_json:
        data = outcome_dict(outcome)
        if outcome.status == "waiting":
            data["answer_with"] = answer_command(outcome, db)
        click.echo(json.dumps(data, ensure_ascii=False))
        return code
    if outcome.status == "completed":
        text = outcome.output or ""
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
    elif outcome.status == "waiting":
        w = outcome.waiting
        click.echo(f"▸ run {outcome.run_id} waits at {w.kind} node '{w.node_id}':", err=True)
        click.echo(f"  {w.question.strip()}", err=True)
        if w.options:
            click.echo(f"  options: {', '.join(w.options)} (or any other text)", err=True)
        click.echo(f"  answer with: {answer_command(outcome, db)}", err=True)
    else:
        click.echo(f"error: run {outcome.run_id} {outcome.status}: {outcome.error}", err=True)
    return code


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain fixed-width table (no colour, stable for tests)."""
    cells = [[("" if c is None else str(c)).replace("\n", " ") for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = min(max(widths[i], len(c)), 60)

    def fmt(row: Sequence[str]) -> str:
        parts = []
        for i, c in enumerate(row):
            c = c if len(c) <= widths[i] else c[: widths[i] - 1] + "…"
            parts.append(c.ljust(widths[i]))
        return "  ".join(parts).rstrip()

    lines = [fmt(list(headers))]
    lines += [fmt(r) for r in cells]
    return "\n".join(lines)


def when(ts: float | None) -> str:
    if not ts:
        return ""
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
