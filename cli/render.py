"""Rendering: the result on stdout, diagnostics and narration on stderr, --json."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import click

from graphrun.actors.terminal import terminal_safe


def print_diagnostics(diagnostics: Iterable[Any]) -> None:
    for d in diagnostics:
        click.echo(terminal_safe(f"{d.severity}: {d.format()}"), err=True)


def answer_command(outcome: Any, db: str | None) -> str:
    """The command that answers the node ``outcome`` waits at.

    What only the person can supply (their answer, their name) is left as a
    ``<placeholder>``, which a shell refuses if the line is run unedited.
    """
    waiting = outcome.waiting
    db_part = f" --db {shlex.quote(db)}" if db else ""
    # The request is stamped with the run that waits: a child run, when the
    # run waits on one of its agent nodes.
    run = shlex.quote(getattr(waiting, "run_id", "") or outcome.run_id)
    who = "|".join(waiting.approvers) or "you"
    # A graph that requires signed answers takes the answerer's key, not a name.
    as_who = "--sign <key>" if getattr(waiting, "signed", False) else f"--as <{who}>"
    if waiting.kind == "approval":
        choices = "|".join(waiting.options) or "choice"
        return f"graphrun approve {run} <{choices}> {as_who}{db_part}"
    return f"graphrun answer {run} <text> {as_who}{db_part}"


#: Exit codes of a run's final status (`run`, `resume`, `approve`, `tail`, …).
EXIT_CODES = {"completed": 0, "failed": 1, "cancelled": 1, "waiting": 3, "completed_with_errors": 4}


def exit_code(status: str) -> int:
    """The exit code of a run that stopped with ``status`` (1 for anything unknown)."""
    return EXIT_CODES.get(status, 1)


def render_unhandled(run_id: str, unhandled: Any, output: str) -> None:
    """Say on stderr which failures no fallback handled, and whether the output just
    printed is a failure's text rather than a result."""
    from graphrun.eventstore.projections import unhandled_summary

    click.echo(
        terminal_safe(
            f"▸ run {run_id} completed with errors: {unhandled_summary(unhandled)} "
            "(no fallback took them; they routed on to `next`)"
        ),
        err=True,
    )
    texts = [str(f.get("error") or "") for f in unhandled]
    if any(t and t in output for t in texts):
        click.echo("▸ the output above contains a failure's text: it is not a result", err=True)


def render_left_out(run_id: str, left_out: Any) -> None:
    """Say on stderr which branches failed and were left out by a join that held
    without them (the run completed: the graph's join allows it)."""
    for f in left_out:
        where = f"branch '{f.get('branch')}'"
        if f.get("node") != f.get("branch"):
            where += f" (node '{f.get('node')}')"
        error = f.get("error") or "its error was not recorded"
        click.echo(
            terminal_safe(
                f"▸ run {run_id}: {where} failed and the join of super-step {f.get('step')} "
                f"went on without it: {error}"
            ),
            err=True,
        )


def outcome_dict(outcome: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "run_id": outcome.run_id,
        "status": outcome.status,
        "output": outcome.output,
        "error": outcome.error,
    }
    unhandled = list(getattr(outcome, "unhandled", ()) or ())
    if unhandled:
        data["unhandled_failures"] = unhandled
    left_out = list(getattr(outcome, "left_out", ()) or ())
    if left_out:
        data["left_out_branches"] = left_out
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


def _refusal(outcome: Any) -> Any:
    """Why an answer offered to a now-waiting run was not taken (see human_actor)."""
    if outcome.status != "waiting":
        return None
    return getattr(outcome, "refused", None)


def render_outcome(outcome: Any, *, as_json: bool, db: str | None) -> int:
    """Print a run's outcome; return the exit code.

    A run left waiting because the answer offered to it was refused (not an
    approver) or abandoned (Ctrl-C at the prompt) exits with that error's code.
    """
    code = exit_code(outcome.status)
    if outcome.status == "interrupted":
        code = 143 if getattr(outcome, "signal", None) == "SIGTERM" else 130
    refused = _refusal(outcome)
    if refused is not None:
        code = refused.exit_code
    if as_json:
        data = outcome_dict(outcome)
        if outcome.status == "waiting" and outcome.waiting is not None:
            data["answer_with"] = answer_command(outcome, db)
            if refused is not None:
                data["error"] = str(refused)
        click.echo(json.dumps(data, ensure_ascii=False))
        return code
    if outcome.status in ("completed", "completed_with_errors"):
        text = outcome.output or ""
        write_stdout(text if text.endswith("\n") else text + "\n")
        if outcome.status == "completed_with_errors":
            render_unhandled(outcome.run_id, getattr(outcome, "unhandled", ()), text)
        render_left_out(outcome.run_id, getattr(outcome, "left_out", ()))
    elif outcome.status == "interrupted":
        click.echo(
            terminal_safe(
                f"▸ run {outcome.run_id} {outcome.error or 'interrupted'}; "
                f"`graphrun resume {outcome.run_id}` continues it"
            ),
            err=True,
        )
    elif outcome.status == "waiting":
        if refused is not None:
            click.echo(terminal_safe(f"error: {refused}"), err=True)
        render_waiting(outcome, db)
    else:
        click.echo(
            terminal_safe(f"error: run {outcome.run_id} {outcome.status}: {outcome.error}"),
            err=True,
        )
    return code


def write_stdout(text: str) -> None:
    """Write to stdout; a reader that went away (``| head``) is not an error: the
    run is recorded whatever happens to its printout."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        import os

        # Python flushes stdout again at exit; point it at /dev/null so that
        # flush cannot fail too (the recipe of Python's signal documentation).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def render_waiting(outcome: Any, db: str | None) -> None:
    """Say on stderr where the run waits, for whom, and the command that answers it."""
    w = outcome.waiting
    if w is None:
        click.echo(f"▸ run {outcome.run_id} waits for an answer (`graphrun runs`)", err=True)
        return
    where = f"{w.kind} node '{w.node_id}'"
    if getattr(w, "run_id", "") and w.run_id != outcome.run_id:
        where += f" of child run {w.run_id}"
    # What the person is asked comes from the graph, a model or a script: shown, not
    # acted on by the terminal.
    lines = [f"▸ run {outcome.run_id} waits at {where}:"]
    lines += [f"  {line}" for line in w.question.strip().splitlines() or [""]]
    if w.kind == "approval":
        options = ", ".join(f"{i}. {option}" for i, option in enumerate(w.options, 1))
        lines.append(f"  options: {options} (a free-form answer: --other TEXT)")
    if w.default is not None:
        lines.append(f"  default (an empty answer): {w.default}")
    if w.approvers:
        lines.append(f"  approvers: {', '.join(w.approvers)}")
    lines.append(f"  answer with: {answer_command(outcome, db)}")
    for line in lines:
        click.echo(terminal_safe(line), err=True)


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain fixed-width table (no colour, stable for tests)."""
    cells = [
        [terminal_safe("" if c is None else str(c)).replace("\n", " ") for c in row] for row in rows
    ]
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
