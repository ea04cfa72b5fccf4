"""kill -9 at every event boundary of every example, then ``resume`` until the run ends.

For each graph (every agent in ``examples/``, with its recorded LLM responses, and
``tests/data/crash-markers``, whose every effect appends a line to a marker file):

* an uninterrupted run gives the expected output, event list and event count E;
* for every N in 1..E-1, a fresh ``graphrun run`` (a real subprocess) is watched
  until the log holds N events, then killed with SIGKILL; ``graphrun resume``
  (with the answers the log does not hold yet) runs until the run ends;
* the output equals the uninterrupted run's, every run's seqs are 1..n without a
  gap or duplicate, the events are the uninterrupted run's (plus the resume
  markers; a count join may have counted other branches, which a stalled machine
  can make finish first: then as the log recorded them), ``graphrun audit
  --verify`` passes, and every effect the log held at the kill was not performed
  again (each marker line written once; only the effect in flight at the kill may
  have run twice).

A kill lands a little after the N-th event when the process commits several events
at once; a boundary already passed by an earlier kill is not tried again. Everything
goes through the CLI and the files on disk, so the test holds for any engine that
keeps the command line and the export format.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EXAMPLES = ROOT / "examples"
REPLAYS = ROOT / "replays"
MARKERS = ROOT / "tests" / "data" / "crash-markers"

#: Events a resume adds to a log: not part of the comparison with the uninterrupted run.
RESUME_EVENTS = {"RunResumed", "RunInterrupted"}
#: How long the watched process runs between two looks at its log.
SLICE = 0.001


@dataclass(frozen=True)
class Case:
    """One graph, run the way a user runs it."""

    agent: Path
    prompt: str = ""
    replay: str | None = None
    answers: tuple[tuple[str, str], ...] = ()
    as_user: str | None = None
    agents_dir: str | None = None  # relative to the agent directory
    markers: bool = False

    def flags(self, workdir: Path) -> list[str]:
        out: list[str] = []
        if self.replay:
            out += ["--llm-replay", str(REPLAYS / self.replay)]
        if self.agents_dir:
            out += ["--agents-dir", str(workdir / "agent" / self.agents_dir)]
        if self.as_user:
            out += ["--as", self.as_user]
        return out


CASES = {
    "file-triage": Case(EXAMPLES / "file-triage", replay="file-triage.run.jsonl"),
    "handbook-qa": Case(
        EXAMPLES / "handbook-qa",
        "How many days of annual leave do I get, and how many can I carry over?",
        replay="handbook-qa.run.jsonl",
    ),
    "release-checklist": Case(
        EXAMPLES / "release-checklist",
        "Prepare release 2.4.0",
        replay="release-checklist.run.jsonl",
        answers=(
            # A free-form answer to an approval goes with --other.
            ("review", "other:Not yet: the config rename needs upgrade notes"),
            ("clarify", "add upgrade notes for cache.dir -> cache.path"),
            ("review", "approve"),
        ),
        as_user="alice",
    ),
    "research-desk": Case(
        EXAMPLES / "research-desk",
        "Should we fit an air-source heat pump in our 1950s house in Oslo?",
        replay="research-desk.run.jsonl",
        agents_dir="agents",
    ),
    "ticket-triage": Case(
        EXAMPLES / "ticket-triage",
        "I was charged twice for my Pro plan this month: two payments of 49 USD on March 3, "
        "invoices INV-20931 and INV-20932. Please refund the duplicate charge. "
        "Account: dana@brightpixel.io",
        replay="ticket-triage.run.jsonl",
    ),
    # routes with when, on_error by kind, retry, tool nodes, a count join, a decision,
    # a cache.
    "order-desk": Case(
        EXAMPLES / "order-desk",
        "Hi, I want my money back for order A-1001, the blender arrived broken.",
        replay="order-desk.run.jsonl",
    ),
    # A parallel example (map and fan-out): its branches' events interleave.
    "source-survey": Case(
        EXAMPLES / "source-survey",
        "Should a small bakery switch to an electric oven?",
        replay="source-survey.run.jsonl",
    ),
    "crash-markers": Case(
        MARKERS, "go", answers=(("ask", "Ada"),), agents_dir="agents", markers=True
    ),
}


def test_other_winners_of_a_count_join_are_followed_and_nothing_else() -> None:
    base = [
        sorted(
            [
                ("NodeEntered", "a", "1"),
                ("NodeEntered", "b", "1"),
                ("NodeEntered", "c", "1"),
                ("ToolFinished", "a", "1"),
                ("ToolFinished", "b", "1"),
                ("BranchesJoined", "None", "None"),
            ]
        )
    ]
    joins = [[(["a", "b"], ["c"])]]
    now = [[(["b", "c"], ["a"])]]
    moved = with_winners(base, joins, now)
    assert moved == [
        sorted(
            [
                ("NodeEntered", "b", "1"),
                ("NodeEntered", "c", "1"),
                ("NodeEntered", "a", "1"),
                ("ToolFinished", "b", "1"),
                ("ToolFinished", "c", "1"),
                ("BranchesJoined", "None", "None"),
            ]
        )
    ]
    assert with_winners(base, joins, [[(["a", "d"], ["c"])]]) is None  # another branch
    assert with_winners(base, joins, [[(["a"], ["b", "c"])]]) is None  # another count
    assert with_winners(base, joins, [[]]) is None  # no join recorded


def test_every_example_is_covered() -> None:
    examples = {p.name for p in EXAMPLES.iterdir() if (p / "graph.yaml").is_file()}
    assert examples <= set(CASES)


# -- the command line and the files on disk ----------------------------------------


def env_for(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["GRAPHRUN_DB"] = str(workdir / "events.db")
    env["GRAPHRUN_CONFIG_DIR"] = str(workdir.parent / "config")
    env["GRAPHRUN_NO_TTY"] = "1"
    return env


def cli(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graphrun.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env_for(workdir),
        cwd=workdir,
        stdin=subprocess.DEVNULL,
    )


def event_count(conn: sqlite3.Connection) -> int:
    try:
        (n,) = conn.execute("SELECT count(*) FROM events").fetchone()
    except sqlite3.OperationalError:  # not created yet, or busy
        return 0
    return int(n)


def runs_table(workdir: Path) -> list[tuple[str, str | None, str]]:
    """(run_id, parent_run_id, status) of every run in the database."""
    conn = sqlite3.connect(f"file:{workdir / 'events.db'}?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute("SELECT run_id, parent_run_id, status FROM runs").fetchall()
    finally:
        conn.close()
    return [(str(r), p, str(s)) for r, p, s in rows]


def top_run(workdir: Path) -> tuple[str, str]:
    (top,) = [(r, s) for r, p, s in runs_table(workdir) if p is None]
    return top


def exported(workdir: Path, run_id: str) -> dict[str, list[dict[str, Any]]]:
    """Every event of the run and its child runs, by run id, in seq order."""
    res = cli(workdir, "export", run_id)
    assert res.returncode == 0, res.stderr
    by_run: dict[str, list[dict[str, Any]]] = {}
    for line in res.stdout.splitlines():
        record = json.loads(line)
        event = record.get("event")
        if isinstance(event, dict):
            by_run.setdefault(event["run_id"], []).append(event)
    return by_run


def shape(by_run: dict[str, list[dict[str, Any]]], top: str) -> list[list[tuple[Any, ...]]]:
    """What must not differ from an uninterrupted run: each run's (type, node, visit)s,
    the top run first, the resume markers left out. Sorted: concurrent branches may
    commit in another order from one run to the next."""
    order = [top, *sorted(r for r in by_run if r != top)]
    return [
        sorted(
            (e["type"], str(e.get("node_id")), str(e.get("visit")))
            for e in by_run[r]
            if e["type"] not in RESUME_EVENTS
        )
        for r in order
    ]


def join_winners(
    by_run: dict[str, list[dict[str, Any]]], top: str
) -> list[list[tuple[list[str], list[str]]]]:
    """Each run's joins, in the order of :func:`shape`: the branches each counted and
    the branches it cancelled."""
    order = [top, *sorted(r for r in by_run if r != top)]
    return [
        [
            (sorted(e.get("counted") or []), sorted(e.get("cancelled") or []))
            for e in by_run[r]
            if e["type"] == "BranchesJoined"
        ]
        for r in order
    ]


def with_winners(
    expected: list[list[tuple[Any, ...]]],
    joins: list[list[tuple[list[str], list[str]]]],
    winners: list[list[tuple[list[str], list[str]]]],
) -> list[list[tuple[Any, ...]]] | None:
    """``expected`` with each join's winners as in ``winners``, or None when they
    cannot be the same joins (other branches, other numbers counted or cancelled).

    A count join goes on with the branches that finish first; a machine that stalls
    long enough (a run killed and resumed, a loaded CI host) can change which do,
    and the log records which did. Every other event must still match."""
    out = []
    for events, mine, theirs in zip(expected, joins, winners, strict=True):
        if len(mine) != len(theirs):
            return None
        rename: dict[str, str] = {}
        for (counted, cancelled), (now_counted, now_cancelled) in zip(mine, theirs, strict=True):
            if len(counted) != len(now_counted) or len(cancelled) != len(now_cancelled):
                return None
            if set(counted) | set(cancelled) != set(now_counted) | set(now_cancelled):
                return None
            rename.update(zip(counted, now_counted, strict=True))
            rename.update(zip(cancelled, now_cancelled, strict=True))
        out.append(sorted((kind, rename.get(node, node), visit) for kind, node, visit in events))
    return out


def answers_needed(case: Case, by_run: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The case's answers minus those the log already holds (per node, in order)."""
    held = Counter(
        e["node_id"]
        for events in by_run.values()
        for e in events
        if e["type"] == "HumanInputReceived"
    )
    out = []
    for node, text in case.answers:
        if held[node]:
            held[node] -= 1
        else:
            out += answer_flag(node, text)
    return out


def answer_flag(node: str, text: str) -> list[str]:
    """``--answer NODE=TEXT``, or ``--other NODE=TEXT`` for an ``other:`` answer."""
    if text.startswith("other:"):
        return ["--other", f"{node}={text.removeprefix('other:')}"]
    return ["--answer", f"{node}={text}"]


def completed_output(events: list[dict[str, Any]]) -> str:
    (done,) = [e for e in events if e["type"] == "RunCompleted"]
    return str(done["output"])


def markers(workdir: Path) -> Counter[str]:
    path = workdir / "agent" / "markers.txt"
    if not path.exists():
        return Counter()
    return Counter(path.read_text(encoding="utf-8").splitlines())


def recorded_marks(by_run: dict[str, list[dict[str, Any]]], answer: str) -> set[str]:
    """The marker lines of the script effects the log holds (crash-markers' scripts)."""
    marks: set[str] = set()
    for events in by_run.values():
        for e in events:
            if e["type"] != "ScriptFinished":
                continue
            node, visit = e["node_id"], e["visit"]
            if node == "step":
                marks.add(f"step {visit}")
            elif node == "finish":
                marks.add(f"finish {answer}")
            elif node in ("first", "second"):
                marks.add(f"child {answer} {1 if node == 'first' else 2}")
    return marks


# -- one graph ---------------------------------------------------------------------


@dataclass
class Baseline:
    output: str  # what ``run`` printed
    result: str  # RunCompleted's output in the log
    shape: list[list[tuple[Any, ...]]]
    joins: list[list[tuple[list[str], list[str]]]]
    events: int
    markers: Counter[str] = field(default_factory=Counter)


def prepare(case: Case, workdir: Path) -> None:
    workdir.mkdir(parents=True)
    shutil.copytree(case.agent, workdir / "agent", ignore=shutil.ignore_patterns("markers.txt"))


def run_args(case: Case, workdir: Path) -> list[str]:
    answers = [a for node, text in case.answers for a in answer_flag(node, text)]
    return ["run", str(workdir / "agent"), case.prompt, *case.flags(workdir), *answers]


def baseline(case: Case, workdir: Path) -> Baseline:
    prepare(case, workdir)
    res = cli(workdir, *run_args(case, workdir))
    assert res.returncode == 0, res.stderr
    run_id, status = top_run(workdir)
    assert status == "completed"
    by_run = exported(workdir, run_id)
    return Baseline(
        output=res.stdout,
        result=completed_output(by_run[run_id]),
        shape=shape(by_run, run_id),
        joins=join_winners(by_run, run_id),
        events=sum(len(v) for v in by_run.values()),
        markers=markers(workdir),
    )


@dataclass
class Trial:
    target: int
    killed_at: int = 0
    resumes: int = 0
    problem: str | None = None


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP took effect) or gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] in "TtZX"


def kill_at(case: Case, workdir: Path, target: int) -> int:
    """Start the run, SIGKILL it once the log holds ``target`` events; the count then.

    Once the database exists the process runs in slices of a few milliseconds and is
    stopped (SIGSTOP) between them, so that the count read while it is stopped is the
    count it dies with, and two commits rarely fall into one slice.
    """
    db = workdir / "events.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "graphrun.cli", *run_args(case, workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env_for(workdir),
        cwd=workdir,
    )
    conn: sqlite3.Connection | None = None
    deadline = time.monotonic() + 120
    try:
        while True:
            if conn is None and db.exists():
                conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.05)
            if conn is not None:
                proc.send_signal(signal.SIGSTOP)
                while not stopped(proc.pid):
                    time.sleep(0.0002)
                if event_count(conn) >= target:
                    break
                proc.send_signal(signal.SIGCONT)
            if proc.poll() is not None:
                break  # ended before the target: checked like any other trial
            assert time.monotonic() < deadline, f"no event {target} after 120 s"
            time.sleep(SLICE)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate()
    if proc.returncode != -signal.SIGKILL:
        assert proc.returncode == 0, err
    assert conn is not None, err
    try:
        return event_count(conn)
    finally:
        conn.close()


def trial(case: Case, base: Baseline, workdir: Path, target: int) -> Trial:
    prepare(case, workdir)
    result = Trial(target)
    result.killed_at = kill_at(case, workdir, target)
    run_id, status = top_run(workdir)
    at_kill = exported(workdir, run_id)
    answer = dict(case.answers).get("ask", "")
    before = recorded_marks(at_kill, answer) if case.markers else set()

    output = None
    by_run = at_kill
    while status != "completed":
        result.resumes += 1
        if result.resumes > 4:
            result.problem = f"still {status} after 4 resumes"
            return result
        flags = [*case.flags(workdir), *answers_needed(case, by_run)]
        res = cli(workdir, "resume", run_id, *flags)
        if res.returncode != 0:
            result.problem = f"resume exit {res.returncode}: {res.stderr.strip()[-600:]}"
            return result
        output = res.stdout
        run_id, status = top_run(workdir)
        by_run = exported(workdir, run_id)

    problems = []
    # ``output`` is None when the kill came after the run's end.
    if output is not None and output != base.output:
        problems.append(f"resume printed {output!r}, not {base.output!r}")
    if (logged := completed_output(by_run[run_id])) != base.result:
        problems.append(f"the run's output is {logged!r}, not {base.result!r}")
    for rid, events in by_run.items():
        seqs = [e["seq"] for e in events]
        if seqs != list(range(1, len(seqs) + 1)):
            problems.append(f"run {rid}: seqs {seqs}")
    got = shape(by_run, run_id)
    expected = base.shape
    if got != expected:
        # The same run with other winners of a count join (recorded as they were)?
        expected = with_winners(base.shape, base.joins, join_winners(by_run, run_id)) or expected
    if got != expected:
        problems.append(f"events differ from the uninterrupted run: {got} != {expected}")
    audit = cli(workdir, "audit", run_id, "--verify")
    if audit.returncode != 0:
        problems.append(f"audit --verify exit {audit.returncode}: {audit.stderr.strip()}")
    if case.markers:
        marks = markers(workdir)
        if set(marks) != set(base.markers):
            problems.append(f"markers {sorted(marks)} != {sorted(base.markers)}")
        again = sorted(m for m in before if marks[m] != 1)
        if again:
            problems.append(f"recorded before the kill, performed again: {again}")
        twice = [m for m, n in marks.items() if n > 1]
        if len(twice) > 1 or any(marks[m] > 2 for m in twice):
            problems.append(f"more than the one effect in flight ran twice: {marks}")
    result.problem = "; ".join(problems) or None
    return result


@pytest.mark.parametrize("name", sorted(CASES))
def test_kill_9_at_every_event_boundary_then_resume(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    if not (case.agent / "graph.yaml").is_file():
        pytest.skip(f"no example {case.agent.name} in this checkout")
    base = baseline(case, tmp_path / "baseline")
    assert base.events > 2

    covered: set[int] = set()
    lock = threading.Lock()
    targets = iter(range(1, base.events))

    def next_target() -> int | None:
        with lock:
            for n in targets:
                if n not in covered:
                    return n
        return None

    def worker(_: int) -> list[Trial]:
        done = []
        while (n := next_target()) is not None:
            result = trial(case, base, tmp_path / f"kill-{n}", n)
            with lock:
                covered.update(range(n, result.killed_at + 1))
            done.append(result)
        return done

    workers = max(2, min(4, os.cpu_count() or 2))
    with ThreadPoolExecutor(workers) as pool:
        trials = [t for chunk in pool.map(worker, range(workers)) for t in chunk]

    failed = [f"kill at {t.target} (log: {t.killed_at}): {t.problem}" for t in trials if t.problem]
    assert not failed, "\n".join(failed)
    # Every boundary up to the last event was tried or passed by a kill.
    assert covered >= set(range(1, base.events))
    assert any(t.resumes for t in trials)
    points = sorted({t.killed_at for t in trials})
    print(f"{name}: {len(trials)} kills at {len(points)} boundaries of {base.events}: {points}")
