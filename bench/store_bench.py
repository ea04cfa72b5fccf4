"""Big stores: ``runs`` and ``show`` on 100,000 runs, ``show`` of a 100,000-event run.

Each figure is a ratio against the same command on a store ten times smaller,
measured in the same run (the load average is printed with them):

1. ``graphrun runs`` (the first page), ``runs --status waiting`` and ``show RUN``
   of one small run, on a store of 100,000 runs against 10,000 (target: each
   <= 1.5x; a page read through indexes costs the same whatever the store holds);
2. ``show`` of a run of 100,000 events against one of 10,000, per event (target:
   <= 1.5x: the cost is linear in the run's own events, nothing else).

Both SQLite and PostgreSQL. The commands run in this process through the CLI's
own entry point (click's runner: argument parsing, store opening, rendering; no
interpreter start-up): the median of several calls after one warm-up, the calls
on the small and the big store interleaved; SQLite's by this process's CPU time
(it does its work here, and a busy machine does not blur that), PostgreSQL's by
wall time (the work is the server's).

The SQLite stores are written through ``SqliteStore.append`` (five events per
run: started, one script step, then completed, or, one run in forty, waiting for
an approval: a full first page of waiting runs from 2,000 runs on) and kept in
``$GRAPHRUN_BENCH_CACHE`` (default: a folder in the temp dir), keyed by the
store's code. The PostgreSQL stores (a throw-away server,
tests/support/pg.py) get the same rows, hashes included, by ``COPY`` from the
SQLite file: appending 100,000 runs one transaction at a time would take most of
the benchmark's time budget and measure nothing this benchmark is about.

Usage: ``python bench/store_bench.py [--quick | --smoke] [--json] [--no-pg]``.
Exits 1 when a target is missed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Check, Report, mode_of

RATIO_TARGET = 1.5
SIZES = {"full": (10_000, 100_000), "quick": (2_000, 20_000), "smoke": (300, 3_000)}
REPEAT = {"full": 15, "quick": 9, "smoke": 3}


def _cache() -> Path:
    return Path(
        os.environ.get("GRAPHRUN_BENCH_CACHE") or Path(tempfile.gettempdir()) / "graphrun-bench"
    )


def _code_key(*parts: str) -> str:
    from graphrun.eventstore import codec, migrations, store
    from graphrun.eventstore import events as events_module

    key = hashlib.sha256("|".join(parts).encode())
    for module in (events_module, migrations, store, codec):
        key.update(Path(module.__file__ or "").read_bytes())
    key.update(Path(__file__).read_bytes())
    return key.hexdigest()[:16]


def _run_events(i: int) -> list[list[Any]]:
    """The appends of the ``i``-th run: five events in three transactions."""
    from graphrun.eventstore.events import HumanInputRequested, RunCompleted
    from tests.conformance.store_contract import started, step

    last: Any = (
        HumanInputRequested(node_id="ask", visit=1, kind="approval", question="ship?")
        if i % 40 == 0
        else RunCompleted(node_id="done", output=f"run {i} done")
    )
    return [[started(f"g{i % 7}")], step("work", 1, i, None), [last]]


def runs_store(count: int) -> Path:
    """An SQLite file of ``count`` small runs (cached)."""
    from graphrun.eventstore.store import SqliteStore

    folder = _cache() / f"store-runs-{count}-{_code_key('runs', str(count))}"
    db = folder / "events.db"
    if (folder / "done").exists():
        return db
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    print(f"      writing {count:,} runs (once; cached in {_cache()})", flush=True)
    start = time.perf_counter()
    with SqliteStore(db, create=True) as store:
        for i in range(count):
            for batch in _run_events(i):
                store.append(f"run{i:07d}", batch)
    print(f"      written in {time.perf_counter() - start:.1f}s", flush=True)
    (folder / "done").write_text("ok")
    return db


def long_run_store(events: int) -> Path:
    """An SQLite file with one run of about ``events`` events, ``run0000000``."""
    from graphrun.eventstore.events import RunCompleted
    from graphrun.eventstore.store import SqliteStore
    from tests.conformance.store_contract import started, step

    folder = _cache() / f"store-long-{events}-{_code_key('long', str(events))}"
    db = folder / "events.db"
    if (folder / "done").exists():
        return db
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    print(f"      writing a {events:,}-event run (once)", flush=True)
    with SqliteStore(db, create=True) as store:
        store.append("run0000000", [started("long")])
        visits = (events - 2) // 3
        batch: list[Any] = []
        for visit in range(1, visits + 1):
            batch += step("work", visit, visit, "work" if visit < visits else None)
            if len(batch) >= 300:
                store.append("run0000000", batch)
                batch = []
        store.append("run0000000", [*batch, RunCompleted(node_id="done", output="long done")])
    (folder / "done").write_text("ok")
    return db


def copy_to_postgres(db: Path, url: str) -> None:
    """The SQLite file's rows into a fresh PostgreSQL schema, as they are (COPY)."""
    import sqlite3

    from graphrun.eventstore.postgres import PostgresStore
    from graphrun.eventstore.projections import COLUMNS

    PostgresStore(url, max_connections=1).close()  # the tables
    import psycopg

    source = sqlite3.connect(db)
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with cur.copy(
            "COPY events (run_id, seq, ts, type, node_id, body, prev_hash, hash) FROM STDIN"
        ) as copy:
            prev_run, prev_hash = None, ""
            for run_id, seq, ts, kind, node, body, digest in source.execute(
                "SELECT run_id, seq, ts, type, node_id, body, hash FROM events ORDER BY id"
            ):
                if run_id != prev_run:
                    prev_run, prev_hash = run_id, "sha256:" + "0" * 64
                copy.write_row((run_id, seq, ts, kind, node, body, prev_hash, digest))
                prev_hash = digest
        with cur.copy(f"COPY runs ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            for row in source.execute(f"SELECT {', '.join(COLUMNS)} FROM runs"):
                copy.write_row(row)
        cur.execute("ANALYZE")
    source.close()


def paired_medians(
    small: Callable[[], Any], big: Callable[[], Any], repeat: int, clock: Callable[[], float]
) -> tuple[float, float]:
    """Median seconds (by ``clock``) of ``small`` and of ``big``, their calls
    interleaved (on a shared machine, load that comes and goes then falls on
    both alike), after one warm-up call of each."""
    small()
    big()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for fn, into in ((small, times[0]), (big, times[1])):
            start = clock()
            fn()
            into.append(clock() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def clock_of(kind: str) -> tuple[Callable[[], float], str]:
    """SQLite works in this process: its CPU time is the measure a busy machine
    does not blur. PostgreSQL works in the server: wall time."""
    if kind == "SQLite":
        return time.process_time, "CPU"
    return time.perf_counter, "wall"


def command(db: str, *args: str) -> Callable[[], None]:
    """One ``graphrun ARGS --db DB`` in this process; raises if it fails."""
    from click.testing import CliRunner

    from graphrun.cli import cli

    runner = CliRunner()

    def call() -> None:
        result = runner.invoke(cli, [*args, "--db", db], catch_exceptions=False)
        if result.exit_code != 0:
            raise RuntimeError(
                f"graphrun {' '.join(args)}: exit {result.exit_code}: {result.output}"
            )

    return call


def compare_runs(
    report: Report, kind: str, small: str, big: str, sizes: tuple[int, int], repeat: int
) -> None:
    probe = "run0000500" if sizes[0] > 500 else "run0000050"
    for label, args in (
        ("runs (first page)", ("runs",)),
        ("runs --status waiting", ("runs", "--status", "waiting")),
        ("show RUN", ("show", probe)),
    ):
        clock, what = clock_of(kind)
        t_small, t_big = paired_medians(command(small, *args), command(big, *args), repeat, clock)
        report.add(
            Check(
                f"{kind}: {label}, {sizes[1]:,} runs vs {sizes[0]:,}",
                t_big / t_small,
                "<=",
                RATIO_TARGET,
                detail=f"{t_big * 1000:.1f} vs {t_small * 1000:.1f} ms {what}",
            )
        )


def compare_long(
    report: Report, kind: str, small: str, big: str, sizes: tuple[int, int], repeat: int
) -> None:
    clock, what = clock_of(kind)
    t_small, t_big = paired_medians(
        command(small, "show", "run0000000"), command(big, "show", "run0000000"), 3, clock
    )
    per_event = (t_big / sizes[1]) / (t_small / sizes[0])
    report.add(
        Check(
            f"{kind}: show of a {sizes[1]:,}-event run vs {sizes[0]:,}, per event",
            per_event,
            "<=",
            RATIO_TARGET,
            detail=f"{t_big:.2f} vs {t_small:.3f} s {what} ({t_big / t_small:.1f}x the time "
            "for 10x the events)",
        )
    )


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, same checks (CI)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON lines")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    args = parser.parse_args(argv)
    args.quick = args.quick or args.smoke
    mode = mode_of(args)
    sizes = SIZES[mode]
    repeat = REPEAT[mode]
    report = Report("big stores", mode, args.json)
    runs_dbs = [runs_store(n) for n in sizes]
    long_dbs = [long_run_store(n) for n in sizes]
    report.note(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    compare_runs(report, "SQLite", str(runs_dbs[0]), str(runs_dbs[1]), sizes, repeat)
    compare_long(report, "SQLite", str(long_dbs[0]), str(long_dbs[1]), sizes, repeat)
    if args.no_pg:
        report.add(Check("PostgreSQL", 0, "<=", 1, skipped="--no-pg"))
    else:
        from tests.support.pg import NoPostgres, start_server

        try:
            server = start_server()
        except NoPostgres as exc:
            report.add(Check("PostgreSQL", 0, "<=", 1, skipped=str(exc)))
        else:
            try:
                urls = []
                for db in (*runs_dbs, *long_dbs):
                    url = server.new_schema()
                    start = time.perf_counter()
                    copy_to_postgres(db, url)
                    report.note(
                        f"copied {db.parent.name.rsplit('-', 1)[0]} to PostgreSQL "
                        f"in {time.perf_counter() - start:.1f}s"
                    )
                    urls.append(url)
                compare_runs(report, "PostgreSQL", urls[0], urls[1], sizes, repeat)
                compare_long(report, "PostgreSQL", urls[2], urls[3], sizes, repeat)
            finally:
                server.stop()
    report.note(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return report.exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
