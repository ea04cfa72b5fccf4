"""Benchmark ``graphrun test``: replaying a folder of recorded runs in one process.

Target: ``graphrun test`` over 100 recorded runs of 100 node visits each (an
approval loop with a script step, answered in order) replays >= 10,000 events/s,
in one process (``runtime.testing.run_suite``: read, verify hashes, load the
current graph, replay, check script files). The recording itself is real runs
driven in-process (``start_run``/``Driver``/``drive``), exported one file each.

Usage: ``python bench/replay_suite_bench.py [--quick | --smoke] [--json]``.
Exits 1 when the target is missed.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Check, Report, mode_of, parse_args

GRAPH = """\
version: "1.0"
name: loop
start: prepare
nodes:
  prepare:
    type: script
    script: prepare.sh
    next: again
  again:
    type: approval
    question: "Round {{round}}: again?"
    options: [again, stop]
    routes:
      again: again
      stop: done
    on_other: done
    state_updates:
      round: "{{choice}}"
  done:
    type: end
    output: "stopped after {{round}}"
"""
PREPARE = '#!/usr/bin/env bash\necho \'{"round": "first"}\'\n'


def record(folder: Path, runs: int, visits: int) -> int:
    """Record ``runs`` runs of ``visits`` node visits; returns the number of events."""
    from graphrun.eventstore.store import SqliteStore
    from graphrun.runtime.engine.driver import Driver, RunOptions, drive, start_run
    from graphrun.runtime.graph.loader import load_graph
    from graphrun.runtime.replay.transfer import write_export

    agent = folder / "agent"
    agent.mkdir(parents=True)
    (agent / "graph.yaml").write_text(GRAPH)
    (agent / "prepare.sh").write_text(PREPARE)
    replays = folder / "replays"
    replays.mkdir()
    loaded = load_graph(agent)
    store = SqliteStore(folder / "record.db", create=True)
    # prepare + (visits - 2) approvals + done
    answers = ["again"] * (visits - 3) + ["stop"]
    total = 0
    for i in range(runs):
        run_id = start_run(store, loaded, prompt=f"run {i}")
        outcome = drive(Driver(store, run_id, RunOptions(answers={"again": list(answers)})))
        assert outcome.status == "completed", outcome.error
        out = replays / f"run{i:03d}.run.jsonl"
        with out.open("w", encoding="utf-8") as fh:
            total += write_export(store, run_id, fh, relative_to=replays)
    store.close()
    return total


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    mode = mode_of(args)
    runs, visits = {"full": (100, 100), "quick": (30, 100), "smoke": (3, 20)}[mode]
    report = Report("graphrun test over recorded runs", mode, args.json)
    from graphrun.runtime.replay.testing import run_suite

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.environ["GRAPHRUN_NO_TTY"] = "1"
        started = time.perf_counter()
        events = record(folder, runs, visits)
        report.note(
            f"recorded {runs} runs, {events:,} events in {time.perf_counter() - started:.1f}s"
        )
        out = io.StringIO()
        started = time.perf_counter()
        with contextlib.redirect_stdout(out):
            code = run_suite([str(folder / "replays")])
        seconds = time.perf_counter() - started
        summary = out.getvalue().splitlines()[-1]
        if code != 0:
            print(out.getvalue(), file=sys.stderr)
        report.add(
            Check(
                "graphrun test events/s",
                events / seconds,
                ">=",
                10_000,
                unit=" ev/s",
                detail=f"{runs} runs x {visits} visits, {events:,} events in {seconds:.2f}s; "
                f"{summary}",
            )
        )
        report.add(Check("every recorded run passes", float(code == 0), ">=", 1.0, unit=""))
    return report.exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
