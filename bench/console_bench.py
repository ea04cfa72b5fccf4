"""The console's runs list and inbox with 100,000 runs, against `graphrun runs --json`.

A store of N runs (100,000; `--quick` 10,000; `--smoke` 500) is made once and
cached (in ``$GRAPHRUN_BENCH_CACHE``, default a folder in the temp dir): copies
of two real runs of an approval graph, one that waits for alice (every tenth
run) and one that completed. Then, side by side on that database:

* baseline: ``graphrun runs --json`` printing its first 50 runs (a process, as a
  person runs it);
* the console (a ``graphrun serve`` process, already started): the first page
  of ``/runs`` and alice's ``/inbox``, each one HTTP request with her API token.

Target: each page in at most 2x the baseline's time (median of several). The
in-process cost of `runs --json` (no interpreter start-up) is printed as context.
"""

from __future__ import annotations

import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    Check,
    Report,
    graphrun_cmd,
    isolated_env,
    mode_of,
    parse_args,
    run_seconds,
)

SIZES = {"full": 100_000, "quick": 10_000, "smoke": 500}
REPEAT = {"full": 5, "quick": 5, "smoke": 3}
GATE = """\
name: gate
version: "1.0"
start: review
nodes:
  review:
    type: approval
    question: "Ship release {{initial_prompt}}?"
    options: [approve, reject]
    approvers: [alice]
    routes: {approve: done, reject: done}
    on_other: done
  done: {type: end, output: "shipped"}
"""
CACHE = (
    Path(os.environ["GRAPHRUN_BENCH_CACHE"]) / "console"
    if os.environ.get("GRAPHRUN_BENCH_CACHE")
    else Path(tempfile.gettempdir()) / "graphrun-console-bench"
)


def make_store(runs: int) -> Path:
    """A database with ``runs`` runs (cached between invocations)."""
    import msgspec

    from graphrun.eventstore import codec
    from graphrun.eventstore.ids import new_run_id
    from graphrun.eventstore.store import SqliteStore

    db = CACHE / f"runs-{runs}.db"
    if db.exists():
        return db
    CACHE.mkdir(parents=True, exist_ok=True)
    work = CACHE / f"make-{runs}"
    work.mkdir(exist_ok=True)
    (work / "gate").mkdir(exist_ok=True)
    (work / "gate" / "graph.yaml").write_text(GATE)
    seed = work / "seed.db"
    env = isolated_env(work, GRAPHRUN_DB=str(seed))
    cmd = graphrun_cmd()
    subprocess.run([*cmd, "run", "gate", "v1"], env=env, cwd=work, capture_output=True)
    done = subprocess.run(
        [*cmd, "run", "gate", "v2", "--answer", "review=approve", "--as", "alice"],
        env=env,
        cwd=work,
        capture_output=True,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr.decode())
    source = SqliteStore(seed)
    rows = source.runs(limit=2)
    templates = {r.status: (r, source.read(r.run_id)) for r in rows}
    source.close()
    partial = db.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    SqliteStore(partial).close()  # the schema, made by the store itself
    # Then rows written in large transactions, each run's events encoded and
    # chained as the store does (verified below): appending 100,000 runs one
    # transaction each would take minutes.
    conn = sqlite3.connect(partial, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("BEGIN")
    replace = msgspec.structs.replace
    for n in range(runs):
        row, events = templates["waiting" if n % 10 == 0 else "completed"]
        run_id = str(new_run_id())
        prev = codec.GENESIS
        base = (n + 1) << 32
        params = []
        for event in events:
            body = codec.encode(replace(event, run_id=run_id))
            prev = codec.chain_hash(prev, body)
            params.append((base + event.seq, body.decode("utf-8"), prev))
        conn.executemany("INSERT INTO events (id, body, hash) VALUES (?, ?, ?)", params)
        conn.execute(
            "INSERT INTO run_heads (run_id, run_no, graph_name, status, parent_run_id, "
            "started_at, started_by, agent_dir, waiting_node, output, error) "
            "VALUES (?, ?, ?, ?, NULL, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                n + 1,
                row.graph_name,
                row.status,
                row.started_at,
                row.started_by,
                row.agent_dir,
                row.waiting_node,
                row.output,
                row.error,
            ),
        )
        if n % 10_000 == 9_999:
            conn.execute("COMMIT")
            conn.execute("BEGIN")
    conn.execute("COMMIT")
    conn.close()
    check = SqliteStore(partial)
    for row in check.runs(limit=3):
        check.require_intact(row.run_id)  # the chain verifies, as the store reads it
    check.close()
    partial.rename(db)
    return db


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    mode = mode_of(args)
    runs, repeat = SIZES[mode], REPEAT[mode]
    report = Report("console_bench", mode=mode, as_json=args.json)
    started = time.perf_counter()
    db = make_store(runs)
    report.note(f"store of {runs:,} runs ready in {time.perf_counter() - started:.1f} s ({db})")
    import httpx

    with tempfile.TemporaryDirectory(prefix="graphrun-bench-") as name:
        tmp = Path(name)
        env = isolated_env(tmp, GRAPHRUN_DB=str(db))
        cmd = graphrun_cmd()
        token_out = subprocess.run(
            [*cmd, "serve", "--no-serve", "--port", "0", "--token", "alice"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        token = token_out.rsplit(": ", 1)[1].strip()
        server = subprocess.Popen(
            [*cmd, "serve", "--port", "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert server.stdout is not None
            line = server.stdout.readline()
            found = re.search(r"(http://\S+?)/ ", line)
            if found is None:
                raise RuntimeError(f"graphrun serve printed {line!r}")
            url = found.group(1)
            client = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60)

            def page(path: str) -> float:
                start = time.perf_counter()
                response = client.get(url + path)
                elapsed = time.perf_counter() - start
                response.raise_for_status()
                return elapsed

            def cli() -> float:
                return run_seconds([*cmd, "runs", "--json", "--limit", "50"], env=env)

            page("/runs")  # warm: the first request imports the page code
            page("/inbox")
            base, listed, inbox = [], [], []
            for _ in range(repeat):  # side by side, interleaved
                base.append(cli())
                listed.append(page("/runs"))
                inbox.append(page("/inbox"))
            shown = client.get(url + "/inbox").text.count('class="wait"')
            client.close()
        finally:
            server.terminate()
            server.wait(timeout=10)
    b = statistics.median(base)
    for label, times in (("runs page", listed), ("inbox", inbox)):
        t = statistics.median(times)
        report.add(
            Check(
                f"{label} with {runs:,} runs / `runs --json` first 50",
                t / b,
                "<=",
                2.0,
                detail=f"{t * 1000:.0f} ms vs {b * 1000:.0f} ms",
            )
        )
    report.note(f"the inbox showed {shown} waiting runs (a page of at most 50)")
    report.note(f"whole benchmark: {time.perf_counter() - started:.1f} s")
    return report.exit_code()


if __name__ == "__main__":
    sys.exit(main())
