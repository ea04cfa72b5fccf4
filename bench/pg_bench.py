"""PostgreSQL store and workers: throughput with 1, 2 and 4 workers; per-step overhead.

* Workers: ``graphrun worker`` processes (one slot each) drive submitted runs of
  a chain of llm nodes whose every call waits 50 ms at a local OpenAI-protocol
  server (parallel_bench's asyncio server, its own process). After three warm-up
  runs per worker (each process's first imports are not the steady state),
  throughput is runs/s from the first submit to the last run done; 2 and 4
  workers are compared with 1 worker measured in the same run (targets: >= 1.8x
  and >= 3.2x).
* Per-step overhead: the same chain driven in this process by the supervisor on
  an SQLite file and on PostgreSQL, minus the 50 ms per call both wait; and a
  bare append of a node step's three events to each store.

A throw-away PostgreSQL server is started (tests/support/pg.py) with fsync on;
both stores run with the CLI's default durability ("normal": SQLite's WAL with
synchronous=NORMAL, PostgreSQL's synchronous_commit=off; neither flushes to disk
per commit, and a killed graphrun process loses nothing committed on either).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, Check, Report, graphrun_cmd, isolated_env, mode_of, parse_args

DELAY = 0.05
SCALE_TARGETS = {2: 1.8, 4: 3.2}


def chain_graph(steps: int) -> str:
    lines = [
        "name: chain",
        'version: "1.0"',
        "model: openai:gpt-test",
        "start: n0",
        "settings:",
        "  validate_before_run: false",
        "nodes:",
    ]
    for i in range(steps):
        nxt = f"n{i + 1}" if i + 1 < steps else "done"
        lines += [f"  n{i}:", "    type: llm", f'    prompt: "step {i}"', f"    next: {nxt}"]
    lines += ["  done:", "    type: end", '    output: "ok"']
    return "\n".join(lines) + "\n"


def throughput(server: Any, agent: Path, env: dict[str, str], workers: int, runs: int) -> float:
    """Runs/s of ``workers`` worker processes on ``runs`` submitted runs."""
    from graphrun.eventstore.postgres import PostgresStore
    from graphrun.runtime.agents import load_agent
    from graphrun.runtime.engine.workers import submit_run

    url = server.new_schema()
    env = {**env, "GRAPHRUN_DB": url}
    store = PostgresStore(url, max_connections=2)
    procs = [
        subprocess.Popen(
            [*graphrun_cmd(), "worker", "--concurrency", "1", "--poll", "0.02"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(workers)
    ]
    try:
        for proc in procs:  # each prints one line once it is ready to claim
            assert proc.stderr is not None
            proc.stderr.readline()
        loaded = load_agent(agent, config_dir=None)

        def submit_and_wait(count: int, done: int) -> None:
            for i in range(count):
                submit_run(
                    store,
                    loaded,
                    prompt=str(i),
                    overrides={},
                    as_user="bench",
                    agents_dir=None,
                    config_dir=None,
                )
            while store.queue_counts().get("done", 0) < done + count:
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError("a worker exited early")
                time.sleep(0.01)

        # Warm-up: a few runs per worker first, so that what is timed is the workers'
        # steady state, not each process's first imports (four processes importing
        # at once on two cores would weigh on the 4-worker figure alone).
        warm = 3 * workers
        submit_and_wait(warm, 0)
        start = time.perf_counter()
        submit_and_wait(runs, warm)
        elapsed = time.perf_counter() - start
        failed = [r.run_id for r in store.runs(limit=(runs + warm) * 2) if r.status != "completed"]
        if failed:
            raise RuntimeError(f"{len(failed)} runs did not complete")
        return runs / elapsed
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        store.close()


def drive_chain(store: Any, agent: Path) -> float:
    """Seconds to drive one run of the chain in this process."""
    from graphrun.runtime.agents import load_agent
    from graphrun.runtime.engine.driver import Driver, RunOptions, drive, start_run

    loaded = load_agent(agent, config_dir=None)
    run_id = start_run(store, loaded, prompt="x")
    start = time.perf_counter()
    outcome = drive(Driver(store, run_id, RunOptions()))
    elapsed = time.perf_counter() - start
    if outcome.status != "completed":
        raise RuntimeError(f"the chain run {outcome.status}: {outcome.error}")
    return elapsed


def append_steps(store: Any, steps: int) -> float:
    """Microseconds per appended node step (three events, one commit)."""
    from tests.conformance.store_contract import started, step

    run_id = f"bench-{time.monotonic_ns()}"
    store.append(run_id, [started()])
    start = time.perf_counter()
    for i in range(steps):
        store.append(run_id, step("a", i + 1, i, "a"))
    return (time.perf_counter() - start) / steps * 1e6


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    mode = mode_of(args)
    report = Report("pg_bench", mode, as_json=args.json)
    runs, chain, appends = {"smoke": (4, 3, 50), "quick": (24, 3, 300), "full": (48, 3, 1000)}[mode]
    sys.path.insert(0, str(ROOT))
    from tests.support.pg import NoPostgres, start_server

    try:
        server = start_server(fsync=True)
    except NoPostgres as exc:
        for name in ("throughput, 2 workers vs 1", "throughput, 4 workers vs 1"):
            report.add(Check(name, 0, ">=", 1, skipped=f"no PostgreSQL server: {exc}"))
        return report.exit_code()
    tmp = Path(tempfile.mkdtemp(prefix="graphrun-pgbench-"))
    agent = tmp / "chain"
    agent.mkdir()
    (agent / "graph.yaml").write_text(chain_graph(chain), encoding="utf-8")
    try:
        # The same asyncio server as parallel_bench (its own process, a few times
        # less CPU per request than the test server), so four workers' calls do not
        # wait on the server: what is measured is the workers and the store.
        from bench.parallel_bench import Server

        with Server() as llm_url:
            os.environ.update(OPENAI_BASE_URL=llm_url, OPENAI_API_KEY="sk-bench")
            env = isolated_env(tmp, OPENAI_BASE_URL=llm_url, OPENAI_API_KEY="sk-bench")
            rates = {w: throughput(server, agent, env, w, runs) for w in (1, 2, 4)}
            report.note(
                f"{runs} runs of {chain} llm steps ({DELAY * 1000:.0f} ms each): "
                + ", ".join(f"{w} worker(s) {r:.2f} runs/s" for w, r in rates.items())
            )
            for workers, target in SCALE_TARGETS.items():
                report.add(
                    Check(
                        f"throughput, {workers} workers vs 1",
                        rates[workers] / rates[1],
                        ">=",
                        target,
                        detail=f"{rates[workers]:.2f} vs {rates[1]:.2f} runs/s",
                    )
                )
            from graphrun.eventstore.postgres import PostgresStore
            from graphrun.eventstore.store import SqliteStore

            sqlite = SqliteStore(tmp / "steps.db")
            pg = PostgresStore(server.new_schema(), max_connections=2)
            try:
                drive_chain(sqlite, agent)  # warm both paths (imports, connections)
                drive_chain(pg, agent)
                rounds = 1 if mode == "smoke" else 5
                lite = min(drive_chain(sqlite, agent) for _ in range(rounds))
                post = min(drive_chain(pg, agent) for _ in range(rounds))
                wait = chain * DELAY
                per_lite = (lite - wait) / chain * 1000
                per_pg = (post - wait) / chain * 1000
                report.note(
                    f"per-step overhead of a driven llm step (minus the {DELAY * 1000:.0f} ms "
                    f"call): SQLite {per_lite:.2f} ms, PostgreSQL {per_pg:.2f} ms "
                    f"(+{per_pg - per_lite:.2f} ms)"
                )
                a_lite = append_steps(sqlite, appends)
                a_pg = append_steps(pg, appends)
                report.note(
                    f"append of one node step (3 events, one commit): SQLite {a_lite:.0f} µs, "
                    f"PostgreSQL {a_pg:.0f} µs ({a_pg / a_lite:.1f}x)"
                )
            finally:
                sqlite.close()
                pg.close()
    finally:
        server.stop()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return report.exit_code()


if __name__ == "__main__":
    sys.exit(main())
