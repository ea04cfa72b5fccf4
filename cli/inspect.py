"""``runs``, ``show``, ``events``, ``audit``, ``diff``: reading the log."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import click

from graphrun.actors.terminal import terminal_safe
from graphrun.cli.options import db_option, json_option, open_store, resolve_run
from graphrun.eventstore.errors import GraphrunError


@click.command("runs")
@click.option(
    "--status",
    type=click.Choice(
        [
            "running",
            "interrupted",
            "waiting",
            "queued",
            "completed",
            "completed_with_errors",
            "failed",
            "cancelled",
        ]
    ),
    help="Only runs with this status (interrupted: running, but no process drives it; "
    "queued: submitted, no worker has claimed it yet).",
)
@click.option(
    "--limit",
    default=50,
    show_default=True,
    type=click.IntRange(min=1),
    help="At most this many runs (one page).",
)
@click.option(
    "--offset",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Skip this many of the newest runs (the next page: --offset 50).",
)
@click.option("--usage", "with_usage", is_flag=True, help="Add token and cost columns.")
@click.option(
    "--strict",
    is_flag=True,
    help="Exit 2 when a run's stored data is damaged (default: list the others and "
    "name the damaged run on stderr).",
)
@json_option
@db_option
def runs_cmd(
    status: str | None,
    limit: int,
    offset: int,
    with_usage: bool,
    strict: bool,
    as_json: bool,
    db: str | None,
) -> None:
    """List runs, newest first, one page at a time (child runs indented under their
    parent; a fork by when it was made).

    A waiting run shows the node it waits at and for whom: the node's
    approvers, else anyone (WAITS FOR). VERSION: the graph the run runs on (the
    start of its hash; `graphrun upgrade` moves a run onto another). With --usage:
    each run's LLM tokens and cost, and TREE, the tokens of the run with all its
    child runs.

    A run whose stored data is damaged is left out and named in one warning line
    on stderr (`graphrun audit RUN --verify` says where), and so is a run whose
    log went back behind the head graphrun reported for it (committed events lost
    to a damaged -wal file); --strict makes either an error (exit 2).
    """
    from graphrun.cli.options import store_missing
    from graphrun.cli.render import table, when
    from graphrun.eventstore.errors import CorruptStoreError
    from graphrun.runtime.inspect import display_status, run_summary

    if store_missing(db):
        if as_json:
            return
        click.echo("no runs yet", err=True)
        return
    store = open_store(db)
    # A killed process leaves its lease row behind: release those of processes
    # that are gone for sure, so no run shows as held by one (a read-only file
    # keeps them; `runs` still says "interrupted").
    with contextlib.suppress(GraphrunError):
        store.release_stale_leases()
    damaged: list[CorruptStoreError] = []
    if status in ("interrupted", "queued"):
        # Stopped by Ctrl-C/SIGTERM (RunInterrupted recorded), or killed outright:
        # "running" in the log, with no process driving it; or submitted and not
        # claimed yet (queued).
        crashed = [
            r
            for r in store.runs(status="running", limit=offset + limit, damaged=damaged)
            if display_status(store, r) == status
        ]
        stopped = (
            store.runs(status=status, limit=offset + limit, damaged=damaged)
            if status == "interrupted"
            else []
        )
        rows = sorted([*stopped, *crashed], key=lambda r: r.started_at, reverse=True)
        rows = rows[offset : offset + limit]
    else:
        rows = store.runs(status=status, limit=limit, offset=offset, damaged=damaged)
    prices = None
    if with_usage or as_json:
        from graphrun.runtime.engine.usage import load_prices
        from graphrun.runtime.graph.config import config_dir

        prices = load_prices(config_dir(None))
    # Everything read from each run's events, read before anything is shown: a run
    # whose events do not decode is left out (and named), never the whole listing.
    made: dict[str, float] = {}
    waits: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    versions: dict[str, str] = {}
    readable = []
    for row in rows:
        try:
            made[row.run_id] = _made_at(store, row)
            if not as_json:
                versions[row.run_id] = _graph_version(store, row)
            if row.waiting_node:
                waits[row.run_id] = _waiting_request(store, row)
            if as_json:
                extra[row.run_id] = run_summary(store, row, prices)
            elif with_usage:
                extra[row.run_id] = _usage_cells(store, row, prices)
        except CorruptStoreError as exc:
            damaged.append(exc)
            continue
        readable.append(row)
    rows = readable
    _report_damaged(damaged, strict)
    for problem in store.lost_heads().values():  # runs whose log went backwards
        if strict:
            raise CorruptStoreError(problem)
        click.echo(f"warning: {problem}", err=True)
    # A fork copies its source's events, times included: list it by when it was made.
    rows.sort(key=lambda r: made[r.run_id], reverse=True)
    if as_json:
        for row in rows:
            click.echo(json.dumps(extra[row.run_id], ensure_ascii=False))
        return
    by_parent: dict[str | None, list[Any]] = {}
    ids = {r.run_id for r in rows}
    for row in rows:
        parent = row.parent_run_id if row.parent_run_id in ids else None
        by_parent.setdefault(parent, []).append(row)
    out: list[tuple[Any, ...]] = []

    def add(row: Any, depth: int) -> None:
        status_text = display_status(store, row)
        request = waits.get(row.run_id)
        waits_for = ""
        if request is not None:
            who = ", ".join(request.approvers) if request.approvers else "anyone"
            waits_for = f"{request.kind}: {who}"
        out.append(
            (
                "  " * depth + row.run_id,
                row.graph_name,
                versions[row.run_id],
                status_text,
                when(row.started_at),
                row.last_seq,
                row.waiting_node or row.current_node or "",
                waits_for,
                row.started_by or "",
            )
            + (extra[row.run_id] if with_usage else ())
        )
        for child in sorted(by_parent.get(row.run_id, []), key=lambda r: made[r.run_id]):
            add(child, depth + 1)

    for row in by_parent.get(None, []):
        add(row, 0)
    headers = [
        "RUN",
        "GRAPH",
        "VERSION",
        "STATUS",
        "STARTED (UTC)",
        "EVENTS",
        "NODE",
        "WAITS FOR",
        "BY",
    ]
    if with_usage:
        headers += ["TOKENS", "COST", "TREE TOKENS"]
    click.echo(table(out, headers))
    if len(rows) == limit:
        click.echo(f"(older runs: --offset {offset + limit})", err=True)


def _report_damaged(damaged: list[Any], strict: bool) -> None:
    """Name each damaged run on stderr (once), or with ``strict`` fail on the first."""
    seen: set[str | None] = set()
    for exc in damaged:
        if exc.run_id in seen:
            continue
        seen.add(exc.run_id)
        if strict:
            raise exc
        click.echo(f"warning: skipped a damaged run: {exc}", err=True)


def _made_at(store: Any, row: Any) -> float:
    """When a run was made: its start, or for a fork the first event it added itself."""
    first = store.read(row.run_id, upto=1)
    forked_at = getattr(first[0], "forked_at", None) if first else None
    if not forked_at:
        return float(row.started_at)
    own = store.read(row.run_id, after=forked_at, upto=forked_at + 1)
    return float(own[0].ts) if own else float(row.updated_at)


#: Runs up to this many events long are read whole for their graph version; a
#: longer one reads its first event and its log's tail only (an upgrade is found
#: there unless the run went on for long after it), as `runs` must stay fast.
_SCAN_FOR_VERSION = 5000


def _graph_version(store: Any, row: Any) -> str:
    """The graph a run runs on, as people read it (``upgrade`` moves runs)."""
    from graphrun.eventstore.events import GraphUpgraded, RunStarted
    from graphrun.eventstore.projections import graph_version

    if row.last_seq <= _SCAN_FOR_VERSION:
        events = store.read(row.run_id)
        tail = events[1:]
    else:
        events = store.read(row.run_id, upto=1)
        tail = store.read(row.run_id, after=max(0, row.last_seq - 256))
    upgrades = [e for e in tail if isinstance(e, GraphUpgraded)]
    if upgrades:
        return graph_version(upgrades[-1].new_hash)
    start = events[0] if events and isinstance(events[0], RunStarted) else None
    return graph_version(start.graph_hash) if start else ""


def _usage_cells(store: Any, row: Any, prices: Any) -> tuple[Any, ...]:
    from graphrun.runtime.engine.usage import format_cost, run_usage, tree_usage

    own, _ = run_usage(store.read(row.run_id), prices)
    tree = tree_usage(store, row.run_id, prices)
    cost = format_cost(own.cost) if own.cost_known else "?"
    return (own.total_tokens, cost if own.calls else "", tree.total_tokens)


def _waiting_request(store: Any, row: Any) -> Any:
    """The ``HumanInputRequested`` a run waits at, or None. A waiting run's request
    is its last one (an answer, or a node entered after it, ends the wait): it is
    read from the log's tail, not by folding a long log whole."""
    from graphrun.eventstore.events import HumanInputRequested
    from graphrun.eventstore.fold import fold

    if row.status == "waiting":
        tail = store.read(row.run_id, after=max(0, row.last_seq - 32))
        asked = [e for e in tail if isinstance(e, HumanInputRequested)]
        if asked:
            return asked[-1]
    return fold(store.read(row.run_id)).waiting


@click.command("show")
@click.argument("run_id")
@click.option("--at", "at_seq", type=int, metavar="SEQ", help="The state after event SEQ.")
@json_option
@db_option
def show_cmd(run_id: str, at_seq: int | None, as_json: bool, db: str | None) -> None:
    """Show RUN_ID's status, path through the graph, state and child runs (at any SEQ)."""
    from graphrun.runtime.inspect import describe_run

    store = open_store(db)
    run_id = resolve_run(store, run_id)
    info = describe_run(store, run_id, at_seq)
    lost = store.lost_head(run_id)
    if lost is not None:
        click.echo(f"warning: {lost}", err=True)
    if as_json:
        click.echo(json.dumps(info, ensure_ascii=False, default=str))
        return
    from graphrun.runtime.inspect import format_description

    text = format_description(info)
    if info.get("forked_from"):
        head, _, rest = text.partition("\n")
        fork = f"forked from run {info['forked_from']} at seq {info['forked_at']}"
        text = f"{head}\n{fork}\n{rest}" if rest else f"{head}\n{fork}"
    click.echo(terminal_safe(text))


@click.command("events")
@click.argument("run_id")
@click.option("--type", "types", multiple=True, help="Only events of this type (repeatable).")
@json_option
@db_option
def events_cmd(run_id: str, types: tuple[str, ...], as_json: bool, db: str | None) -> None:
    """Print RUN_ID's event log (JSON lines with --json)."""
    store = open_store(db)
    run_id = resolve_run(store, run_id)
    events = store.read(run_id)
    try:
        _print_events(events, types, as_json)
    except BrokenPipeError:
        # The reader stopped (`| head`): that is success. Point stdout at devnull so
        # the interpreter's last flush cannot fail again.
        import os
        import sys

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(0) from None


def _print_events(events: list[Any], types: tuple[str, ...], as_json: bool) -> None:
    from graphrun.eventstore import codec
    from graphrun.runtime.inspect import summarize_event

    for event in events:
        if types and type(event).__name__ not in types:
            continue
        if as_json:
            click.echo(codec.encode(event).decode("utf-8"))
        else:
            from graphrun.cli.render import when

            node = getattr(event, "node_id", None) or ""
            if event.branch and event.branch != node:
                node = f"{node}@{event.branch}"  # a map item: node@map[i]
            elif event.branch:
                node = f"{node}∥"  # a branch of a parallel super-step
            click.echo(
                terminal_safe(
                    f"{event.seq:>5}  {when(event.ts)}  {type(event).__name__:<19} {node:<16} "
                    f"{summarize_event(event)}".rstrip()
                )
            )


@click.command("audit")
@click.argument("run_id", metavar="RUN_ID|FILE")
@click.option(
    "--verify",
    is_flag=True,
    help="Check the hash chain of every event and every signature (exit 1 if anything is broken).",
)
@click.option(
    "--signers",
    metavar="FILE",
    help="The allowed_signers file signatures are checked against (default: next to the "
    "graph, else in the config directory).",
)
@click.option(
    "--anchor",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[ANCHOR]",
    help="Alone: print the run's head as an anchor to keep elsewhere. With --verify "
    "ANCHOR: check that nothing up to it changed (exit 1 if it did).",
)
@json_option
@db_option
def audit_cmd(
    run_id: str,
    verify: bool,
    signers: str | None,
    anchor: str | None,
    as_json: bool,
    db: str | None,
) -> None:
    """Every human decision of RUN_ID and its child runs: when, node, question, answer,
    by, identity, via.

    BY is the claimed name (--as) or the signer, followed by the OS account and host
    when they differ from it. IDENTITY is signed or claimed (verified or BROKEN with
    --verify). With --verify, the hash chain of every event of every run is
    recomputed and every signature is checked against the signers file; each
    decision is reported as verified (by which key), claimed, or BROKEN (which check
    failed), and the exit code is 1 if anything is broken. Given an export FILE
    instead of a run, --verify checks the file on its own, without a database.
    """
    from pathlib import Path

    if verify and Path(run_id).is_file():
        _verify_file(Path(run_id), signers, as_json)
        return
    from graphrun.cli.render import table, when
    from graphrun.runtime.inspect import audit_tree

    store = open_store(db)
    run_id = resolve_run(store, run_id)
    if anchor is not None and _anchor(store, run_id, anchor, verify):
        return
    signatures: dict[str, Any] | None = None
    if verify:
        # The chain first, from the stored bytes alone: a damaged log is reported
        # by seq, not by whichever reader trips over it first.
        checks = verify_tree(store, run_id)
        if all(item["ok"] for item in checks):
            report = audit_tree(store, run_id, verify=False)
            signatures = _verify_signatures(store, run_id, signers)
            _merge(report["decisions"], signatures)
            report["signatures"] = signatures
        else:
            report = {"run_id": run_id, "decisions": []}
        report["verify"] = checks
    else:
        report = audit_tree(store, run_id, verify=False)
    if as_json:
        click.echo(json.dumps(report, ensure_ascii=False, default=str))
    else:
        rows = [
            (
                when(d["ts"]),
                ("  " * d["depth"]) + d["node_id"],
                d["question"].strip(),
                _answer_cell(d),
                d["by"] if d["by"] == d["os_user"] else f"{d['by']} ({d['os_user']}@{d['host']})",
                d["identity"],
                d["via"],
                d["run_id"],
            )
            for d in report["decisions"]
        ]
        if rows:
            click.echo(
                table(
                    rows,
                    ["WHEN (UTC)", "NODE", "QUESTION", "ANSWER", "BY", "IDENTITY", "VIA", "RUN"],
                )
            )
        else:
            click.echo(f"no human decisions in run {run_id} or its child runs", err=True)
        for item in report.get("verify", []):
            if item["ok"]:
                click.echo(f"ok: run {item['run_id']}: {item['events']} events verify", err=True)
            else:
                click.echo(
                    f"BROKEN: run {item['run_id']}: first bad seq {item['seq']}: {item['reason']}",
                    err=True,
                )
        if signatures is not None:
            from graphrun.runtime.decisions.report import format_report

            for line in format_report(signatures):
                click.echo(terminal_safe(line), err=True)
    if verify and not all(item["ok"] for item in report["verify"]):
        raise SystemExit(1)
    if signatures is not None and not signatures["ok"]:
        raise SystemExit(1)


def _trust(signers: str | None, agent_dir: str | None) -> Any:
    from graphrun.runtime.decisions import make_trust
    from graphrun.runtime.decisions.sshsig import find_signers
    from graphrun.runtime.graph.config import config_dir

    return make_trust(find_signers(signers, graph_dir=agent_dir, config_dir=config_dir()))


def _verify_signatures(store: Any, run_id: str, signers: str | None) -> dict[str, Any]:
    from graphrun.runtime.decisions.report import verify_store

    first = store.read(run_id, upto=1)[0]
    return verify_store(store, run_id, _trust(signers, getattr(first, "agent_dir", "") or None))


def _merge(decisions: list[dict[str, Any]], signatures: dict[str, Any]) -> None:
    """The verified identity (and key, or what broke) on each audit row."""
    found = {(d["run_id"], d["seq"]): d for d in signatures["decisions"]}
    for row in decisions:
        check = found.get((row["run_id"], row["seq"]))
        if check is None:
            continue
        row["identity"] = "BROKEN" if check["identity"] == "broken" else check["identity"]
        row["key"] = check["key"]
        row["problem"] = check["problem"]


def _verify_file(path: Any, signers: str | None, as_json: bool) -> None:
    """``audit --verify FILE``: an export checked on its own (no database)."""
    from graphrun.runtime.decisions.report import format_report, verify_export
    from graphrun.runtime.replay.transfer import ExportFileError

    try:
        report = verify_export(path, _trust(signers, None))
    except ExportFileError as exc:
        if as_json:
            click.echo(json.dumps({"file": str(path), "ok": False, "error": str(exc)}))
        else:
            click.echo(f"BROKEN: {exc}", err=True)
        raise SystemExit(1) from None
    report["file"] = str(path)
    if as_json:
        click.echo(json.dumps(report, ensure_ascii=False, default=str))
    else:
        for line in format_report(report):
            click.echo(line, err=True)
        counts = ", ".join(f"{n} {kind}" for kind, n in sorted(report["counts"].items()))
        click.echo(f"{path}: {counts or 'no human decisions'}", err=True)
    if not report["ok"]:
        raise SystemExit(1)


def _anchor(store: Any, run_id: str, anchor: str, verify: bool) -> bool:
    """``--anchor``: print the head (True: nothing else to do), or check ``anchor``."""
    from graphrun.runtime.replay.transfer import anchor_of, check_anchor

    if not anchor:
        if verify:
            from graphrun.runtime.errors import UsageError

            raise UsageError("--verify --anchor needs the anchor to check")
        click.echo(anchor_of(store, run_id))
        return True
    seq, problem = check_anchor(store, run_id, anchor)
    if problem:
        click.echo(f"BROKEN: run {run_id}: anchor at seq {seq}: {problem}", err=True)
        raise SystemExit(1)
    click.echo(f"ok: run {run_id}: the anchor at seq {seq} holds", err=True)
    return False


def verify_tree(store: Any, run_id: str) -> list[dict[str, Any]]:
    """The chain check of a run and of every run under it (each: ``run_id``, ``ok``,
    ``events``, first bad ``seq``, ``reason``)."""
    from graphrun.eventstore.errors import CorruptStoreError
    from graphrun.runtime.engine.runs import snapshot_problem

    todo, seen, checks = [run_id], {run_id}, []
    while todo:
        rid = todo.pop(0)
        problem = store.verify(rid) or snapshot_problem(store, rid)
        try:
            events = store.run(rid).last_seq
            children = [r.run_id for r in store.runs(parent=rid)]
        except CorruptStoreError:
            events, children = None, []
        checks.append(
            {
                "run_id": rid,
                "ok": problem is None,
                "events": events,
                "seq": problem.seq if problem else None,
                "reason": problem.reason if problem else None,
            }
        )
        for child in children:
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return checks


def _answer_cell(decision: dict[str, Any]) -> str:
    if decision["used"] != decision["answer"]:
        return f"(empty: default {decision['used']!r})"
    return str(decision["answer"])


@click.command("diff")
@click.argument("run_a")
@click.argument("run_b")
@json_option
@db_option
def diff_cmd(run_a: str, run_b: str, as_json: bool, db: str | None) -> None:
    """Where RUN_A and RUN_B part ways: the first differing decision, then per node
    the differences of prompts, outputs and state."""
    from graphrun.runtime.inspect import diff_runs, format_diff

    store = open_store(db)
    a, b = resolve_run(store, run_a), resolve_run(store, run_b)
    report = diff_runs(store.read(a), store.read(b))
    if as_json:
        click.echo(json.dumps(report, ensure_ascii=False, default=str))
    else:
        click.echo(format_diff(report))
    if report["first_difference"] is not None:
        raise SystemExit(1)
