"""Benchmark a big ``map``: 1,000 vs 10,000 llm calls, time and peak memory.

The map of ``parallel_bench`` (each item an ``llm`` node answered after 50 ms by a
local OpenAI-protocol server in its own process, ``max_concurrency: 100``, every
call and result committed to a real SQLite log) over 1,000 and over 10,000 items,
each run in a fresh process after a one-item warm-up run, so that its peak RSS
(``ru_maxrss``) is its own. Targets: the 10,000-item map takes <= 10.5x the time
and <= 1.3x the peak RSS of the 1,000-item one (the ideal is 10x the time and the
same memory beyond the results themselves). Then ``show``, ``report`` and
``replay`` of the two runs (what each command does after start-up, in this
process; the least CPU time of 5 calls, the sizes interleaved, with the wall time
alongside: each does its work here, and a busy machine blurs wall time far more):
the 10,000-item run's <= 10.5x the 1,000-item one's (linear).

Usage: ``python bench/map_bench.py [--quick | --smoke] [--json]``; exits 1 when a
target is missed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Check, Report, mode_of, parse_args, timed_with_cpu

TIME_TARGET = 10.5
RSS_TARGET = 1.3
LINEAR_TARGET = 10.5
CONCURRENCY = 100
#: (small, large) item counts, runs of each size (medians judged)
SIZES = {"full": (1_000, 10_000, 3), "quick": (300, 3_000, 1), "smoke": (20, 200, 1)}


def one_run(url: str, tmp: Path, items: int) -> None:
    """In this (fresh) process: a one-item warm-up map, then the timed one; prints
    its seconds, peak RSS and where its log is, as a JSON line."""
    from bench.parallel_bench import bench_graphrun

    warm = tmp / "warm"
    warm.mkdir()
    bench_graphrun(url, warm, 1, CONCURRENCY)
    where = tmp / "run"
    where.mkdir()
    seconds, cpu, db, run_id = bench_graphrun(url, where, items, CONCURRENCY)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    print(
        json.dumps({"seconds": seconds, "cpu": cpu, "rss": peak, "db": str(db), "run_id": run_id})
    )


def measure(url: str, tmp: Path, items: int, n: int) -> dict[str, Any]:
    where = tmp / f"map-{items}-{n}"
    where.mkdir()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", url, str(where), str(items)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {items}-item map failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.splitlines()[-1]))


def _show(db: str, run_id: str) -> None:
    from graphrun.eventstore.store import SqliteStore
    from graphrun.runtime.inspect import describe_run, format_description

    with SqliteStore(db) as store:
        format_description(describe_run(store, run_id, None))


def _report(db: str, run_id: str) -> None:
    from graphrun.eventstore.store import SqliteStore
    from graphrun.runtime.observe.report import write_report

    # As `graphrun report RUN -o FILE`: the page written to a file beside the store.
    with SqliteStore(db) as store:
        write_report(store, run_id, Path(db).with_name("report.html"))


def _replay(db: str, run_id: str) -> None:
    from graphrun.eventstore.store import SqliteStore
    from graphrun.runtime.replay.command import replay_command

    with SqliteStore(db) as store, contextlib.redirect_stdout(io.StringIO()):
        code = replay_command(store, run_id, graph_path=None, live=False, as_json=True)
    if code != 0:
        raise SystemExit(f"the replay of run {run_id} diverged")


#: What ``graphrun show``, ``report`` and ``replay`` do after start-up, in this process.
COMMANDS = {"show": _show, "report": _report, "replay": _replay}


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--one":
        url, where, items = sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
        one_run(url, where, items)
        return 0
    args = parse_args(__doc__, argv)
    mode = mode_of(args)
    report = Report("map_bench", mode=mode, as_json=args.json)
    small, large, runs = SIZES[mode]
    from bench.parallel_bench import KEY, Server

    os.environ["OPENAI_API_KEY"] = KEY
    with Server() as url, tempfile.TemporaryDirectory(prefix="graphrun-map-") as name:
        tmp = Path(name)
        found: dict[int, list[dict[str, Any]]] = {small: [], large: []}
        for n in range(runs):  # alternating sizes
            for items in (small, large):
                found[items].append(measure(url, tmp, items, n))
        load = os.getloadavg()[0]
        secs = {k: statistics.median(r["seconds"] for r in v) for k, v in found.items()}
        cpu = {k: statistics.median(r["cpu"] for r in v) for k, v in found.items()}
        # On a shared machine the wall time is the share of the CPUs the run got;
        # its CPU time (every thread) is what the load hardly moves.
        report.note(
            f"CPU: {cpu[large]:.2f} s vs {cpu[small]:.2f} s = {cpu[large] / cpu[small]:.2f}x "
            f"({cpu[large] / large * 1e6:.0f} vs {cpu[small] / small * 1e6:.0f} µs per item)"
        )
        rss = {k: statistics.median(r["rss"] for r in v) for k, v in found.items()}
        report.add(
            Check(
                f"map time, {large:,} items vs {small:,}",
                secs[large] / secs[small],
                "<=",
                TIME_TARGET,
                detail=f"{secs[large]:.2f} s vs {secs[small]:.2f} s (ideal "
                f"{large / CONCURRENCY * 0.05:.2f} / {small / CONCURRENCY * 0.05:.2f}); "
                f"medians of {runs}; load {load:.2f}",
            )
        )
        report.add(
            Check(
                f"map peak RSS, {large:,} items vs {small:,}",
                rss[large] / rss[small],
                "<=",
                RSS_TARGET,
                detail=f"{rss[large] / 2**20:.0f} MiB vs {rss[small] / 2**20:.0f} MiB; "
                f"{(rss[large] - rss[small]) / (large - small):.0f} bytes per extra item",
            )
        )
        for command, fn in COMMANDS.items():
            cpu_took: dict[int, float] = {}
            wall_took: dict[int, float] = {}
            for items in (small, large):  # warm: imports, the graph parsed
                fn(found[items][-1]["db"], found[items][-1]["run_id"])
            for _ in range(5):
                for items in (small, large):
                    last = found[items][-1]
                    wall, cpu_s = timed_with_cpu(lambda: fn(last["db"], last["run_id"]))  # noqa: B023
                    cpu_took[items] = min(cpu_took.get(items, cpu_s), cpu_s)
                    wall_took[items] = min(wall_took.get(items, wall), wall)
            report.add(
                Check(
                    f"`graphrun {command}` of the {large:,}-item map vs {small:,}",
                    cpu_took[large] / cpu_took[small],
                    "<=",
                    LINEAR_TARGET,
                    detail=f"CPU {cpu_took[large]:.3f} s vs {cpu_took[small]:.3f} s; wall "
                    f"{wall_took[large]:.3f} s vs {wall_took[small]:.3f} s = "
                    f"{wall_took[large] / wall_took[small]:.1f}x; in-process, least of 5; "
                    f"load {os.getloadavg()[0]:.2f}",
                )
            )
    return report.exit_code()


if __name__ == "__main__":
    sys.exit(main())
