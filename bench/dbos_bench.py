"""graphrun against DBOS Transact: a durable 200-step sequential chain, one run.

The same chain on the same databases, in one run of this benchmark:

* graphrun: a graph of 200 ``llm`` nodes in a row, every response served from
  its recorded run (``llm_replay``: no network), each step's events committed
  before the next step starts; driven in this process, one store and one parsed
  graph, a new run per timing.
* DBOS: a ``@DBOS.workflow`` calling a trivial ``@DBOS.step`` 200 times (each
  step's output checkpointed in the system database before the next); one
  launched DBOS in its own process (DBOS is one per process), a new workflow per
  timing.

On one SQLite file's folder (each side its own file) and on one PostgreSQL
server (a throw-away one, tests/support/pg.py, fsync on; each side its own
schema). graphrun at its default durability (``normal``: SQLite
``synchronous=NORMAL``, PostgreSQL ``synchronous_commit=off``) and at ``full``
(every commit flushed), which is DBOS's (its defaults flush every commit);
the ratio judged is at ``full``, matched durability. Target: graphrun's step
>= 3x cheaper than DBOS's (time per step, best of interleaved rounds). The load
average is printed with the figures.

Batches of runs through 1 and 2 worker processes (graphrun's workers against
DBOS's queue): bench/dbos_workers_bench.py.

DBOS is optional (``pip install -e '.[bench]'``); without it the comparison is
skipped, loudly. Usage: ``python bench/dbos_bench.py [--quick | --smoke] [--json]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, Check, Report, mode_of, parse_args, timed
from bench.llm_bench import FakeServer, recorded_calls, run_chain, write_chain

STEP_TARGET = 3.0

_DBOS_CHAIN = """
import json, sys, time
from dbos import DBOS

url, steps, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
DBOS(config={"name": "chain-bench", "system_database_url": url, "log_level": "ERROR"})


@DBOS.step()
def step(i: int) -> str:
    return f"ok {i}"


@DBOS.workflow()
def chain(n: int) -> str:
    for i in range(n):
        step(i)
    return "ok"


DBOS.launch()
chain(steps)  # warm-up: the first workflow's set-up is not the steady state
for _ in range(rounds):
    sys.stdin.readline()  # one round when told: rounds interleave with graphrun's
    start = time.perf_counter()
    assert chain(steps) == "ok"
    print(json.dumps(time.perf_counter() - start), flush=True)
DBOS.destroy()
"""


class DbosChain:
    """A DBOS process that times one chain per :meth:`round`."""

    def __init__(self, url: str, steps: int, rounds: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _DBOS_CHAIN, url, str(steps), str(rounds)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def round(self) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the DBOS chain process ended ({self.proc.wait()})")
        return float(json.loads(line))

    def close(self) -> None:
        try:
            self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def graphrun_chain(store: Any, agent_dir: Path, recorded: list[Any]) -> Any:
    from graphrun.runtime.engine.driver import Driver, RunOptions, drive, start_run
    from graphrun.runtime.graph.loader import load_graph

    loaded = load_graph(agent_dir)

    def one() -> None:
        run_id = start_run(store, loaded)
        options = RunOptions(agents_dir=agent_dir.parent, llm_replay=recorded)
        outcome = drive(Driver(store, run_id, options))
        if outcome.status != "completed":
            raise RuntimeError(f"chain run {run_id} ended {outcome.status}: {outcome.error}")

    return one


def compare(
    report: Report,
    kind: str,
    stores: dict[str, Any],
    dbos_url: str,
    agent_dir: Path,
    recorded: list[Any],
    steps: int,
    rounds: int,
) -> None:
    runs = {name: graphrun_chain(store, agent_dir, recorded) for name, store in stores.items()}
    for one in runs.values():
        one()  # warm-up
    dbos = DbosChain(dbos_url, steps, rounds)
    times: dict[str, list[float]] = {name: [] for name in (*runs, "dbos")}
    try:
        for _ in range(rounds):
            for name, one in runs.items():
                times[name].append(timed(one))
            times["dbos"].append(dbos.round())
    finally:
        dbos.close()
    best = {name: min(values) / steps * 1e6 for name, values in times.items()}
    report.note(
        f"{kind}: µs per durable step: graphrun normal {best['normal']:.0f}, "
        f"graphrun full {best['full']:.0f}, DBOS {best['dbos']:.0f} "
        f"(DBOS / graphrun normal: {best['dbos'] / best['normal']:.2f}x)"
    )
    report.add(
        Check(
            f"{kind}: graphrun vs DBOS per durable step, both flushing every commit",
            best["dbos"] / best["full"],
            ">=",
            STEP_TARGET,
            detail=f"graphrun {best['full']:.0f} µs/step, DBOS {best['dbos']:.0f} µs/step, "
            f"{steps} steps, best of {rounds} interleaved rounds",
        )
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    mode = mode_of(args)
    report = Report("graphrun vs DBOS Transact", mode, args.json)
    steps, rounds = {"full": (200, 5), "quick": (50, 3), "smoke": (10, 1)}[mode]
    try:
        import dbos  # noqa: F401
    except ImportError:
        report.add(Check("DBOS", 0, ">=", STEP_TARGET, skipped="pip install -e '.[bench]'"))
        return report.exit_code()
    from graphrun.eventstore.postgres import PostgresStore
    from graphrun.eventstore.store import SqliteStore
    from tests.support.pg import NoPostgres, start_server

    report.note(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    saved = {k: os.environ.get(k) for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY")}
    try:
        with tempfile.TemporaryDirectory(prefix="graphrun-dbos-") as name:
            tmp = Path(name)
            agent_dir = write_chain(tmp / "chain", steps)
            with FakeServer() as url:
                os.environ["OPENAI_BASE_URL"] = url
                os.environ["OPENAI_API_KEY"] = "sk-bench"
                run_id = run_chain(tmp / "record.db", agent_dir)
            recorded = recorded_calls(tmp / "record.db", run_id)
            os.environ["OPENAI_BASE_URL"] = "http://127.0.0.1:9/v1"  # replay: never dialled
            sqlite = {
                d: SqliteStore(tmp / f"graphrun-{d}.db", durability=d) for d in ("normal", "full")
            }
            try:
                compare(
                    report,
                    "SQLite",
                    sqlite,
                    f"sqlite:///{tmp / 'dbos.sqlite'}",
                    agent_dir,
                    recorded,
                    steps,
                    rounds,
                )
            finally:
                for store in sqlite.values():
                    store.close()
            try:
                server = start_server(fsync=True)
            except NoPostgres as exc:
                report.add(Check("PostgreSQL", 0, ">=", STEP_TARGET, skipped=str(exc)))
            else:
                try:
                    server.psql("CREATE DATABASE dbos_bench")
                    dbos_url = server.url("dbos_bench").replace(
                        "postgresql://", "postgresql+psycopg://", 1
                    )
                    pg = {
                        d: PostgresStore(server.new_schema(), durability=d, max_connections=4)
                        for d in ("normal", "full")
                    }
                    try:
                        compare(
                            report, "PostgreSQL", pg, dbos_url, agent_dir, recorded, steps, rounds
                        )
                    finally:
                        for store in pg.values():
                            store.close()
                finally:
                    server.stop()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    report.note(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return report.exit_code()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
