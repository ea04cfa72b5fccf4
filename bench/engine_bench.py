"""Benchmark the engine's own concurrency: 1,000 effects that each wait 50 ms.

A ``map`` over N items whose branch is an ``llm`` node, driven by the real
:class:`~graphrun.runtime.engine.driver.Driver` on a real SQLite log, with the llm
node's effect swapped (through ``RunOptions.extra``, the way a node type plugs its
actor in) for one that waits 50 ms on its cancel token and records an ``LlmResult``:
no HTTP, no server, so what is left is the engine (decider, worker pool, fold,
event encoding, one commit per wake-up). Every result is committed to the log
(checked). Target: <= 1.3x the ideal ``N / C * 50 ms`` (0.5 s for 1,000 items at
100).

Measured in the same run, as the baseline: a bare thread pool of C threads that
each wait 50 ms, N times (what the machine does with no engine at all).

No process tuning of any kind. Usage: ``python bench/engine_bench.py [--items N]
[--concurrency C] [--rounds R] [--json]``; exits 1 when the target is missed.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

DELAY = 0.05
IDEAL_RATIO_TARGET = 1.3

GRAPH = """
name: fan-wait
version: "1.0"
model: openai:gpt-bench
start: fan
initial_state:
  items: {items}
nodes:
  fan:
    type: map
    over: "{{{{items}}}}"
    as: item
    branch: wait
    collect_into: answers
    max_concurrency: {concurrency}
    next: done
  wait:
    type: llm
    prompt: "item {{{{item}}}}"
  done:
    type: end
    output: "{{{{answers[0]}}}}"
"""


class WaitEffect:
    """An llm node's effect that waits ``DELAY`` seconds (cancellable) and answers
    with its prompt: the engine's work around an effect, without the effect's."""

    def perform(self, task: Any, ctx: Any) -> None:
        from graphrun.eventstore.events import LlmResult

        ctx.cancel.wait(DELAY)
        ctx.record(LlmResult(node_id=task.node_id, visit=ctx.visit, text=task.prompt, calls=1))


def bench_engine(tmp: Path, items: int, concurrency: int) -> float:
    """Seconds for the map run, every result committed (checked)."""
    from graphrun.eventstore.events import LlmResult, RunCompleted
    from graphrun.eventstore.store import SqliteStore
    from graphrun.runtime.engine.driver import Driver, RunOptions, drive, start_run
    from graphrun.runtime.graph.loader import load_graph

    agent = tmp / "fan-wait"
    agent.mkdir()
    (agent / "graph.yaml").write_text(
        GRAPH.format(items=json.dumps(list(range(items))), concurrency=concurrency)
    )
    store = SqliteStore(tmp / "graphrun.db")
    try:
        run_id = start_run(store, load_graph(agent), prompt="go")
        options = RunOptions(extra={"llm": lambda driver: (WaitEffect, ())})
        started = time.perf_counter()
        outcome = drive(Driver(store, run_id, options))
        elapsed = time.perf_counter() - started
        if outcome.status != "completed":
            raise SystemExit(f"graphrun run {outcome.status}: {outcome.error}")
        events = store.read(run_id)
        results = sum(isinstance(e, LlmResult) for e in events)
        if results != items or not isinstance(events[-1], RunCompleted):
            raise SystemExit(f"the log has {results} results of {items} items")
    finally:
        store.close()
    return elapsed


def bench_bare(items: int, concurrency: int) -> float:
    """Seconds for N waits of 50 ms on a bare pool of C threads (the baseline)."""
    gate = threading.Event()
    with cf.ThreadPoolExecutor(max_workers=concurrency) as pool:
        started = time.perf_counter()
        list(pool.map(lambda _: gate.wait(DELAY), range(items)))
        return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    ideal = args.items / args.concurrency * DELAY
    engine: list[float] = []
    bare: list[float] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        warm = tmp / "warm-up"
        warm.mkdir()
        bench_engine(warm, 1, 1)  # imports, outside the timed runs
        for i in range(args.rounds):
            bare.append(bench_bare(args.items, args.concurrency))
            round_dir = tmp / f"round-{i}"
            round_dir.mkdir()
            engine.append(bench_engine(round_dir, args.items, args.concurrency))
    seconds = statistics.median(engine)
    baseline = statistics.median(bare)
    report = {
        "items": args.items,
        "concurrency": args.concurrency,
        "ideal_s": round(ideal, 3),
        "bare_pool_s": round(baseline, 3),
        "graphrun_s": round(seconds, 3),
        "graphrun_runs_s": [round(s, 3) for s in engine],
        "ratio_to_ideal": round(seconds / ideal, 2),
        "ratio_to_bare": round(seconds / baseline, 2),
    }
    failed = seconds / ideal > IDEAL_RATIO_TARGET
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{args.items} effects waiting {DELAY * 1000:.0f} ms at concurrency "
            f"{args.concurrency}, every result committed (median of {args.rounds}):\n"
            f"  bare thread pool {baseline:.3f} s (no engine, no log)\n"
            f"  graphrun         {seconds:.3f} s = {report['ratio_to_ideal']}x the ideal "
            f"{ideal:.2f} s (target <= {IDEAL_RATIO_TARGET}x), "
            f"{report['ratio_to_bare']}x the bare pool"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
