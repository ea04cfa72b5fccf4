"""graphrun's workers against DBOS Transact's queue: a batch of five-step runs.

The same batch on the same PostgreSQL server (a throw-away one,
tests/support/pg.py, fsync on), through 1 and then 2 worker processes, in one
run of this benchmark:

* graphrun: runs of a graph of five ``llm`` nodes in a row, queued with
  ``submit_run`` (what ``graphrun submit`` does, without a process per run) and
  driven by ``graphrun worker -c C`` processes; every call goes to a local
  OpenAI-protocol server and its request and response are committed before the
  next step.
* DBOS: a ``@DBOS.workflow`` calling a ``@DBOS.step`` five times, each step
  posting the same request to the same server with a bare ``httpx.Client``
  (keep-alive) and returning the answer's text, which DBOS checkpoints before
  the next step; enqueued with ``DBOSClient.enqueue`` on a queue registered with
  ``worker_concurrency=C``, run by worker processes that each ``DBOS.launch()``
  (their own executor id) on the same system database.

Matched on both sides: C runs at once per process, the same poll interval
(``graphrun worker --poll``, the queue's ``polling_interval_sec``), fresh worker
processes per measurement warmed up by a first batch, and durability: every
commit flushed to disk before it returns (graphrun ``GRAPHRUN_DURABILITY=full``,
PostgreSQL's ``synchronous_commit=on``; DBOS sets nothing, so its commits are
flushed too). graphrun at its default durability (``normal``:
``synchronous_commit=off`` except for the commit that ends a run) is measured
beside it and printed, not judged. The timed batch is queued (by one thread of
this process) while the workers are stopped with SIGSTOP, and timed from their
SIGCONT to its last run done: what is timed is the workers draining a full
queue (the time queueing took is printed). Each side has its own schema; every
run's five steps are checked in the database afterwards.

Target: graphrun's runs/s >= 2x DBOS's with the same number of worker
processes (the best of interleaved rounds). CPU seconds per run of the worker
processes and of PostgreSQL's processes are printed too (on a shared machine
they move less than the wall clock), and, from a batch of one-step runs through
one worker, how each side's CPU splits into a cost per run and a cost per step.
SQLite is not measured: ``graphrun worker``
needs a PostgreSQL database (an SQLite file cannot be shared by workers on
several machines), said as a SKIP line.

DBOS is optional (``pip install -e '.[bench]'``); without it the comparison is
skipped, loudly. Usage:
``python bench/dbos_workers_bench.py [--quick | --smoke] [--json] [--concurrency C]``.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Check, Report, graphrun_cmd, isolated_env, mode_of, parse_args

RUNS_TARGET = 2.0
STEPS = 5
#: Runs driven at once by each worker process (both sides), unless ``--concurrency``.
CONCURRENCY = 4
#: Seconds between looks at the queue (both sides).
POLL = 0.02
#: The API key both sides send, shaped like a real one (see parallel_bench).
KEY = "sk-bench-5f3a9c"
MODEL = "gpt-bench"


def chain_graph(steps: int) -> str:
    """A graph of ``steps`` llm nodes in a row, then an end node."""
    return (
        f"name: chain{steps}\n"
        'version: "1.0"\n'
        f"model: openai:{MODEL}\n"
        "start: n0\n"
        "settings:\n"
        "  validate_before_run: false\n"
        "nodes:\n"
        + "".join(
            f'  n{i}:\n    type: llm\n    prompt: "step {i} {{{{initial_prompt}}}}"\n'
            f"    next: {f'n{i + 1}' if i + 1 < steps else 'done'}\n"
            for i in range(steps)
        )
        + '  done:\n    type: end\n    output: "ok"\n'
    )


_DBOS_WORKER = """
import sys
import httpx
from dbos import DBOS

url, schema, llm, key, model, executor, concurrency, poll, steps = sys.argv[1:]
DBOS(config={
    "name": "runs-bench", "system_database_url": url, "dbos_system_schema": schema,
    "executor_id": executor, "log_level": "ERROR",
})
client = httpx.Client(base_url=llm, headers={"authorization": f"Bearer {key}"}, timeout=60)


@DBOS.step()
def call(prompt: str) -> str:
    answer = client.post(
        "/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": prompt}]},
    )
    answer.raise_for_status()
    return answer.json()["choices"][0]["message"]["content"]


@DBOS.workflow()
def five(prompt: str) -> str:
    for i in range(int(steps)):
        call(f"step {i} {prompt}")
    return "ok"


DBOS.launch()
DBOS.register_queue("runs", worker_concurrency=int(concurrency), polling_interval_sec=float(poll))
print("ready", flush=True)
sys.stdin.read()  # until the benchmark closes it
DBOS.destroy()
"""


def _cpu_of(pids: list[int]) -> dict[int, float]:
    """CPU seconds (user + system, every thread) of each live process in ``pids``."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (PostgreSQL's backends)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                found.append(int(entry.name))
    return found


class CpuMeter:
    """CPU seconds spent by the worker processes and the database server's processes."""

    def __init__(self, workers: list[int], postmaster: int) -> None:
        self.workers = workers
        self.postmaster = postmaster

    def sample(self) -> tuple[dict[int, float], dict[int, float]]:
        return _cpu_of(self.workers), _cpu_of([self.postmaster, *_children(self.postmaster)])

    @staticmethod
    def spent(before: dict[int, float], after: dict[int, float]) -> float:
        # A process that started in between counts whole; one that ended, not at all.
        return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


class Batch:
    """One measurement: ``workers`` fresh processes, a warm-up batch, a timed batch."""

    def __init__(
        self, name: str, workers: int, runs: int, postmaster: int, concurrency: int
    ) -> None:
        self.name = name
        self.workers = workers
        self.runs = runs
        self.concurrency = concurrency
        self.postmaster = postmaster
        self.procs: list[subprocess.Popen[Any]] = []

    def measure(self, submit: Callable[[int], None], done: Callable[[], int]) -> dict[str, float]:
        """Runs/s of the timed batch, and CPU seconds per run (workers, database).

        The timed batch is queued while the workers are stopped (SIGSTOP), then
        they go on (SIGCONT) and the clock runs until the last run is done: what
        is timed is the workers draining a queue, not the one thread submitting.
        """
        warm = 2 * self.workers * self.concurrency

        def wait_done(count: int) -> None:
            while done() < count:
                dead = [p.returncode for p in self.procs if p.poll() is not None]
                if dead:
                    raise RuntimeError(f"{self.name}: a worker exited ({dead[0]})")
                time.sleep(0.01)

        submit(warm)  # each process's first imports and connections are not timed
        wait_done(warm)
        for proc in self.procs:
            os.kill(proc.pid, signal.SIGSTOP)
        try:
            start = time.perf_counter()
            submit(self.runs)
            submitted = time.perf_counter() - start
            meter = CpuMeter([p.pid for p in self.procs], self.postmaster)
            workers_before, db_before = meter.sample()
            start = time.perf_counter()
        finally:
            for proc in self.procs:
                os.kill(proc.pid, signal.SIGCONT)
        wait_done(warm + self.runs)
        elapsed = time.perf_counter() - start
        workers_after, db_after = meter.sample()
        return {
            "runs_s": self.runs / elapsed,
            "submit_s": submitted,
            "worker_cpu": meter.spent(workers_before, workers_after) / self.runs,
            "db_cpu": meter.spent(db_before, db_after) / self.runs,
            "warm": warm,
        }

    def close(self, stop: Callable[[subprocess.Popen[Any]], None]) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                stop(proc)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def graphrun_batch(
    server: Any,
    tmp: Path,
    llm_url: str,
    workers: int,
    runs: int,
    durability: str,
    steps: int = STEPS,
    concurrency: int = CONCURRENCY,
) -> dict[str, float]:
    """``workers`` ``graphrun worker`` processes at ``durability`` on a fresh schema."""
    from graphrun.eventstore.postgres import PostgresStore
    from graphrun.runtime.agents import load_agent
    from graphrun.runtime.engine.workers import submit_run

    url = server.new_schema()
    env = isolated_env(
        tmp,
        GRAPHRUN_DB=url,
        GRAPHRUN_DURABILITY=durability,
        OPENAI_BASE_URL=llm_url,
        OPENAI_API_KEY=KEY,
    )
    logs = [tmp / f"worker-{time.monotonic_ns()}-{i}.log" for i in range(workers)]
    cmd = [*graphrun_cmd(), "worker", "-c", str(concurrency), "--poll", str(POLL)]
    batch = Batch(f"graphrun {durability}", workers, runs, server_pid(server), concurrency)
    store = PostgresStore(url, durability=durability, max_connections=2)
    try:
        for log in logs:
            with log.open("wb") as out:
                batch.procs.append(
                    subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
                )
        # Each worker says one line once it is ready to claim.
        _wait_for(lambda: all(b"slot(s)" in log.read_bytes() for log in logs), 60, "workers")
        agent = tmp / f"chain{steps}"
        if not agent.exists():
            agent.mkdir()
            (agent / "graph.yaml").write_text(chain_graph(steps), encoding="utf-8")
        loaded = load_agent(agent, config_dir=None)
        submitted = [0]

        def submit(count: int) -> None:
            for _ in range(count):
                submit_run(
                    store,
                    loaded,
                    prompt=f"r{submitted[0]}",
                    overrides={},
                    as_user="bench",
                    agents_dir=None,
                    config_dir=None,
                )
                submitted[0] += 1

        result = batch.measure(submit, lambda: store.queue_counts().get("done", 0))
        _check_graphrun(store, runs + int(result["warm"]), steps)
        return result
    finally:
        batch.close(lambda proc: proc.send_signal(signal.SIGTERM))
        store.close()


def _check_graphrun(store: Any, total: int, steps: int) -> None:
    """Every run completed, each with its calls answered and recorded."""
    listed = store.runs(limit=total * 2)
    bad = [r.run_id for r in listed if r.status != "completed"]
    if len(listed) != total or bad:
        raise RuntimeError(f"graphrun: {len(listed)} runs of {total}, not completed: {bad[:3]}")
    for run in listed[:: max(1, total // 10)]:
        calls = [e for e in store.read(run.run_id) if type(e).__name__ == "LlmCalled"]
        if len(calls) != steps:
            raise RuntimeError(f"graphrun: run {run.run_id} recorded {len(calls)} calls")


def dbos_batch(
    server: Any,
    tmp: Path,
    llm_url: str,
    workers: int,
    runs: int,
    steps: int = STEPS,
    concurrency: int = CONCURRENCY,
) -> dict[str, float]:
    """``workers`` DBOS processes on the queue, in a fresh system schema."""
    import uuid

    import psycopg
    from dbos import DBOSClient

    schema = "dbos_" + uuid.uuid4().hex[:10]
    url = server.url("dbos_bench").replace("postgresql://", "postgresql+psycopg://", 1)
    batch = Batch("DBOS", workers, runs, server_pid(server), concurrency)
    client: Any = None
    try:
        for i in range(workers):
            batch.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        _DBOS_WORKER,
                        url,
                        schema,
                        llm_url,
                        KEY,
                        MODEL,
                        f"bench-{i}",
                        str(concurrency),
                        str(POLL),
                        str(steps),
                    ],
                    cwd=tmp,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
            # One at a time: the first launch makes the schema the others share.
            assert batch.procs[-1].stdout is not None
            if batch.procs[-1].stdout.readline().strip() != "ready":
                raise RuntimeError(f"a DBOS worker did not start ({batch.procs[-1].wait()})")
        client = DBOSClient(
            system_database_url=url, dbos_system_schema=schema, application_name="runs-bench"
        )
        conn = psycopg.connect(server.url("dbos_bench"), autocommit=True)
        submitted = [0]

        def submit(count: int) -> None:
            for _ in range(count):
                client.enqueue({"queue_name": "runs", "workflow_name": "five"}, f"r{submitted[0]}")
                submitted[0] += 1

        def done() -> int:
            sql = f"SELECT count(*) FROM {schema}.workflow_status WHERE status = 'SUCCESS'"
            row = conn.execute(sql).fetchone()
            return int(row[0]) if row else 0

        try:
            result = batch.measure(submit, done)
            total = runs + int(result["warm"])
            states: dict[str, int] = dict(
                conn.execute(
                    f"SELECT status, count(*) FROM {schema}.workflow_status GROUP BY status"
                ).fetchall()
            )
            done_steps = conn.execute(f"SELECT count(*) FROM {schema}.operation_outputs").fetchone()
            if states != {"SUCCESS": total} or not done_steps or done_steps[0] != total * steps:
                raise RuntimeError(f"DBOS: workflows {states}, steps {done_steps} for {total} runs")
        finally:
            conn.close()
        return result
    finally:

        def stop(proc: subprocess.Popen[Any]) -> None:
            assert proc.stdin is not None
            proc.stdin.close()

        batch.close(stop)
        if client is not None:
            client.destroy()


def _cpu(result: dict[str, float]) -> float:
    """CPU seconds per run, the workers' and PostgreSQL's."""
    return result["worker_cpu"] + result["db_cpu"]


def split(
    report: Report,
    server: Any,
    tmp: Path,
    llm_url: str,
    runs: int,
    cpu: dict[str, float],
    concurrency: int,
) -> None:
    """Where a run's CPU goes: one-step runs through one worker, against the
    ``STEPS``-step ones, give each side's cost per run and per step."""
    one = {
        "full": _cpu(
            graphrun_batch(server, tmp, llm_url, 1, runs, "full", 1, concurrency=concurrency)
        ),
        "dbos": _cpu(dbos_batch(server, tmp, llm_url, 1, runs, 1, concurrency=concurrency)),
    }
    for key, label in (("full", "graphrun full"), ("dbos", "DBOS")):
        per_step = (cpu[key] - one[key]) / (STEPS - 1)
        report.note(
            f"{label}: CPU (workers + PostgreSQL) {one[key] * 1000:.1f} ms per one-step run, "
            f"{cpu[key] * 1000:.1f} ms per {STEPS}-step run: {(one[key] - per_step) * 1000:.1f} "
            f"ms per run + {per_step * 1000:.2f} ms per step"
        )


def server_pid(server: Any) -> int:
    """The postmaster's pid (the first line of its pid file)."""
    return int((server.datadir / "postmaster.pid").read_text().split()[0])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(
        __doc__,
        argv,
        extra=lambda parser: parser.add_argument(
            "--concurrency",
            type=int,
            default=CONCURRENCY,
            metavar="C",
            help=f"runs at once per worker process, both sides (default {CONCURRENCY})",
        ),
    )
    concurrency = args.concurrency
    mode = mode_of(args)
    report = Report("graphrun workers vs DBOS Transact queue", mode, args.json)
    runs, rounds = {"full": (200, 3), "quick": (60, 1), "smoke": (8, 1)}[mode]
    report.add(
        Check(
            "SQLite",
            0,
            ">=",
            RUNS_TARGET,
            skipped="graphrun worker needs a PostgreSQL database (submit and worker refuse "
            "an SQLite file)",
        )
    )
    try:
        import dbos  # noqa: F401
    except ImportError:
        report.add(Check("DBOS", 0, ">=", RUNS_TARGET, skipped="pip install -e '.[bench]'"))
        return report.exit_code()
    from bench.parallel_bench import _SERVER
    from tests.support.pg import NoPostgres, start_server

    try:
        server = start_server(fsync=True)
    except NoPostgres as exc:
        report.add(Check("PostgreSQL", 0, ">=", RUNS_TARGET, skipped=str(exc)))
        return report.exit_code()
    report.note(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    llm = subprocess.Popen(  # answers at once: the steps' own cost is what is compared
        [sys.executable, "-c", _SERVER, "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert llm.stdout is not None
        llm_url = llm.stdout.readline().decode().strip()
        server.psql("CREATE DATABASE dbos_bench")
        sync = server.psql("SHOW synchronous_commit").strip()
        report.note(
            f"{runs} runs of {STEPS} llm steps, {concurrency} at once per worker process, "
            f"poll {POLL}s; PostgreSQL fsync on, synchronous_commit={sync}"
        )
        with tempfile.TemporaryDirectory(prefix="graphrun-dbosw-") as name:
            tmp = Path(name)
            for workers in (1, 2):
                results: dict[str, list[dict[str, float]]] = {"full": [], "normal": [], "dbos": []}
                for _ in range(rounds):
                    for key in ("full", "dbos", "normal"):
                        if key == "dbos":
                            result = dbos_batch(
                                server, tmp, llm_url, workers, runs, concurrency=concurrency
                            )
                        else:
                            result = graphrun_batch(
                                server, tmp, llm_url, workers, runs, key, concurrency=concurrency
                            )
                        results[key].append(result)
                best = {k: max(v, key=lambda r: r["runs_s"]) for k, v in results.items()}
                for key, label in (
                    ("full", "graphrun full"),
                    ("normal", "graphrun normal"),
                    ("dbos", "DBOS"),
                ):
                    r = best[key]
                    each = ", ".join(f"{x['runs_s']:.1f}" for x in results[key])
                    report.note(
                        f"{workers} worker(s), {label}: {r['runs_s']:.1f} runs/s "
                        f"(rounds: {each}); "
                        f"submitting {r['submit_s']:.2f}s; CPU per run: workers "
                        f"{r['worker_cpu'] * 1000:.1f} ms, PostgreSQL {r['db_cpu'] * 1000:.1f} ms"
                    )
                ratio = best["full"]["runs_s"] / best["dbos"]["runs_s"]
                cpu = {k: statistics.median(_cpu(r) for r in v) for k, v in results.items()}
                report.add(
                    Check(
                        f"PostgreSQL, {workers} worker process(es): graphrun vs DBOS runs/s, "
                        "both flushing every commit",
                        ratio,
                        ">=",
                        RUNS_TARGET,
                        detail=f"graphrun {best['full']['runs_s']:.1f} runs/s, DBOS "
                        f"{best['dbos']['runs_s']:.1f} runs/s; graphrun normal "
                        f"{best['normal']['runs_s'] / best['dbos']['runs_s']:.2f}x DBOS; "
                        f"CPU per run (workers + PostgreSQL, median): graphrun "
                        f"{cpu['full'] * 1000:.1f} ms, DBOS {cpu['dbos'] * 1000:.1f} ms "
                        f"({cpu['dbos'] / cpu['full']:.2f}x)",
                    )
                )
                if workers == 1:
                    split(report, server, tmp, llm_url, runs, cpu, concurrency)
    finally:
        assert llm.stdin is not None
        llm.stdin.close()
        llm.wait(10)
        server.stop()
    report.note(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return report.exit_code()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
