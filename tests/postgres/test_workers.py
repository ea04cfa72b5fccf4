"""Workers on a real PostgreSQL server: submit, claim, kill -9, approve, SIGTERM, migrate.

Real processes throughout: ``graphrun worker`` subprocesses, a real PostgreSQL
(tests/support/pg.py), LLM calls served with a delay by the fake OpenAI server,
and script nodes that leave marker files, so an effect performed twice shows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import write_agent
from tests.support.fake_llm import text
from tests.support.pg import PgServer, pg_server, pg_url  # noqa: F401  (fixtures)

pytest.importorskip("psycopg")

ROOT = Path(__file__).resolve().parents[2]

MARK = """
    import json, os, sys
    if "GRAPH_STATE_FILE" in os.environ:
        state = json.load(open(os.environ["GRAPH_STATE_FILE"]))
    else:
        state = json.loads(os.environ["GRAPH_STATE"])
    name = os.path.basename(sys.argv[0]).removesuffix(".py")
    with open(os.path.join(os.environ["MARKERS"], state["initial_prompt"]), "a") as f:
        f.write(name + "\\n")
    print(json.dumps({name: True}))
"""

STEPS = """
    name: steps
    version: "1.0"
    model: openai:gpt-test
    start: one
    nodes:
      one:
        type: llm
        prompt: "{{initial_prompt}} step one"
        state_updates:
          first: "{{output}}"
        next: mark_a
      mark_a:
        type: script
        script: mark_a.py
        next: two
      two:
        type: llm
        prompt: "{{initial_prompt}} step two"
        state_updates:
          second: "{{output}}"
        next: mark_b
      mark_b:
        type: script
        script: mark_b.py
        next: done
      done:
        type: end
        output: "{{initial_prompt}}: {{first}} / {{second}}"
"""

GATED = """
    name: gated
    version: "1.0"
    start: mark_a
    nodes:
      mark_a:
        type: script
        script: mark_a.py
        next: gate
      gate:
        type: approval
        question: "Ship {{initial_prompt}}?"
        options: [ship, hold]
        routes:
          ship: mark_b
          hold: stopped
        on_other: stopped
      mark_b:
        type: script
        script: mark_b.py
        next: shipped
      shipped:
        type: end
        output: "shipped {{initial_prompt}}"
      stopped:
        type: end
        output: "stopped"
"""


@pytest.fixture
def setup(tmp_path: Path, pg_url: str, fake_llm: Any) -> Iterator[dict[str, Any]]:  # noqa: F811
    markers = tmp_path / "markers"
    markers.mkdir()
    files = {"mark_a.py": MARK, "mark_b.py": MARK}
    env = dict(os.environ)
    env.update(
        GRAPHRUN_DB=pg_url,
        OPENAI_BASE_URL=fake_llm.url_openai,
        OPENAI_API_KEY="sk-test",
        MARKERS=str(markers),
        PYTHONFAULTHANDLER="1",
    )
    procs: list[subprocess.Popen[str]] = []
    ctx = {
        "tmp": tmp_path,
        "url": pg_url,
        "markers": markers,
        "env": env,
        "steps": write_agent(tmp_path / "steps", STEPS, files),
        "gated": write_agent(tmp_path / "gated", GATED, files),
        "procs": procs,
        "logs": [],
    }
    yield ctx
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    for log in ctx["logs"]:
        log.close()


def cli(ctx: dict[str, Any], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graphrun.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ctx["env"],
        cwd=ctx["tmp"],
    )


def worker(ctx: dict[str, Any], *args: str) -> subprocess.Popen[str]:
    log = open(ctx["tmp"] / f"worker-{len(ctx['procs'])}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "graphrun.cli", "worker", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=ctx["env"],
        cwd=ctx["tmp"],
    )
    ctx["procs"].append(proc)
    ctx["logs"].append(log)
    return proc


def worker_logs(ctx: dict[str, Any]) -> str:
    """The workers' output, for a failure message."""
    for log in ctx["logs"]:
        log.flush()
    return "\n".join(
        f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(ctx["tmp"].glob("worker-*.log"))
    )


def store_of(ctx: dict[str, Any]) -> Any:
    from graphrun.eventstore.postgres import PostgresStore

    return PostgresStore(ctx["url"], max_connections=2)


def submit_many(ctx: dict[str, Any], agent: Path, jobs: list[str]) -> dict[str, str]:
    """Queue runs through the function ``graphrun submit`` calls (a process per
    run would only measure Python start-up); returns job -> run id."""
    from graphrun.runtime.agents import load_agent
    from graphrun.runtime.engine.workers import submit_run

    loaded = load_agent(agent, config_dir=None)
    with store_of(ctx) as store:
        return {
            job: submit_run(
                store,
                loaded,
                prompt=job,
                overrides={},
                as_user="tester",
                agents_dir=None,
                config_dir=None,
            )
            for job in jobs
        }


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def markers(ctx: dict[str, Any]) -> dict[str, Counter[str]]:
    return {p.name: Counter(p.read_text().split()) for p in ctx["markers"].iterdir() if p.is_file()}


def slow_echo(delay: float) -> Callable[[Any], Any]:
    def reply(request: Any) -> Any:
        prompt = request.body["messages"][-1]["content"]
        return text(f"ok({prompt.split()[-1]})", delay=delay)

    return reply


@pytest.mark.timeout(400)
def test_three_workers_sixty_runs_and_a_kill_9(setup: dict[str, Any], fake_llm: Any) -> None:
    ctx = setup
    fake_llm.default = slow_echo(0.05)
    # One run submitted by the command itself, the rest by the function it calls.
    first = cli(ctx, "submit", str(ctx["steps"]), "job-00")
    assert first.returncode == 0, first.stderr
    first_id = first.stdout.strip()
    ids = {
        "job-00": first_id,
        **submit_many(ctx, ctx["steps"], [f"job-{i:02d}" for i in range(1, 60)]),
    }
    assert len(set(ids.values())) == 60
    workers = [worker(ctx, "--concurrency", "2", "--lease", "3") for _ in range(3)]
    store = store_of(ctx)
    victim = workers[0]

    def victim_busy() -> list[str]:
        with store.pool.connection() as conn:
            rows = conn.execute(
                "SELECT run_id FROM run_queue WHERE state = 'running' AND worker LIKE %s",
                (f"%:{victim.pid}:%",),
            ).fetchall()
        return [r[0] for r in rows]

    # Kill the first worker while it drives a run, once some runs have made marks.
    # It is stopped first, so that the runs it holds are known exactly when it dies.
    in_flight: list[str] = []
    while not in_flight:
        wait_for(lambda: len(markers(ctx)) >= 6 and bool(victim_busy()), 120, "progress")
        os.kill(victim.pid, signal.SIGSTOP)
        # A statement the worker sent just before it stopped still commits (a run it
        # hands back as done): let it land before reading what the worker holds.
        time.sleep(0.5)
        in_flight = victim_busy()
        if not in_flight:  # it had just finished one: let it claim the next
            os.kill(victim.pid, signal.SIGCONT)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(10)
    wait_for(lambda: store.queue_counts().get("done", 0) == 60, 240, "all 60 runs")
    for proc in workers[1:]:
        proc.send_signal(signal.SIGTERM)
    codes = [p.wait(60) for p in workers[1:]]
    assert codes == [0, 0], worker_logs(ctx)

    rows = {r.run_id: r for r in store.runs(limit=100)}
    assert {rows[i].status for i in ids.values()} == {"completed"}
    marks = markers(ctx)
    calls = Counter(r.body["messages"][-1]["content"] for r in fake_llm.requests)
    for job, run_id in ids.items():
        events = store.read(run_id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert store.verify(run_id) is None
        assert [type(e).__name__ for e in events].count("RunCompleted") == 1
        assert events[-1].output == f"{job}: ok(one) / ok(two)"  # type: ignore[attr-defined]
        recorded = Counter(
            e.node_id  # type: ignore[attr-defined]
            for e in events
            if type(e).__name__ == "ScriptFinished"
        )
        assert recorded == Counter({"mark_a": 1, "mark_b": 1}), run_id
        llm = {s: calls[f"{job} step {s}"] for s in ("one", "two")}
        if run_id in in_flight:
            # The killed worker's effect in flight may have happened before its
            # result was recorded: it is performed again, at most once more.
            assert set(marks[job].values()) <= {1, 2} and set(llm.values()) <= {1, 2}
        else:
            # Every effect performed exactly once.
            assert marks[job] == Counter({"mark_a": 1, "mark_b": 1}), job
            assert llm == {"one": 1, "two": 1}, job
    # The runs the killed worker held were taken over and finished by the others,
    # from their logs; every other run was claimed once.
    for run_id in ids.values():
        queued = store.queued(run_id)
        assert queued is not None and queued["state"] == "done"
        assert (queued["attempts"] >= 2) == (run_id in in_flight), run_id
    for run_id in in_flight:
        resumed = [e for e in store.read(run_id) if type(e).__name__ == "RunResumed"]
        assert all(e.pid != victim.pid for e in resumed)  # type: ignore[attr-defined]
        audit = cli(ctx, "audit", run_id, "--verify")
        assert audit.returncode == 0, audit.stderr
    store.close()


@pytest.mark.timeout(200)
def test_a_run_waiting_for_approval_frees_its_worker(setup: dict[str, Any], fake_llm: Any) -> None:
    ctx = setup
    fake_llm.default = slow_echo(0.05)
    gated = cli(ctx, "submit", str(ctx["gated"]), "v1")
    assert gated.returncode == 0, gated.stderr
    run_id = gated.stdout.strip()
    one = worker(ctx, "--concurrency", "1")
    store = store_of(ctx)
    wait_for(lambda: store.run(run_id).status == "waiting", 60, "the approval")
    # The one slot goes on with other runs while the first waits.
    others = submit_many(ctx, ctx["steps"], ["other-1", "other-2"])
    wait_for(
        lambda: all(store.run(r).status == "completed" for r in others.values()),
        60,
        "the other runs",
    )
    assert store.queued(run_id)["state"] == "waiting"  # type: ignore[index]
    assert not store.is_live(run_id)
    # Another shell approves: the answer is appended, the run queued, nothing driven.
    approved = cli(ctx, "approve", run_id, "ship", "--as", "ann")
    assert approved.returncode == 0, approved.stderr
    assert f"run {run_id} is queued for a worker" in approved.stderr
    wait_for(lambda: store.run(run_id).status == "completed", 60, "the approved run")
    events = store.read(run_id)
    received = [e for e in events if type(e).__name__ == "HumanInputReceived"]
    assert [(e.answer, e.by) for e in received] == [("ship", "ann")]  # type: ignore[attr-defined]
    resumed = [e for e in events if type(e).__name__ == "RunResumed"]
    assert [e.pid for e in resumed] == [one.pid]  # type: ignore[attr-defined]
    assert events[-1].output == "shipped v1"  # type: ignore[attr-defined]
    assert markers(ctx)["v1"] == Counter({"mark_a": 1, "mark_b": 1})
    one.send_signal(signal.SIGTERM)
    assert one.wait(30) == 0
    store.close()


@pytest.mark.timeout(200)
def test_sigterm_lets_the_run_in_flight_finish(setup: dict[str, Any], fake_llm: Any) -> None:
    ctx = setup
    fake_llm.default = slow_echo(1.5)
    (run_id,) = submit_many(ctx, ctx["steps"], ["slow"]).values()
    proc = worker(ctx)
    store = store_of(ctx)
    wait_for(lambda: store.run(run_id).current_node == "one", 60, "the first step")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    assert store.run(run_id).status == "completed"
    assert store.queued(run_id)["state"] == "done"  # type: ignore[index]
    store.close()


@pytest.mark.timeout(200)
def test_sigterm_after_the_grace_time_hands_the_run_back(
    setup: dict[str, Any], fake_llm: Any
) -> None:
    ctx = setup
    fake_llm.default = slow_echo(3.0)
    (run_id,) = submit_many(ctx, ctx["steps"], ["handed"]).values()
    first = worker(ctx, "--grace", "0")
    store = store_of(ctx)
    wait_for(lambda: store.run(run_id).current_node == "one", 60, "the first step")
    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 0
    assert store.queued(run_id)["state"] == "queued"  # type: ignore[index]
    assert store.lease(run_id) is None
    fake_llm.default = slow_echo(0.05)
    second = worker(ctx, "--once")
    assert second.wait(60) == 0
    assert store.run(run_id).status == "completed"
    assert store.verify(run_id) is None
    store.close()


def test_submit_and_worker_refuse_an_sqlite_file(setup: dict[str, Any]) -> None:
    ctx = setup
    ctx["env"]["GRAPHRUN_DB"] = str(ctx["tmp"] / "local.db")
    for args in (("submit", str(ctx["steps"]), "x"), ("worker", "--once")):
        result = cli(ctx, *args)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "need a shared PostgreSQL database" in lines[0]


def test_migrate_copies_runs_both_ways_with_their_chains(
    setup: dict[str, Any],
    pg_server: PgServer,  # noqa: F811
) -> None:
    ctx = setup
    sqlite = ctx["tmp"] / "laptop.db"
    env = {**ctx["env"], "GRAPHRUN_DB": str(sqlite)}
    ran = subprocess.run(
        [sys.executable, "-m", "graphrun.cli", "run", str(ctx["gated"]), "m1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ctx["tmp"],
        timeout=60,
    )
    assert ran.returncode == 3, ran.stderr  # waits at the approval
    from graphrun.eventstore.store import SqliteStore

    with SqliteStore(sqlite) as local:
        (row,) = local.runs()
        before = list(local.raw_rows(row.run_id))
    up = cli(ctx, "migrate", "--from", str(sqlite), "--to", ctx["url"])
    assert up.returncode == 0, up.stderr
    assert "copied 1 run(s)" in up.stderr
    again = cli(ctx, "migrate", "--from", str(sqlite), "--to", ctx["url"])
    assert "copied 0 run(s), 1 already there" in again.stderr
    with store_of(ctx) as store:
        assert [r[3] for r in store.raw_rows(row.run_id)] == [r[3] for r in before]
        assert store.verify(row.run_id) is None
    # The copied run goes on in PostgreSQL, then comes back to a new laptop file.
    approve = cli(ctx, "approve", row.run_id, "ship", "--as", "ann")
    assert approve.returncode == 0, approve.stderr
    audit = cli(ctx, "audit", row.run_id, "--verify")
    assert audit.returncode == 0, audit.stderr
    back = ctx["tmp"] / "back.db"
    down = cli(ctx, "migrate", "--from", ctx["url"], "--to", str(back))
    assert down.returncode == 0, down.stderr
    with store_of(ctx) as store, SqliteStore(back) as home:
        assert list(home.raw_rows(row.run_id)) == list(store.raw_rows(row.run_id))
        assert home.run(row.run_id).status == "completed"
    missing = cli(ctx, "migrate", "--from", str(ctx["tmp"] / "nope.db"), "--to", ctx["url"])
    assert missing.returncode == 2 and "no event database" in missing.stderr
    json.dumps(before[0][2])  # rows are plain data
