"""Benchmark ``graphrun approve`` on a long waiting run against one bare read of its log.

A run of about 10,000 events (a script loop of ~3,300 visits, then an approval
node) waits for an answer. ``approve RUN approve --as bench`` answers it and
continues it to its end, in this process (the CLI's ``main``; imports warmed by one
approve first); the baseline is what no command that continues a run can skip: open
the store, read and verify the log once (``SqliteStore.read_verified``: each event
decoded once, the hash chain and the runs row checked). Each timing starts from a
fresh copy of the same database. Target: approve <= 1.3x the bare read + verify.

The waiting run is recorded once by running the loop for real, in a process of its
own (the timings do not run in the heap that drive grew), and kept in
``$GRAPHRUN_BENCH_CACHE`` (default: a folder in the temp dir), keyed by the agent,
the event schema, the decider, the fold and the file format. The drive that left
it waiting kept its state snapshot, as every such drive does: ``approve`` folds
only the events after it (see ``graphrun.eventstore.snapshots``).

Usage: ``python bench/approve_bench.py [--quick | --smoke] [--json]``; exits 1 when
the target is missed.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, Check, Report, loop_script, mode_of, parse_args, timed_with_cpu

RATIO_TARGET = 1.3
#: events, timed rounds of each side
SIZES = {"full": (10_000, 11), "quick": (2_000, 5), "smoke": (100, 2)}

GRAPH = """\
name: long-gate
version: "1.0"
start: step
settings:
  max_loop_iterations: 1000000
initial_state:
  i: 0
  n: 10
nodes:
  step:
    type: script
    script: step.sh
    next: gate
  gate:
    type: approval
    question: "Ship after {{i}} steps?"
    options: [approve, reject]
    routes: {approve: done, reject: done}
    on_other: done
    state_updates:
      decision: "{{choice}}"
  done:
    type: end
    output: "{{decision}} after {{i}}"
"""

SCRIPT = loop_script("gate")


def _cache_folder(events: int) -> Path:
    """Where the waiting run of about ``events`` events is kept, keyed by the agent,
    the event schema, the decider, the fold and the file format."""
    from graphrun.eventstore import events as events_module
    from graphrun.eventstore import fold, migrations, snapshots
    from graphrun.runtime.engine import decider

    key = hashlib.sha256()
    for part in (GRAPH, SCRIPT, str(events)):
        key.update(part.encode())
    for module in (events_module, decider, fold, snapshots, migrations):  # the format too
        key.update(Path(module.__file__ or "").read_bytes())
    cache = Path(
        os.environ.get("GRAPHRUN_BENCH_CACHE") or Path(tempfile.gettempdir()) / "graphrun-bench"
    )
    return cache / f"gate-{events}-{key.hexdigest()[:16]}"


def waiting_run(events: int) -> tuple[Path, str, int]:
    """A database holding one run of about ``events`` events that waits at ``gate``:
    the file, the run id and its event count (recorded once, then cached)."""
    from graphrun.eventstore.store import SqliteStore
    from graphrun.runtime.engine.driver import Driver, RunOptions, drive, start_run
    from graphrun.runtime.graph.loader import load_graph

    folder = _cache_folder(events)
    done = folder / "run_id"
    if done.exists():
        run_id, count = done.read_text().split()
        return folder / "events.db", run_id, int(count)
    shutil.rmtree(folder, ignore_errors=True)
    agent = folder / "agent"
    agent.mkdir(parents=True)
    (agent / "graph.yaml").write_text(GRAPH, encoding="utf-8")
    (agent / "step.sh").write_text(SCRIPT, encoding="utf-8")
    (agent / "step.sh").chmod(0o755)
    print(
        f"      recording a {events:,}-event waiting run (once; cached in {folder.parent})",
        flush=True,
    )
    start = time.perf_counter()
    store = SqliteStore(folder / "events.db")
    try:
        # RunStarted, 3 events per visit, 2 to wait at the gate.
        run_id = start_run(store, load_graph(agent), overrides={"n": max(1, (events - 3) // 3)})
        outcome = drive(Driver(store, run_id, RunOptions(interactive=False)))
        if outcome.status != "waiting":
            raise RuntimeError(f"the run {run_id} ended {outcome.status}: {outcome.error}")
        count = store.run(run_id).last_seq
        kept = store.snapshot(run_id)
        if kept is None or kept[0] != count:
            raise RuntimeError(f"the run {run_id} left waiting kept no snapshot at seq {count}")
    finally:
        store.close()
    with contextlib.closing(sqlite3.connect(folder / "events.db")) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    print(f"      recorded in {time.perf_counter() - start:.1f}s", flush=True)
    done.write_text(f"{run_id} {count}")
    return folder / "events.db", run_id, count


def recorded_apart(events: int) -> tuple[Path, str, int]:
    """:func:`waiting_run`, recorded (when not cached yet) in a process of its own:
    the timings must not run in the heap a 10,000-event drive grew (its collector
    passes made the first run after a recording read ~1.4x, the later ones ~1.2x)."""
    if not (_cache_folder(events) / "run_id").exists():
        code = (
            f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            f"from bench.approve_bench import waiting_run; waiting_run({events})"
        )
        subprocess.run([sys.executable, "-c", code], check=True)
    return waiting_run(events)  # cached: read, not recorded


def fresh_copy(db: Path, tmp: Path, n: int) -> Path:
    """A copy of the database as recorded, without what an earlier copy left beside
    it (its WAL, and the heads it reported, which the copy would fall behind)."""
    copy = tmp / f"copy{n}.db"
    for stale in tmp.glob(f"copy{n}.db*"):
        stale.unlink()
    shutil.copyfile(db, copy)
    return copy


def approve(db: Path, run_id: str) -> None:
    """``graphrun approve RUN approve --as bench`` in this process."""
    from graphrun.cli import main

    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            main(["approve", run_id, "approve", "--as", "bench", "--db", str(db)])
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise RuntimeError(f"approve exited {exc.code}: {said.getvalue()[-400:]}") from None


def bare_read(db: Path, run_id: str) -> None:
    """Open the store, read and verify the log once."""
    from graphrun.eventstore.store import SqliteStore

    store = SqliteStore(db)
    try:
        events, problem = store.read_verified(run_id)
        assert problem is None and events
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    mode = mode_of(args)
    report = Report("approve_bench", mode=mode, as_json=args.json)
    events, rounds = SIZES[mode]
    db, run_id, count = recorded_apart(events)
    report.note(f"a waiting run of {count:,} events; load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="graphrun-approve-") as name:
        tmp = Path(name)
        os.environ["GRAPHRUN_CONFIG_DIR"] = str(tmp / "config")
        os.environ["GRAPHRUN_NO_TTY"] = "1"
        # Warm the imports and the graph parser on both sides first.
        approve(fresh_copy(db, tmp, 0), run_id)
        bare_read(fresh_copy(db, tmp, 0), run_id)
        took: dict[str, list[float]] = {"approve": [], "bare": []}
        cpu: dict[str, list[float]] = {"approve": [], "bare": []}
        for n in range(1, rounds + 1):  # alternating, each on a fresh copy
            copy = fresh_copy(db, tmp, n)
            wall, used = timed_with_cpu(lambda: bare_read(copy, run_id))  # noqa: B023
            took["bare"].append(wall)
            cpu["bare"].append(used)
            copy = fresh_copy(db, tmp, n)
            wall, used = timed_with_cpu(lambda: approve(copy, run_id))  # noqa: B023
            took["approve"].append(wall)
            cpu["approve"].append(used)
        approve_s = statistics.median(took["approve"])
        bare_s = statistics.median(took["bare"])
        approve_cpu = statistics.median(cpu["approve"])
        bare_cpu = statistics.median(cpu["bare"])
        # Context: CPU time (every thread of this process) moves less with the
        # machine's load than wall time; the commits' waits for the disk are not in it.
        report.note(
            f"CPU: approve {approve_cpu * 1000:.0f} ms, read + verify {bare_cpu * 1000:.0f} ms "
            f"= {approve_cpu / bare_cpu:.2f}x (medians of {rounds})"
        )
        report.add(
            Check(
                f"approve on a {count:,}-event waiting run vs one bare read + verify",
                approve_s / bare_s,
                "<=",
                RATIO_TARGET,
                detail=f"approve {approve_s * 1000:.0f} ms, read + verify {bare_s * 1000:.0f} ms, "
                f"medians of {rounds}; load {os.getloadavg()[0]:.2f}",
            )
        )
    return report.exit_code()


if __name__ == "__main__":
    sys.exit(main())
