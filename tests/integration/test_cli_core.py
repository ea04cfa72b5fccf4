"""The CLI contract with the real ``graphrun`` command in a subprocess.

Result on stdout, narration and diagnostics on stderr; exit 0 completed, 1 failed,
2 invalid graph / bad input; every error one line, never a traceback, and nothing
already in the database changed.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

LOOP = """
    name: counter
    version: "1.0"
    start: step
    initial_state:
      n: 0
    nodes:
      step:
        type: script
        script: scripts/step.py
        state_updates:
          last: "visit {{n}}"
      done:
        type: end
        output: "n={{n}} prompt={{initial_prompt}}"
"""
STEP = {
    "scripts/step.py": """
        import json, os
        with open("ran.txt", "a") as fh:
            fh.write("x")
        n = json.loads(os.environ["GRAPH_STATE"])["n"] + 1
        print(json.dumps({"n": n, "_next": "done" if n == 3 else "step"}))
    """
}


def one_error_line(stderr: str) -> str:
    """The single ``error:`` line of a failed command (and nothing like a traceback)."""
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record_run(db: Path, root: Path) -> str:
    """A completed run in ``db``, made through the library (faster than the CLI)."""
    from graphrun.eventstore.store import SqliteStore
    from graphrun.runtime.engine.driver import Driver, drive, start_run
    from graphrun.runtime.graph.loader import load_graph

    store = SqliteStore(db)
    try:
        run_id = start_run(store, load_graph(root), prompt="x")
        assert drive(Driver(store, run_id)).status == "completed"
    finally:
        store.close()
    return run_id


# --- validate ----------------------------------------------------------------------


def test_validate_prints_rule_node_and_line_and_exits_2(graphrun: Any, agent: Any) -> None:
    agent(
        """
        name: bad
        version: "1.0"
        start: review
        nodes:
          review:
            type: approval
            question: ok?
            options: ["yes", "no"]
            routes:
              "yes": done
              "maybe": done
            on_other: clarify
          done:
            type: end
        """,
        name="bad",
    )
    result = graphrun("validate", "bad")
    assert result.code == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: bad/graph.yaml:8 ($.nodes.review.options[1]): approval 'review': option 'no' "
        "has no routes entry (add routes: {'no': <node>})",
        "error: bad/graph.yaml:12 ($.nodes.review.on_other): node 'review': on_other points to "
        "unknown node 'clarify'",
        "warning: bad/graph.yaml:11 ($.nodes.review.routes.maybe): approval 'review': routes "
        "entry 'maybe' matches no option",
        "invalid: 2 error(s), 1 warning(s)",
    ]


@pytest.mark.parametrize(
    ("graph", "files", "expected"),
    [
        (
            'name: g\nversion: "1.0"\nstart: a\nnodes:\n  a: {type: script, script: s/a.py, '
            "next: b}\n  b: {type: script, script: s/a.py, next: a}\n  e: {type: end}\n",
            {"s/a.py": ""},
            "error: g/graph.yaml:6 ($.nodes.b): cycle in static edges: a -> b -> a "
            "(static cycles are always errors; loop with a script's _next instead)",
        ),
        (
            'name: g\nversion: "1.0"\nstart: a\nnodes:\n  a: {type: script, script: s/gone.py}\n',
            {},
            "error: g/graph.yaml:4 ($.nodes): the graph has no end node, so it could never "
            "finish (add a node with type: end)",
        ),
        (
            'name: g\nversion: "1.0"\nstart: a\nnodes:\n  a: {type: llm, promt: hi, next: e}\n'
            "  e: {type: end}\n",
            {},
            "error: g/graph.yaml:5 ($.nodes.a): llm node 'a' is missing the required field "
            "'prompt' ('promt' is written instead: rename it to 'prompt')",
        ),
        (
            "name: g\nversion: [\n",
            {},
            "error: g/graph.yaml:3: malformed YAML: did not find expected node content",
        ),
        (
            'name: g\nversion: "1.0"\nstart: a\nnodes:\n  a: {type: rag, next: e}\n'
            "  e: {type: end}\n",
            {},
            "error: g/graph.yaml:5 ($.nodes.a): rag node 'a' has no documents (at least one "
            "knowledge source is required)",
        ),
    ],
    ids=["cycle", "no-end", "unknown-field", "malformed", "rag-no-documents"],
)
def test_validate_errors(
    graphrun: Any, agent: Any, graph: str, files: dict[str, str], expected: str
) -> None:
    agent(graph, files, name="g")
    result = graphrun("validate", "g")
    assert result.code == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[0] == expected


def test_unknown_fields_warn_and_strict_makes_them_errors(graphrun: Any, agent: Any) -> None:
    agent('name: g\nversion: "1.0"\nstart: a\nnodes:\n  a: {type: end, outptu: x}\n', name="g")
    result = graphrun("validate", "g")
    assert result.code == 0
    assert result.stderr.splitlines() == [
        "warning: g/graph.yaml:5 ($.nodes.a.outptu): unknown field 'outptu' in end node 'a' "
        "(ignored) (did you mean 'output'?)",
        "valid: 0 error(s), 1 warning(s)",
    ]
    strict = graphrun("validate", "g", "--strict")
    assert strict.code == 2
    assert strict.stderr.splitlines()[0].startswith(
        "error: g/graph.yaml:5 ($.nodes.a.outptu): unknown field 'outptu'"
    )


def test_validate_warnings_only_exit_0(graphrun: Any, agent: Any) -> None:
    agent(LOOP, STEP, name="loop")
    result = graphrun("validate", "loop")
    assert result.code == 0
    assert result.stderr.splitlines() == [
        "warning: loop/graph.yaml:3 ($.start): no end node is reachable from 'step' via static "
        "edges (fine if a script routes there with _next)",
        "warning: loop/graph.yaml:12 ($.nodes.done): node 'done' is unreachable from 'step' via "
        "static edges (fine if a script routes there with _next)",
        "valid: 0 error(s), 2 warning(s)",
    ]
    agent(
        'name: g\nversion: "1.0"\nstart: r\nnodes:\n  r: {type: rag, documents: [k/], '
        "next: e}\n  e: {type: end}\n",
        name="rag",
    )
    result = graphrun("validate", "rag")
    assert result.code == 0
    assert result.stderr.splitlines()[0] == (
        "warning: rag/graph.yaml:5 ($.nodes.r): rag node 'r' has no state_updates: its result "
        "goes nowhere"
    )


# --- bad input: one line, exit 2, nothing changed --------------------------------------


@pytest.mark.parametrize(
    ("graph", "files", "message"),
    [
        (
            "name: g\nnodes: {a: [\n",
            {},
            "error: g/graph.yaml:3: malformed YAML: did not find expected node content",
        ),
        (
            'name: g\nversion: "1.0"\nstart: a\nnodes:\n  a: {type: ned, output: x}\n',
            {},
            "error: g/graph.yaml:5 ($.nodes.a.type): node 'a' has unknown type 'ned' "
            "(did you mean 'end'?)",
        ),
        (
            'name: g\nversion: "1.0"\nstart: a\nsettings: {timeout: soon}\nnodes:\n'
            "  a: {type: end}\n",
            {},
            "error: g/graph.yaml:4 ($.settings.timeout): expected float | null, got str",
        ),
        (
            'name: g\nversion: "1.0"\nstart: a\nnodes:\n  a: {type: script, script: s.py, '
            "next: e}\n  e: {type: end}\n",
            {},
            "error: g/graph.yaml:5 ($.nodes.a.script): script file 's.py' does not exist in {root}",
        ),
    ],
    ids=["malformed", "unknown-field", "wrong-type", "missing-script"],
)
def test_bad_graphs_leave_the_database_alone(
    graphrun: Any, agent: Any, graph: str, files: dict[str, str], message: str
) -> None:
    record_run(graphrun.db, agent(LOOP, STEP, name="good"))
    before = digest(graphrun.db)
    root = agent(graph, files, name="g")
    result = graphrun("run", "g", "hello")
    assert result.code == 2
    assert one_error_line(result.stderr) == message.format(root=root.resolve())
    assert result.stdout == ""
    assert digest(graphrun.db) == before
    assert len(graphrun("runs", "--json").json_lines()) == 1


@pytest.mark.parametrize("kind", ["random", "foreign"])
def test_corrupt_or_foreign_database(graphrun: Any, agent: Any, tmp_path: Path, kind: str) -> None:
    db = tmp_path / "other.db"
    if kind == "random":
        db.write_bytes(bytes((i * 7919) % 251 for i in range(8192)))
        expected = f"error: {db} is not a usable graphrun database: file is not a database"
    else:
        conn = sqlite3.connect(db)
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('mine')")
        conn.commit()
        conn.close()
        expected = f"error: {db} is an SQLite database of something else (tables: notes)"
    before = digest(db)
    root = agent(LOOP, STEP)
    for command in (("run", str(root)), ("show", "r1"), ("resume", "r1")):
        result = graphrun(*command, "--db", str(db))
        assert result.code == 2, command
        assert one_error_line(result.stderr) == (
            f"{expected} (point --db at a graphrun event database)"
        )
        assert digest(db) == before
    assert not (root / "ran.txt").exists()


def test_unknown_run_id(graphrun: Any, agent: Any) -> None:
    record_run(graphrun.db, agent(LOOP, STEP))
    before = digest(graphrun.db)
    for command in (
        ("show", "nope"),
        ("events", "nope"),
        ("resume", "nope"),
        ("replay", "nope"),
        ("audit", "nope", "--verify"),
    ):
        result = graphrun(*command)
        assert result.code == 2, command
        assert one_error_line(result.stderr) == (
            f"error: no run 'nope' in {graphrun.db} (`graphrun runs` lists the runs)"
        )
        assert digest(graphrun.db) == before


def test_bad_flags_are_usage_errors(graphrun: Any, agent: Any) -> None:
    root = agent(LOOP, STEP)
    result = graphrun("run", str(root), "--set", "novalue")
    assert result.code == 2
    assert one_error_line(result.stderr) == "error: --set expects KEY=VALUE, got 'novalue'"
    result = graphrun("run", "no/such/agent")
    assert result.code == 2
    assert one_error_line(result.stderr).startswith("error: no agent 'no/such/agent'")


# --- running ------------------------------------------------------------------------


def test_set_prompt_and_json_output(graphrun: Any, agent: Any) -> None:
    root = agent(
        """
        name: seeds
        version: "1.0"
        start: e
        initial_state:
          a: 1
          b: kept
          initial_prompt: overwritten
        nodes:
          e:
            type: end
            output: "{{a}}|{{b}}|{{c.k[1]}}|{{s}}|{{q}}|{{empty}}|{{initial_prompt}}"
        """
    )
    result = graphrun(
        "run",
        str(root),
        "the prompt",
        "--json",
        "--set",
        "a=5",
        "--set",
        'c={"k": [1, true]}',
        "--set",
        "s=hello world",
        "--set",
        'q="7"',
        "--set",
        "empty=",
    )
    assert result.code == 0, result.stderr
    data = result.json()
    assert data == {
        "run_id": data["run_id"],
        "status": "completed",  # type: ignore[index]
        "output": "5|kept|true|hello world|7||the prompt",
        "error": None,
    }
    assert result.stderr == ""  # --json: no narration
    state = graphrun("show", data["run_id"], "--json").json()["state"]  # type: ignore[index]
    assert state == {
        "a": 5,
        "b": "kept",
        "c": {"k": [1, True]},
        "s": "hello world",
        "q": "7",
        "empty": "",
        "initial_prompt": "the prompt",
    }


def test_failed_run_json_and_exit_1(graphrun: Any, agent: Any) -> None:
    root = agent('name: f\nversion: "1.0"\nstart: e\nnodes:\n  e: {type: end, output: "{{x}}"}\n')
    result = graphrun("run", str(root), "--json")
    assert result.code == 1
    data = result.json()
    assert data["status"] == "failed"  # type: ignore[index]
    assert data["error"] == (  # type: ignore[index]
        "node 'e': {{x}} in e.output: 'x' is not in state (state has: initial_prompt)"
    )
    result = graphrun("run", str(root))
    assert result.code == 1
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1].endswith(
        "failed: node 'e': {{x}} in e.output: 'x' is not in state (state has: initial_prompt)"
    )
    assert "Traceback" not in result.stderr


def test_narration_and_performance_summary(graphrun: Any, agent: Any) -> None:
    root = agent(LOOP, STEP, name="narrated")
    result = graphrun("run", str(root), "hi", GRAPHRUN_LOG="info")
    assert result.code == 0
    assert result.stdout == "n=3 prompt=hi\n"
    lines = result.stderr.splitlines()
    assert lines[-1] == f"▸ run {graphrun.last_run()} completed"
    narration = [line for line in lines[:-1] if line.startswith("▸")]
    assert narration[:-1] == [
        "▸ graph: counter (start: step)",
        "▸ step (script)",
        "▸ step -> step",
        "▸ step (script)",
        "▸ step -> step",
        "▸ step (script)",
        "▸ step -> done",
        "▸ done (end)",
    ]
    assert re.fullmatch(r"▸ graph done in \d+\.\d\ds", narration[-1])
    info = [line for line in result.stderr.splitlines() if line.startswith("INFO")]
    assert "INFO [graph:counter] performance summary (slowest first):" in info
    summary = info[info.index("INFO [graph:counter] performance summary (slowest first):") + 1 :]
    assert re.fullmatch(
        r"INFO \[graph:counter\] step: 3 visit\(s\), total \d+ms, avg \d+ms, max \d+ms", summary[0]
    )
    assert re.fullmatch(
        r"INFO \[graph:counter\] done: 1 visit\(s\), total \d+ms, avg \d+ms, "
        r"max \d+ms",
        summary[1],
    )
    # Without GRAPHRUN_LOG there is narration but no summary.
    quiet = graphrun("run", str(root), "hi")
    assert "performance summary" not in quiet.stderr
    assert "▸ graph: counter (start: step)" in quiet.stderr


# --- the log: events, show --at, replay, audit ----------------------------------------


def test_events_show_replay_and_audit(graphrun: Any, agent: Any) -> None:
    root = agent(LOOP, STEP)
    assert graphrun("run", str(root), "p").code == 0
    run_id = graphrun.last_run()
    events = graphrun("events", run_id, "--json").json_lines()
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))  # type: ignore[index]
    assert {e["run_id"] for e in events} == {run_id}  # type: ignore[index]
    assert events[0]["type"] == "RunStarted" and events[-1]["type"] == "RunCompleted"  # type: ignore[index]
    # show --at N is the state after event N.
    first_done = next(e for e in events if e["type"] == "NodeCompleted")  # type: ignore[index]
    shown = graphrun("show", run_id, "--at", str(first_done["seq"]), "--json").json()  # type: ignore[index]
    assert shown["state"] == {"n": 1, "last": "visit 1", "initial_prompt": "p"}  # type: ignore[index]
    assert shown["status"] == "running" and shown["at_seq"] == first_done["seq"]  # type: ignore[index]
    assert graphrun("show", run_id, "--at", "1", "--json").json()["state"] == {  # type: ignore[index]
        "n": 0,
        "initial_prompt": "p",
    }
    final = graphrun("show", run_id, "--json").json()
    assert final["status"] == "completed" and final["state"]["n"] == 3  # type: ignore[index]
    # replay decides everything again and runs nothing.
    ran = (root / "ran.txt").read_text()
    assert ran == "xxx"
    before = digest(graphrun.db)
    replay = graphrun("replay", run_id)
    assert replay.code == 0, replay.stderr
    assert (root / "ran.txt").read_text() == ran
    assert digest(graphrun.db) == before
    audit = graphrun("audit", run_id, "--verify")
    assert audit.code == 0
    assert f"ok: run {run_id}: {len(events)} events verify" in audit.stderr


def tamper(db: Path, run_id: str, seq: int, old: str, new: str) -> None:
    conn = sqlite3.connect(db)
    (body,) = conn.execute(
        "SELECT body FROM run_events WHERE run_id = ? AND seq = ?", (run_id, seq)
    ).fetchone()
    assert old in body
    conn.execute(
        "UPDATE events SET body = ? "
        "WHERE id = (SELECT id FROM run_events WHERE run_id = ? AND seq = ?)",
        (body.replace(old, new, 1), run_id, seq),
    )
    conn.commit()
    conn.close()


def test_one_changed_byte_is_found_by_audit_verify(graphrun: Any, agent: Any) -> None:
    root = agent(LOOP, STEP)
    assert graphrun("run", str(root)).code == 0
    run_id = graphrun.last_run()
    events = graphrun("events", run_id, "--json").json_lines()
    seq = next(e["seq"] for e in events if e["type"] == "ScriptFinished" and e["visit"] == 2)  # type: ignore[index]
    tamper(graphrun.db, run_id, seq, '"n":2', '"n":3')
    audit = graphrun("audit", run_id, "--verify")
    assert audit.code == 1
    assert "Traceback" not in audit.stderr
    assert (
        f"BROKEN: run {run_id}: first bad seq {seq}: hash does not match the event's "
        "content (modified?)"
    ) in audit.stderr
    # Replay does not pass a run whose recorded outcome was changed.
    replay = graphrun("replay", run_id)
    assert replay.code == 1
    assert "Traceback" not in replay.stderr
    assert f"DIVERGED: run {run_id}" in replay.stdout + replay.stderr


def test_replay_reports_a_broken_chain(graphrun: Any, agent: Any) -> None:
    root = agent(LOOP, STEP)
    assert graphrun("run", str(root)).code == 0
    run_id = graphrun.last_run()
    tamper(graphrun.db, run_id, 3, '"duration_ms":', '"duration_ms":1')
    replay = graphrun("replay", run_id)
    assert replay.code == 1
    assert "diverged at seq 3" in replay.stdout
    assert "the stored log does not verify" in replay.stdout


# --- events record changes, never whole states ----------------------------------------


GROW = """
    name: grow
    version: "1.0"
    start: step
    settings:
      max_loop_iterations: 1000
    nodes:
      step:
        type: script
        script: scripts/grow.sh
      done:
        type: end
        output: "grown"
"""


def test_database_grows_linearly_with_visits(agent: Any, tmp_path: Path) -> None:
    from graphrun.eventstore.fold import fold
    from graphrun.eventstore.store import SqliteStore
    from graphrun.runtime.engine.driver import Driver, drive, start_run
    from graphrun.runtime.graph.loader import load_graph

    logged: dict[int, int] = {}
    files: dict[int, int] = {}
    for visits in (100, 200):
        root = agent(
            GROW,
            {
                "scripts/grow.sh": f"""
            n=$(( $(cat count 2>/dev/null || echo 0) + 1 ))
            echo $n > count
            next=step; [ $n -ge {visits} ] && next=done
            printf '{{"k%d": "%01024d", "_next": "%s"}}' $n 0 $next
        """
            },
        )
        db = tmp_path / f"grow{visits}.db"
        store = SqliteStore(db)
        run_id = start_run(store, load_graph(root))
        assert drive(Driver(store, run_id)).status == "completed"
        state = fold(store.read(run_id)).state
        assert len(state) == visits + 1  # every visit's kilobyte is in the state
        (logged[visits],) = store.conn.execute(
            "SELECT sum(length(body)) FROM run_events WHERE run_id = ?", (run_id,)
        ).fetchone()
        store.close()
        files[visits] = db.stat().st_size
    # Linear: doubling the visits doubles the log (whole states would quadruple it), and
    # each visit costs its kilobyte plus a bounded envelope.
    assert 1.8 < logged[200] / logged[100] < 2.2, logged
    assert logged[200] < 200 * (1024 + 1024), logged
    assert files[200] < 2.6 * files[100], files


def test_runs_lists_a_page_at_a_time(graphrun: Any, agent: Any) -> None:
    root = agent(LOOP, STEP, name="paged")
    made = [record_run(graphrun.db, root) for _ in range(3)]
    first = graphrun("runs", "--limit", "2")
    assert first.code == 0, first.stderr
    listed = [line.split()[0] for line in first.stdout.splitlines()[1:]]
    assert listed == made[::-1][:2]
    assert "(older runs: --offset 2)" in first.stderr
    rest = graphrun("runs", "--limit", "2", "--offset", "2", "--json")
    assert [r["run_id"] for r in rest.json_lines()] == made[:1]
    assert graphrun("runs", "--offset", "3").stdout.count("\n") <= 1
    bad = graphrun("runs", "--offset", "-1")
    assert bad.code == 2 and "Traceback" not in bad.stderr
