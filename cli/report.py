"""``graph``, ``report``, ``logs``, ``tail``, ``otel``: seeing graphs and runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from graphrun.cli.options import db_option, json_option, open_store, resolve_run
from graphrun.cli.render import exit_code


def _output_path(output: str) -> Path:
    """``-o``'s file, whose folder must exist (checked before any work is done)."""
    from graphrun.runtime.errors import UsageError

    path = Path(output)
    if not path.parent.is_dir():
        raise UsageError(f"-o {output}: folder {path.parent} does not exist")
    return path


def _write(text: str, output: str | None) -> None:
    if output is None:
        click.echo(text, nl=False)
        return
    path = _output_path(output)
    path.write_text(text, encoding="utf-8")
    click.echo(f"wrote {path}", err=True)


@click.command("graph")
@click.argument("agent")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["mermaid", "dot", "svg", "html"]),
    default="mermaid",
    show_default=True,
    help="mermaid and dot are text; svg and html are laid out by Graphviz.",
)
@click.option("--run", "run_id", metavar="RUN", help="Highlight the path RUN took, with visits.")
@click.option("-o", "--output", metavar="FILE", help="Write to FILE instead of stdout.")
@click.option("--agents-dir", metavar="DIR", help="Directory of named agents.")
@click.option("--config-dir", metavar="DIR", help="Config directory.")
@db_option
def graph_cmd(
    agent: str,
    fmt: str,
    run_id: str | None,
    output: str | None,
    agents_dir: str | None,
    config_dir: str | None,
    db: str | None,
) -> None:
    """Draw AGENT's graph: node types as shapes, routes as labelled edges.

    AGENT is a directory with graph.yaml, a graph.yaml file or an agent name.
    With --run, the path of RUN (a run of this graph) is highlighted and every
    node shows how often it was visited.
    """
    from graphrun.runtime.agents import load_agent
    from graphrun.runtime.graph.config import agents_dir as resolve_agents
    from graphrun.runtime.graph.config import config_dir as resolve_config
    from graphrun.runtime.graph.config import resolve_agent
    from graphrun.runtime.observe.graphpic import build_picture, render, run_path

    cfg = resolve_config(config_dir)
    loaded = load_agent(
        resolve_agent(agent, resolve_agents(agents_dir, config=cfg)), config_dir=cfg
    )
    path = None
    if run_id is not None:
        store = open_store(db)
        run_id = resolve_run(store, run_id)
        path = run_path(store.read(run_id))
    pic = build_picture(loaded.graph, loaded.agent_dir, path)
    pic.run_id = run_id
    _write(render(pic, fmt), output)


@click.command("report")
@click.argument("run_id")
@click.option("-o", "--output", metavar="FILE", help="Write to FILE (default: report-RUN.html).")
@click.option(
    "--divergence",
    "divergence_of",
    metavar="PATH",
    help="Also show where RUN diverges when replayed against the graph at PATH.",
)
@click.option(
    "--watch",
    type=float,
    metavar="SECONDS",
    help="Rewrite the file every SECONDS until the run ends (or waits for an answer, or no "
    "process drives it); the page reloads itself. Then exit as `tail` does.",
)
@click.option("--config-dir", metavar="DIR", help="Config directory (model prices).")
@db_option
def report_cmd(
    run_id: str,
    output: str | None,
    divergence_of: str | None,
    watch: float | None,
    config_dir: str | None,
    db: str | None,
) -> None:
    """Write RUN_ID's report: one self-contained HTML file (no network needed to view it).

    A timeline with one lane per branch and child run, per-node latency and
    tokens, the state before and after each node, every LLM request and
    response, human decisions, and (with --divergence) a failed replay's
    divergences. A run in progress can be reported again to refresh, or kept
    fresh with --watch.

    Exit code 0 once the report is written. With --watch, as for `tail`: 0
    completed, 1 failed or cancelled, 3 waiting, 4 completed with unhandled
    failures; 1 too when no process drives the run any more.
    """
    from graphrun.runtime.engine.usage import load_prices
    from graphrun.runtime.graph.config import config_dir as resolve_config
    from graphrun.runtime.observe.report import write_report

    store = open_store(db)
    run_id = resolve_run(store, run_id)
    if watch is not None and watch <= 0:
        from graphrun.runtime.errors import UsageError

        raise UsageError(f"--watch {watch:g}: the interval must be more than 0 seconds")
    path = _output_path(output or f"report-{run_id}.html")
    divergences = None
    if divergence_of is not None:
        from graphrun.runtime.observe.report import replay_divergences

        divergences = replay_divergences(store, run_id, divergence_of)
    prices = load_prices(resolve_config(config_dir))
    from graphrun.eventstore.fold import TERMINAL
    from graphrun.runtime.observe.follow import Liveness

    liveness = Liveness(store, run_id)
    seen = -1
    while True:
        shown = write_report(
            store, run_id, path, prices=prices, divergences=divergences, reload_every=watch
        )
        click.echo(f"wrote {path}", err=True)
        if watch is None:
            return
        # A watch ends as `tail` does, and says as it exits how the run stands: a
        # script waiting on it never reads a failed run as a success.
        if shown in TERMINAL:
            raise SystemExit(exit_code(shown))
        # A run no process drives is not watched for ever.
        if shown == "waiting" and not liveness.live():
            click.echo(f"run {run_id} waits for an answer: stopped watching", err=True)
            raise SystemExit(exit_code("waiting"))
        last, seen = seen, store.run(run_id).last_seq
        if liveness.orphaned(seen != last):
            click.echo(
                f"run {run_id} is interrupted (no process drives it): stopped watching; "
                f"`graphrun resume {run_id}` continues it",
                err=True,
            )
            raise SystemExit(exit_code("interrupted"))
        import time

        time.sleep(watch)


@click.command("logs")
@click.argument("run_id")
@click.option("--usage", "usage_only", is_flag=True, help="Only the token and cost totals.")
@click.option("--config-dir", metavar="DIR", help="Config directory (model prices).")
@json_option
@db_option
def logs_cmd(
    run_id: str, usage_only: bool, config_dir: str | None, as_json: bool, db: str | None
) -> None:
    """RUN_ID's prompts and responses (and its child runs'), as Markdown.

    On a terminal the Markdown is rendered; piped, it is printed as is.
    """
    import json

    from graphrun.runtime.engine.usage import load_prices
    from graphrun.runtime.graph.config import config_dir as resolve_config
    from graphrun.runtime.observe.logs import llm_log, log_markdown

    store = open_store(db)
    run_id = resolve_run(store, run_id)
    prices = load_prices(resolve_config(config_dir))
    entries, usage = llm_log(store, run_id, prices)
    if as_json:
        payload: dict[str, Any] = {"run_id": run_id, "usage": usage.as_dict()}
        if not usage_only:
            payload["calls"] = entries
        click.echo(json.dumps(payload, ensure_ascii=False, default=str))
        return
    text = log_markdown(run_id, entries, usage, usage_only=usage_only)
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.markdown import Markdown

        from graphrun.actors.terminal import terminal_safe

        # Prompts and replies on a terminal: shown, not obeyed (piped, they are data).
        Console().print(Markdown(terminal_safe(text)))
    else:
        click.echo(text)


@click.command("tail")
@click.argument("run_id")
@click.option(
    "--interval", default=0.5, show_default=True, help="Seconds between looks at the log."
)
@db_option
def tail_cmd(run_id: str, interval: float, db: str | None) -> None:
    """Watch RUN_ID as another process drives it: its narration, until it ends or waits.

    Exit codes as for `run`: 0 completed, 1 failed or cancelled, 3 waiting,
    4 completed with unhandled failures; 1 too when no process drives the run any
    more (none has held it for three looks and two seconds: `graphrun resume`
    continues it).
    """
    from graphrun.runtime.observe.follow import follow

    store = open_store(db)
    run_id = resolve_run(store, run_id)
    status = follow(store, run_id, interval=interval)
    raise SystemExit(exit_code(status))


@click.command("otel")
@click.argument("run_id")
@click.option(
    "--endpoint",
    metavar="URL",
    help="OTLP/HTTP traces endpoint (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "
    "else $OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces).",
)
@click.option("--console", is_flag=True, help="Print the spans as JSON lines instead of sending.")
@db_option
def otel_cmd(run_id: str, endpoint: str | None, console: bool, db: str | None) -> None:
    """Export RUN_ID (and its child runs) as OpenTelemetry spans (GenAI conventions).

    One trace per run tree: a span for the run, each node visit and each LLM or
    tool call; child runs are spans under their agent node. Needs the `otel`
    extra (pip install -e '<checkout>[otel]'; make demo installs it).
    """
    from graphrun.runtime.observe.otel import export_run

    store = open_store(db)
    run_id = resolve_run(store, run_id)
    count = export_run(store, run_id, endpoint=endpoint, console=console)
    click.echo(f"exported {count} spans of run {run_id}", err=True)
