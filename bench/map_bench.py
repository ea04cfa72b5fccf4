"""Benchmark a big ``map``: 1,000 vs 10,000 llm calls, time and peak memory.

The map of ``parallel_bench`` (each item an ``llm`` node answered after 50 ms by a
local OpenAI-protocol server in its own process, ``max_concurrency: 100``, every
call and result committed to a real SQLite log) over 1,000 and over 10,000 items,
each run in a fresh process after a one-item warm-up run, so that its peak RSS
(``ru_maxrss``) is its own. Targets: the 10,000-item map takes <= 10.5x the time
and <= 1.3x the peak RSS of the 1,000-item one (the ideal is 10x the time and the
same memory beyond the results themselves). Then ``show``, ``report`` and ``replay``
of the two runs: what each command does after start-up, as CPU time (a busy machine
blurs wall time far more), the 10,000-item run's <= 10.5x the 1,000-item one's
(linear). Each size is costed in processes of its own (five, the median taken, so
that two processes a host's hiccup slowed move nothing; the two sizes' processes
alternate), each calling the command twice to warm up and then
several times (20 at 1,000 items, 2 at 10,000): the mean per call counts Python's
full collections at the rate they come. A full collection walks every object the
process holds; at 1,000 items one comes every few calls, so the least of a few calls
would leave it out, and a process that had just costed the other size would start
with that size's heap. Beside each figure: the part of it the cyclic collector's
pauses took (measured with ``gc.callbacks``, which only observe).

``--per-item 1000,3000,5000,10000`` also maps those sizes (a run each) and prints
what each command costs per item at each, the same way (context, not a target).

Usage: ``python bench/map_bench.py [--quick | --smoke] [--per-item N,N,...] [--json]``;
exits 1 when a target is missed.
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
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Check, Report, mode_of, parse_args, timed_with_cpu

TIME_TARGET = 10.5
RSS_TARGET = 1.3
LINEAR_TARGET = 10.5
CONCURRENCY = 100
#: Fresh processes each command is costed in, per size (the median judged).
COST_PROCESSES = 5
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


def one_cost(command: str, db: str, run_id: str, calls: int) -> None:
    """In this (fresh) process: ``command`` twice to warm up, then ``calls`` times;
    prints the mean CPU and wall seconds per call, and the collector's part, as JSON."""
    import gc
    import threading

    fn = COMMANDS[command]
    paused = [0.0, 0.0]  # the collector's CPU time, and when the current pause began

    def observe(phase: str, info: dict[str, Any]) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if phase == "start":
            paused[1] = time.thread_time()
        else:
            paused[0] += time.thread_time() - paused[1]

    fn(db, run_id)
    fn(db, run_id)
    gc.callbacks.append(observe)
    try:
        wall, cpu = timed_with_cpu(lambda: [fn(db, run_id) for _ in range(calls)])
    finally:
        gc.callbacks.remove(observe)
    print(json.dumps({"cpu": cpu / calls, "wall": wall / calls, "gc": paused[0] / calls}))


def command_costs(command: str, runs: dict[int, dict[str, Any]]) -> dict[int, dict[str, float]]:
    """For each map in ``runs`` (by item count), the median over COST_PROCESSES fresh processes
    of ``command``'s mean cost per call on it. The sizes' processes alternate (one of
    each, COST_PROCESSES times), so that a machine that speeds up or slows down during the
    measurement weighs on every size alike."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--cost", command]
    found: dict[int, list[dict[str, float]]] = {items: [] for items in runs}
    for _ in range(COST_PROCESSES):
        for items, run in runs.items():
            calls = max(2, 20_000 // items)
            done = subprocess.run(
                [*cmd, run["db"], run["run_id"], str(calls)], capture_output=True, text=True
            )
            if done.returncode != 0:
                raise SystemExit(
                    f"`{command}` of the {items}-item map failed:\n{done.stderr[-3000:]}"
                )
            found[items].append(json.loads(done.stdout.splitlines()[-1]))
    return {
        items: {k: statistics.median(f[k] for f in costs) for k in ("cpu", "wall", "gc")}
        for items, costs in found.items()
    }


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--one":
        url, where, items = sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
        one_run(url, where, items)
        return 0
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--cost":
        one_cost(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return 0
    args = parse_args(
        __doc__,
        argv,
        lambda p: p.add_argument(
            "--per-item", metavar="N,N,...", help="item counts to cost each command at, per item"
        ),
    )
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
        for command in COMMANDS:
            cost = command_costs(command, {items: found[items][-1] for items in (small, large)})
            big, little = cost[large], cost[small]
            without = (big["cpu"] - big["gc"]) / (little["cpu"] - little["gc"])
            report.add(
                Check(
                    f"`graphrun {command}` of the {large:,}-item map vs {small:,}",
                    big["cpu"] / little["cpu"],
                    "<=",
                    LINEAR_TARGET,
                    detail=f"CPU {big['cpu']:.3f} s vs {little['cpu']:.4f} s a call, of which "
                    f"the cyclic collector's pauses {big['gc'] * 1e3:.0f} ms vs "
                    f"{little['gc'] * 1e3:.1f} ms (without them {without:.2f}x); wall "
                    f"{big['wall']:.3f} s vs {little['wall']:.4f} s = "
                    f"{big['wall'] / little['wall']:.1f}x; load {os.getloadavg()[0]:.2f}",
                )
            )
        if args.per_item:
            per_item(report, url, tmp, [int(n) for n in args.per_item.split(",")])
    return report.exit_code()


def per_item(report: Report, url: str, tmp: Path, sizes: list[int]) -> None:
    """Each command's CPU time per item (:func:`command_costs`) on a map of each size."""
    where = tmp / "per-item"
    where.mkdir()
    runs = {items: measure(url, where, items, 0) for items in sizes}
    for command in COMMANDS:
        costs = [
            f"{items:,}: {cost['cpu'] / items * 1e6:.1f}"
            for items, cost in command_costs(command, runs).items()
        ]
        report.note(
            f"`graphrun {command}`, µs of CPU per item: {'; '.join(costs)} "
            f"(load {os.getloadavg()[0]:.2f})"
        )


if __name__ == "__main__":
    sys.exit(main())
