"""Workers when something fails: a worker killed on a host the others cannot see,
the database stopped and started again under running workers.

Real processes throughout: ``graphrun worker`` subprocesses (one in its own PID
and UTS namespaces, with its own host name, so that no other worker can look at
its pid), a real PostgreSQL server stopped with ``pg_ctl stop -m immediate``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.postgres.test_workers import (  # noqa: F401  (fixtures)
    markers,
    setup,
    slow_echo,
    store_of,
    submit_many,
    wait_for,
    worker,
    worker_logs,
)
from tests.support.pg import PgServer, start_server

pytest.importorskip("psycopg")


@pytest.fixture(scope="module")
def own_server() -> Iterator[PgServer]:
    """A server of this module's own: its tests stop and start it."""
    server = start_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(own_server: PgServer) -> str:
    return own_server.new_schema()


PEER_HOST = "peer-host"


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--uts", "true"], capture_output=True, check=False
    )
    return probe.returncode == 0


def peer_worker(ctx: dict[str, Any], *args: str) -> tuple[subprocess.Popen[str], int]:
    """A worker on "another host": its own PID namespace (its pid means nothing
    here) and host name. Returns the ``unshare`` process and the worker's pid as
    this namespace sees it."""
    log = open(ctx["tmp"] / f"worker-{len(ctx['procs'])}.log", "w")  # noqa: SIM115
    command = " ".join([sys.executable, "-m", "graphrun.cli", "worker", *args])
    proc = subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            "--uts",
            "--kill-child",
            "sh",
            "-c",
            f"hostname {PEER_HOST} && exec {command}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=ctx["env"],
        cwd=ctx["tmp"],
    )
    ctx["procs"].append(proc)
    ctx["logs"].append(log)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    wait_for(lambda: children.read_text().strip() != "", 30, "the peer worker's process")
    return proc, int(children.read_text().split()[0])


@pytest.mark.timeout(300)
@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare (PID/UTS namespaces)")
def test_a_worker_killed_on_another_host_is_taken_over_in_seconds(
    setup: dict[str, Any],  # noqa: F811
    fake_llm: Any,
) -> None:
    """kill -9 of a worker whose pid the survivor cannot see: its runs are taken
    over as soon as PostgreSQL sees its connection go, not when the 60 s lease
    expires; nothing recorded is performed again."""
    ctx = setup
    fake_llm.default = slow_echo(0.4)
    ids = submit_many(ctx, ctx["steps"], ["far-1", "far-2"])
    peer, peer_pid = peer_worker(ctx, "--concurrency", "2", "--lease", "60")
    store = store_of(ctx)

    def held_by_peer() -> set[str]:
        with store.pool.connection() as conn:
            rows = conn.execute(
                "SELECT l.run_id FROM leases l JOIN run_queue q ON q.run_id = l.run_id "
                "WHERE q.state = 'running' AND l.host = %s",
                (PEER_HOST,),
            ).fetchall()
        return {r[0] for r in rows}

    wait_for(lambda: held_by_peer() == set(ids.values()), 60, "the peer's claims")
    survivor = worker(ctx, "--concurrency", "2", "--lease", "60")
    wait_for(lambda: "slot(s) on" in (ctx["tmp"] / "worker-1.log").read_text(), 60, "survivor")
    wait_for(lambda: all(markers(ctx).get(j) for j in ids), 60, "a first step of each run")
    assert all(store.is_live(r) for r in ids.values())
    os.kill(peer_pid, signal.SIGKILL)
    killed = time.time()
    peer.wait(10)
    wait_for(lambda: store.queue_counts().get("done", 0) == 2, 40, "the taken-over runs")
    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(60) == 0, worker_logs(ctx)
    log = worker_logs(ctx)
    calls = Counter(r.body["messages"][-1]["content"] for r in fake_llm.requests)
    marks = markers(ctx)
    for job, run_id in ids.items():
        events = store.read(run_id)
        assert store.verify(run_id) is None
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert events[-1].output == f"{job}: ok(one) / ok(two)"  # type: ignore[attr-defined]
        resumed = [e for e in events if type(e).__name__ == "RunResumed"]
        assert resumed and resumed[-1].pid == survivor.pid  # type: ignore[attr-defined]
        took = events[-1].ts - killed
        # Far from the lease: the run ended within seconds of the kill.
        assert took < 10, f"{run_id} ended {took:.1f}s after the kill\n{log}"
        # Nothing recorded was performed again: each recorded step once; the one
        # in flight at the kill at most twice.
        recorded = Counter(
            e.node_id  # type: ignore[attr-defined]
            for e in events
            if type(e).__name__ in ("ScriptFinished", "LlmResult")
        )
        assert all(n == 1 for n in recorded.values()), recorded
        assert set(marks[job].values()) <= {1, 2}
        assert (
            sum(v - 1 for v in marks[job].values())
            + sum(calls[f"{job} step {s}"] - 1 for s in ("one", "two"))
            <= 1
        ), (marks[job], calls)
    assert "took over run" in log
    store.close()


@pytest.mark.timeout(300)
def test_workers_through_a_database_restart(
    setup: dict[str, Any],  # noqa: F811
    fake_llm: Any,
    own_server: PgServer,
) -> None:
    """The database stops (immediate) under two busy workers and comes back: each
    worker says once that it is away and once that it is back (no raw pool log
    lines), hands back the runs it could not hand back meanwhile as soon as it
    can (not after their 30 s leases), and every run completes exactly once."""
    ctx = setup
    fake_llm.default = slow_echo(0.8)
    ids = submit_many(ctx, ctx["steps"], [f"out-{i}" for i in range(6)])
    workers = [worker(ctx, "--concurrency", "2", "--lease", "30") for _ in range(2)]
    store = store_of(ctx)
    wait_for(lambda: len(markers(ctx)) >= 2, 60, "runs under way")
    store.close()
    own_server.halt()
    time.sleep(6)
    own_server.start()
    back = time.monotonic()
    store = store_of(ctx)
    wait_for(lambda: store.queue_counts().get("done", 0) == 6, 120, "every run")
    drained = time.monotonic() - back
    for proc in workers:
        proc.send_signal(signal.SIGTERM)
    assert [p.wait(60) for p in workers] == [0, 0], worker_logs(ctx)
    logs = [p.read_text() for p in sorted(ctx["tmp"].glob("worker-*.log"))]
    everything = "\n".join(logs)
    # Not held up by leases: a run that could not be handed back is as soon as
    # the database answers again (30 s leases would hold the queue for 30 s).
    assert drained < 25, f"the queue drained {drained:.1f}s after the restart\n{everything}"
    for log in logs:
        assert log.count("database unreachable") <= 1, log
        assert log.count("database is back") == log.count("database unreachable"), log
        assert "lease lost" not in log, log
        for line in log.splitlines():
            # Every line is the worker's own (▸ …): no raw log line of the pool,
            # no traceback.
            assert line.startswith("▸ "), line
    assert "database unreachable" in everything and "database is back" in everything
    calls = Counter(r.body["messages"][-1]["content"] for r in fake_llm.requests)
    for job, run_id in ids.items():
        events = store.read(run_id)
        assert store.verify(run_id) is None
        assert [type(e).__name__ for e in events].count("RunCompleted") == 1, (
            [type(e).__name__ for e in events],
            store.queue_counts(),
            everything,
        )
        assert events[-1].output == f"{job}: ok(one) / ok(two)"  # type: ignore[attr-defined]
        recorded = Counter(
            e.node_id  # type: ignore[attr-defined]
            for e in events
            if type(e).__name__ in ("ScriptFinished", "LlmResult")
        )
        assert all(n == 1 for n in recorded.values()), recorded
        assert all(calls[f"{job} step {s}"] <= 2 for s in ("one", "two"))
        queued = store.queued(run_id)
        assert queued is not None and queued["state"] == "done"
    store.close()
