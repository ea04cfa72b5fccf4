"""The ``graphrun`` command: a lazy click group of thin commands.

Command modules are imported only when their command runs, so ``graphrun --help``
stays fast. Every :class:`GraphrunError` becomes one line on stderr and its
exit code here, in one place; nothing else reaches the user as a traceback.
"""

from __future__ import annotations

import errno
import importlib
import sys
from typing import Any

import click

from graphrun.eventstore.errors import GraphrunError

# command name -> (module, function, one-line help shown in `graphrun --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("run", "run_cmd", "Run a graph agent."),
    "resume": ("run", "resume_cmd", "Continue an interrupted or waiting run."),
    "approve": ("run", "approve_cmd", "Answer a waiting approval node and continue the run."),
    "answer": ("run", "answer_cmd", "Answer a waiting input node and continue the run."),
    "cancel": ("run", "cancel_cmd", "Cancel a run, also one another process drives."),
    "validate": ("replay", "validate_cmd", "Check a graph against every rule of the spec."),
    "replay": ("replay", "replay_cmd", "Re-drive a recorded run and check it decides the same."),
    "test": ("replay", "test_cmd", "Replay every recorded run in replays/ (or PATHs)."),
    "runs": ("inspect", "runs_cmd", "List runs."),
    "show": ("inspect", "show_cmd", "Show a run's state and path, at any point."),
    "events": ("inspect", "events_cmd", "Print a run's event log."),
    "audit": ("inspect", "audit_cmd", "Who decided what, and when; verify the hash chain."),
    "diff": ("inspect", "diff_cmd", "Where two runs part ways."),
    "fork": ("run", "fork_cmd", "Start a new run from a prefix of a recorded run."),
    "upgrade": ("upgrade", "upgrade_cmd", "Move runs in flight onto a fixed graph, checked."),
    "export": ("transfer", "export_cmd", "Write a run (and its child runs) to a JSON-lines file."),
    "import": ("transfer", "import_cmd", "Load runs from an exported JSON-lines file."),
    "schema": ("replay", "schema_cmd", "Print the JSON Schema of graph.yaml."),
    "rag": ("rag", "rag_group", "Knowledge bases of rag nodes (rebuild)."),
    "graph": ("report", "graph_cmd", "Draw a graph (Mermaid, DOT, SVG, HTML), or a run's path."),
    "report": ("report", "report_cmd", "Write a run's self-contained HTML report."),
    "logs": ("report", "logs_cmd", "A run's prompts and responses as Markdown; --usage totals."),
    "tail": ("report", "tail_cmd", "Watch a run another process drives."),
    "otel": ("report", "otel_cmd", "Export a run as OpenTelemetry spans (OTLP)."),
    "submit": ("worker", "submit_cmd", "Queue a run for workers (PostgreSQL); print its id."),
    "worker": ("worker", "worker_cmd", "Drive queued runs from a PostgreSQL database."),
    "migrate": ("worker", "migrate_cmd", "Copy runs between SQLite and PostgreSQL stores."),
    "serve": ("console.serve", "serve_cmd", "Serve the web console: runs, live runs, an inbox."),
}


# Commands that drive runs: the runtime is pinned to one CPU for them (actors.base).
class LazyGroup(click.Group):
    """Loads a command's module only when that command is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = COMMANDS.get(cmd_name)
        if spec is None:
            return None
        module = importlib.import_module(f"graphrun.cli.{spec[0]}")
        command: click.Command = getattr(module, spec[1])
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_m, _f, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option("0.1.0", prog_name="graphrun")
def cli() -> None:
    """graphrun: run declarative YAML graph agents on an event-sourced runtime.

    Every run is recorded, event by event, in an SQLite log (or PostgreSQL, for
    workers on many machines): replay it, resume it after a crash, test a changed
    graph against it, and audit who decided what.

    Exit codes: 0 completed, 1 run failed (or replay diverged), 2 invalid graph or
    bad input, 3 the run waits for a person, 4 completed with unhandled failures,
    130/143 interrupted (Ctrl-C/SIGTERM).
    """


def _check_arguments(args: list[str]) -> None:
    """Every argument must be text: invalid UTF-8 (which Python keeps as lone
    surrogates) would otherwise fail deep inside, wherever it is first encoded."""
    for position, arg in enumerate(args, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            try:  # the bytes as given (Python keeps invalid ones as surrogates)
                shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            except UnicodeEncodeError:
                shown = arg.encode("utf-8", "backslashreplace").decode("utf-8")
            shown = shown if len(shown) <= 60 else shown[:60] + "…"
            raise _usage_error(
                f"argument {position} ({shown}) is not valid UTF-8 (at character {exc.start})"
            ) from None
        if "\x00" in arg:
            raise _usage_error(f"argument {position} holds a NUL character")


def _usage_error(message: str) -> GraphrunError:
    # Imported only when needed: importing graphrun.runtime registers every node
    # kind, which `graphrun --help` has no use for.
    from graphrun.runtime.errors import UsageError

    return UsageError(message)


def main(argv: list[str] | None = None) -> Any:
    """Console entry point."""
    try:
        _check_arguments(sys.argv[1:] if argv is None else argv)
        return cli.main(args=argv, prog_name="graphrun", standalone_mode=False)
    except GraphrunError as exc:
        from graphrun.actors.terminal import terminal_safe

        click.echo(terminal_safe(f"error: {exc}"), err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if exc.exit_code == 1 else exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:  # a bug in graphrun: one line, the traceback on request
        import os

        if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:
            # A path built from an argument, a graph field or a template: bad input.
            name = os.fsdecode(exc.filename or "")
            shown = name if len(name) <= 60 else name[:60] + "…"
            click.echo(f"error: path too long: {shown} ({len(name)} characters)", err=True)
            sys.exit(2)
        if isinstance(exc, UnicodeEncodeError) and "surrogate" in str(exc):
            # Arguments were checked to be text above, so a lone surrogate here came
            # from a JSON escape (``"\ud800"``) in some input: bad input, not a bug.
            bad = exc.object[exc.start : exc.end].encode("utf-8", "surrogatepass").hex()
            click.echo(
                f"error: a value holds a lone surrogate (0x{bad}, half of a JSON \\u "
                "escape pair), which is not text",
                err=True,
            )
            sys.exit(2)

        if os.environ.get("GRAPHRUN_DEBUG"):
            raise
        click.echo(
            f"error: internal error: {type(exc).__name__}: {exc} "
            "(set GRAPHRUN_DEBUG=1 for the traceback, and please report it)",
            err=True,
        )
        sys.exit(70)


__all__ = ["cli", "main"]
