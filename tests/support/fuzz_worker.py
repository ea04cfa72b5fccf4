"""A fuzzing worker: hypothesis-generated graph.yaml files and command lines, each
given to graphrun's real entry point (``graphrun.cli.main``) in this process.

Run by ``tests/integration/test_fuzz_inputs.py`` as a subprocess (so that its peak
memory is measured on its own)::

    python -m tests.support.fuzz_worker graphs N WORKDIR
    python -m tests.support.fuzz_worker cli N WORKDIR
    python -m tests.support.fuzz_worker stored N WORKDIR

``stored`` damages every stored column (each event's body and hash and key, every
column of ``run_heads``, ``leases`` and ``cancel_requests``) in every way a damaged
or hand-edited file can (bytes that are not UTF-8, a BLOB, a number, NULL, text that
is not JSON, JSON of the wrong shape), then gives every command the damaged run:
``runs`` still lists the others (exit 0), and nothing exits 70. ``N`` bounds how
many commands each damage meets besides ``runs`` and ``show``.

Every case must end with an exit code other than 70 (internal error) and without a
traceback, within ``CASE_SECONDS``. The worker prints one JSON line: the number of
cases, the exit codes seen, and the failures (stops at the first).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

#: A case that takes longer than this is a hang.
CASE_SECONDS = 30

BASE = """\
name: fuzz
version: "1.0"
start: ask
initial_state:
  n: 0
nodes:
  ask:
    type: input
    question: "Name?"
    default: "x"
    state_updates:
      name: "{{input}}"
    next: gate
  gate:
    type: approval
    question: "Ok {{name}}?"
    options: [approve, reject]
    routes:
      approve: done
      reject: done
    on_other: done
    approvers: [alice]
  done:
    type: end
    output: "{{name}} {{n}}"
"""

# Pieces of YAML that have broken loaders: tags, anchors, aliases, merges, odd
# scalars, control characters, deep or wide collections.
FRAGMENTS = [
    "!!binary aGVsbG8=",
    "!!timestamp 2026-11-20",
    "2026-11-20 10:00:00",
    "!!int abc",
    "!!float x",
    "!!set {a, b}",
    "!!omap [a: 1]",
    "!!pairs [a: 1]",
    "!!python/object:os.system x",
    "!!python/name:os.system",
    "!foo bar",
    "!!str 1",
    "!!null x",
    "!!bool maybe",
    "&a [1, 2]",
    "*a",
    "*undefined",
    "<<: *a",
    "{<<: {x: 1}}",
    ".nan",
    "-.inf",
    "1e999",
    "0x1F",
    "0o17",
    "1_000",
    "9" * 5000,
    '"\\0"',
    '"\\x00\\x01"',
    '"\\ud800"',
    "'\u2028'",
    "\x00",
    "\x07",
    "\t",
    "\ufeff",
    "? [a, b]\n: c",
    "? {a: b}\n: c",
    "---",
    "...",
    "%YAML 1.1",
    "%TAG ! tag:yaml.org,2002:",
    "|",
    ">-",
    "{{",
    "}}",
    "{{initial_prompt}}",
    "{{a.b.c.d}}",
    "{{_error.message}}",
    "[" * 200 + "]" * 200,
    "{a: " * 80 + "1" + "}" * 80,
    "[" + ", ".join(["x"] * 3000) + "]",
    "a" * 70_000,
    "é" * 300,
    "../../../../etc/passwd",
    "/" + "x" * 300,
]

NODE_TYPES = ["llm", "script", "agent", "approval", "input", "rag", "end", "map", "nope", None]
FIELDS = [
    "type", "next", "prompt", "instructions", "script", "agent", "question", "options",
    "routes", "on_other", "approvers", "default", "validation", "documents", "query",
    "top_k", "output", "state_updates", "fallback", "timeout", "max_attempts", "tools",
    "model", "output_schema", "status", "description", "id", "unknown",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["{{name}}", "{{output}}", "done", "ask", "gate", "scripts/x.py", "../x"]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def structured_graphs(draw: Any) -> str:
    """Graph-shaped data with random node types and fields, dumped as YAML."""
    import yaml

    nodes = {}
    for _ in range(draw(st.integers(0, 4))):
        node: dict[str, Any] = {}
        kind = draw(st.sampled_from(NODE_TYPES))
        if kind is not None:
            node["type"] = kind
        for name in draw(st.lists(st.sampled_from(FIELDS), max_size=5)):
            node[name] = draw(values)
        nodes[draw(st.text(min_size=1, max_size=12))] = node
    graph: dict[str, Any] = {
        "name": draw(st.text(max_size=10) | st.just("g")),
        "version": draw(st.sampled_from(["1.0", 1.0, "2", None])),
        "start": draw(st.sampled_from([*nodes, "nowhere"]) if nodes else st.just("x")),
        "nodes": nodes,
    }
    if draw(st.booleans()):
        graph["settings"] = draw(values)
    if draw(st.booleans()):
        graph["initial_state"] = draw(values)
    return yaml.safe_dump(graph, allow_unicode=draw(st.booleans()))


@st.composite
def mutated_graphs(draw: Any) -> str:
    """The base graph with fragments spliced in at random lines and columns."""
    lines = BASE.splitlines()
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(lines)))
        fragment = draw(st.sampled_from(FRAGMENTS) | st.text(max_size=20))
        how = draw(st.sampled_from(["value", "line", "key", "replace"]))
        if how == "value" and at < len(lines) and ":" in lines[at]:
            key = lines[at].split(":", 1)[0]
            lines[at] = f"{key}: {fragment}"
        elif how == "key":
            indent = draw(st.sampled_from(["", "  ", "    "]))
            lines.insert(at, f"{indent}{fragment}: {draw(st.sampled_from(FRAGMENTS))}")
        elif how == "replace" and at < len(lines):
            lines[at] = fragment
        else:
            lines.insert(at, fragment)
    return "\n".join(lines) + "\n"


graph_texts = st.one_of(
    mutated_graphs(), structured_graphs(), st.text(max_size=200), st.sampled_from(FRAGMENTS)
)


def _all_commands() -> list[str]:
    from graphrun.cli import COMMANDS as known

    # Workers and submit need PostgreSQL; given an SQLite --db they refuse at once.
    # `serve` runs a web server until stopped: its command lines are fuzzed with
    # --no-serve (command_lines), up to the point where it would start listening.
    return list(known)


COMMANDS = _all_commands()
FLAGS = [
    "--set", "--answer", "--as", "--llm-replay", "--agents-dir", "--config-dir",
    "--loki-dir", "--json", "--node", "--at", "--verify", "--anchor", "-o", "--status",
    "--limit", "--reason", "--graph", "--live", "-q", "--help", "--version", "--bogus", "--",
]  # fmt: skip


def _safe(value: str) -> str:
    """No absolute paths or climbing out of the work folder: the worker runs as the
    user running the tests and some commands write where they are told."""
    return value.replace("/", "_").replace("\\", "_")


#: Argument texts: odd characters, invalid UTF-8 (as Python decodes it: lone
#: surrogates), deep JSON, long names, and names of things that exist.
arg_texts = st.one_of(
    st.text(max_size=30).map(_safe),
    st.binary(max_size=20).map(lambda b: _safe(os.fsdecode(b))),
    st.sampled_from(
        [
            "agent",
            "waiting",
            "missing",
            "a" * 300,
            "x" * 5000,
            "@last",
            "0",
            "-1",
            "99999999999999999999",
            "\udcff",
            "\ud800",
            "\x00",
            "",
            # JSON escapes of half a surrogate pair: valid arguments, but not text
            # once --set / --answer parse them as JSON.
            '"\\ud800"',
            '["\\udfff", 1]',
            '{"\\ud83d": "x"}',
            '"a\\udc00b"',
        ]
    ),
    st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 200).map(lambda n: '{"a":' * n + "1" + "}" * n),
)


#: The id of a run that waits at its approval gate (set before fuzzing).
WAITING: list[str] = ["none"]

#: Arguments that name things that exist, so that commands get past their first check.
meaningful = st.one_of(
    st.sampled_from(["agent", "waiting", "agent/graph.yaml", "1", "approve", "v=1", "ask=x"]),
    st.builds(lambda: WAITING[0]),
)


def options_of(command: str) -> list[str]:
    """The options a command takes (from its click definition)."""
    import click

    from graphrun.cli import cli

    found = cli.get_command(click.Context(cli), command)
    if found is None:
        return []
    return [o for p in found.params for o in p.opts if o.startswith("-")]


@st.composite
def command_lines(draw: Any) -> list[str]:
    """Mostly real commands with their own options and values that exist, mixed
    with hostile texts; now and then nonsense."""
    if draw(st.integers(0, 9)) == 0:
        argv = [draw(arg_texts)]
    else:
        argv = [draw(st.sampled_from(COMMANDS))]
    own = options_of(argv[0]) or FLAGS
    for _ in range(draw(st.integers(0, 2))):
        argv.append(draw(meaningful) if draw(st.booleans()) else draw(arg_texts))
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            flag = draw(st.sampled_from(own) if draw(st.integers(0, 4)) else st.sampled_from(FLAGS))
            argv.append(flag)
            if flag in ("--set", "--answer"):
                key = draw(st.sampled_from(["v", "ask", "gate", "", "n"]) | arg_texts)
                argv.append(f"{key}={draw(arg_texts)}")
                continue
        argv.append(draw(meaningful) if draw(st.booleans()) else draw(arg_texts))
    if argv[0] == "serve":
        argv.insert(1, "--no-serve")
    return argv


# -- running cases ---------------------------------------------------------------


class Hang(Exception):
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise Hang(f"no answer after {CASE_SECONDS} s")


def call(argv: list[str]) -> tuple[int, str]:
    """graphrun's entry point on ``argv``: the exit code and stderr."""
    import pykka

    from graphrun.cli import main

    err, out = io.StringIO(), io.StringIO()
    code: Any = 0
    signal.alarm(CASE_SECONDS)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                main(argv)
            except SystemExit as exc:
                code = exc.code
    finally:
        signal.alarm(0)
        pykka.ActorRegistry.stop_all(block=True, timeout=10)
    if code is None:
        code = 0
    elif not isinstance(code, int):
        err.write(str(code))
        code = 1
    return code, err.getvalue()


def check(argv: list[str], codes: Counter[int]) -> None:
    code, stderr = call(argv)
    codes[code] += 1
    if os.environ.get("GRAPHRUN_FUZZ_VERBOSE"):
        print(code, repr(argv)[:150], repr(stderr[-150:]), file=sys.stderr)
    bad = code == 70 or "Traceback" in stderr or "internal error" in stderr
    assert not bad, f"exit {code} for {argv!r}: {stderr[-2000:]}"


# -- damaged stored data ------------------------------------------------------------

#: Every stored column a damaged or edited file can change: (table, column, the key
#: column, whether NULL is allowed). ``events.id`` moves an event to another seq.
STORED_COLUMNS = [
    ("events", "body", "id", False),
    ("events", "hash", "id", False),
    ("events", "id", "id", False),
    *[
        ("run_heads", c, "run_no", c not in ("run_id", "graph_name", "status", "started_at"))
        for c in (
            "run_id", "run_no", "graph_name", "status", "parent_run_id", "started_at",
            "started_by", "agent_dir", "waiting_node", "output", "error",
        )
    ],
    *[("leases", c, "run_id", False)
      for c in ("run_id", "owner", "pid", "host", "started", "expires_at")],
    *[("cancel_requests", c, "run_id", False)
      for c in ("run_id", "requested_by", "reason", "requested_at")],
]  # fmt: skip

#: A run with a parallel step (two script branches).
PARALLEL = """\
name: par
version: "1.0"
start: fan
nodes:
  fan: {type: script, script: scripts/s.py, next: [a, b]}
  a: {type: script, script: scripts/s.py, state_updates: {}, next: join}
  b: {type: script, script: scripts/s.py, state_updates: {}, next: join}
  join: {type: end, output: "done"}
"""

#: Ways a stored value goes bad (SQL expressions; ``{old}`` is the value there).
DAMAGES = {
    "not-utf8": "CAST(X'DF' || CAST({old} AS BLOB) AS TEXT)",
    "utf8-inside": "CAST(replace(CAST({old} AS BLOB), X'22', X'22C3') AS TEXT)",
    "blob": "X'00FF10'",
    "integer": "7",
    "real": "2.5",
    "text": "'garbage'",
    "null": "NULL",
    "json-shape": """'{"type":"RunStarted","seq":"one","run_id":[1]}'""",
    "truncated": "substr({old}, 1, length({old}) / 2)",
    "huge-number": "'99999999999999999999999999'",
}

#: Commands given the damaged run R (and W, a run that waits, and F, a file).
RUN_COMMANDS = [
    ["show", "R"], ["show", "R", "--json"], ["show", "R", "--at", "2"],
    ["events", "R"], ["events", "R", "--json"], ["audit", "R"], ["audit", "R", "--verify"],
    ["audit", "R", "--json"], ["export", "R", "-o", "F"], ["replay", "R"], ["resume", "R"],
    ["logs", "R"], ["logs", "R", "--usage"], ["report", "R", "-o", "F.html"],
    ["graph", "agent", "--run", "R"], ["diff", "R", "W"], ["fork", "R", "--at", "1"],
    ["cancel", "R"], ["approve", "R", "approve", "--as", "alice"],
    ["answer", "W", "x", "--as", "bob"], ["approve", "W", "approve", "--as", "alice"],
    ["tail", "R"], ["otel", "R", "--endpoint", "http://127.0.0.1:9/v1/traces"],
    ["runs", "--status", "waiting"], ["runs", "--usage"], ["runs", "--status", "interrupted"],
    ["import", "F"],
]  # fmt: skip


def stored_cases(per_case: int) -> list[tuple[tuple[str, str, str, bool], str, list[list[str]]]]:
    """Every (column, damage) pair, each with ``runs``, ``runs --json``, ``show``
    and ``per_case`` more commands, rotating so that every command meets every
    column."""
    cases = []
    turn = 0
    for column in STORED_COLUMNS:
        for damage in DAMAGES:
            if damage == "null" and not column[3]:
                continue
            extra = [RUN_COMMANDS[(turn + i) % len(RUN_COMMANDS)] for i in range(per_case)]
            turn += per_case
            cases.append((column, damage, [["runs"], ["runs", "--json"], ["show", "R"], *extra]))
    return cases


def damage(db: Path, column: tuple[str, str, str, bool], how: str, run_id: str) -> bool:
    """Damage ``column`` of the run's rows (its first event, for ``events``); False
    when SQLite refuses the edit (a constraint), so there is nothing to test."""
    import sqlite3

    table, name, _key, _null = column
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        (run_no,) = conn.execute(
            "SELECT run_no FROM run_heads WHERE run_id = ?", (run_id,)
        ).fetchone()
        where = {
            "events": f"id = {(run_no << 32) | 1}",
            "run_heads": f"run_no = {run_no}",
        }.get(table, f"run_id = '{run_id}'")
        value = DAMAGES[how].replace("{old}", name)
        if table == "events" and name == "id":
            value = {"integer": str((run_no << 32) | 4000), "real": "2.5"}.get(how, "NULL")
        try:
            changed = conn.execute(f"UPDATE {table} SET {name} = {value} WHERE {where}").rowcount
        except sqlite3.Error:
            return False
        return bool(changed)
    finally:
        conn.close()


def fuzz_stored(workdir: Path, per_case: int, codes: Counter[int], done_cases: list[int]) -> None:
    """Build a database with a completed, a waiting, a parallel and an imported
    run, then damage each column of the completed, parallel or imported run in
    turn (on a copy)."""
    import sqlite3
    import time

    from graphrun.eventstore.store import SqliteStore

    answers = ["--answer", "ask=bob", "--answer", "gate=approve", "--as", "alice"]
    # An imported run: made in another file, exported, imported.
    os.environ["GRAPHRUN_DB"] = str(workdir / "other.db")
    call(["run", "agent", *answers])
    with SqliteStore(workdir / "other.db") as store:
        (other,) = [r.run_id for r in store.runs()]
    call(["export", other, "-o", str(workdir / "other.jsonl")])
    pristine = workdir / "pristine.db"
    os.environ["GRAPHRUN_DB"] = str(pristine)
    call(["run", "agent", *answers])
    call(["run", "waiting", "--answer", "ask=carol"])
    parallel = workdir / "parallel"
    (parallel / "scripts").mkdir(parents=True, exist_ok=True)
    (parallel / "graph.yaml").write_text(PARALLEL, encoding="utf-8")
    (parallel / "scripts" / "s.py").write_text("print('{}')\n", encoding="utf-8")
    call(["run", "parallel"])
    with SqliteStore(pristine) as store:
        runs = {r.graph_name: r.run_id for r in store.runs() if r.status != "waiting"}
        (waiting,) = [r.run_id for r in store.runs(status="waiting")]
    done, fanned = runs["fuzz"], runs["par"]
    assert call(["import", str(workdir / "other.jsonl")])[0] == 0
    # Each damage hits one of: a completed run, a parallel run, an imported run.
    targets = [done, fanned, other]
    call(["export", done, "-o", str(workdir / "done.jsonl")])
    conn = sqlite3.connect(pristine, isolation_level=None)
    now = time.time()
    for target in targets:
        conn.execute(
            "INSERT INTO leases VALUES (?, 'h:1:x', 1, 'elsewhere', 0, ?)", (target, now - 60)
        )
        conn.execute("INSERT INTO cancel_requests VALUES (?, 'bob', 'stop', ?)", (target, now))
    conn.close()
    for number, (column, how, commands) in enumerate(stored_cases(per_case)):
        done = targets[number % len(targets)]
        db = workdir / f"case-{number}.db"
        with sqlite3.connect(pristine) as source, sqlite3.connect(db) as copy:
            source.backup(copy)  # committed pages, WAL included
        if not damage(db, column, how, done):
            _remove(db)
            continue
        done_cases.append(number)
        os.environ["GRAPHRUN_DB"] = str(db)
        for command in commands:
            names = {"R": done, "W": waiting, "F": str(workdir / "done.jsonl"),
                     "F.html": str(workdir / "r.html")}  # fmt: skip
            argv = [names.get(a, a) for a in command]
            if command == ["export", "R", "-o", "F"]:
                argv[-1] = str(workdir / "out.jsonl")
            where = f"{column[0]}.{column[1]} {how}"
            code, stderr = call(argv)
            codes[code] += 1
            if os.environ.get("GRAPHRUN_FUZZ_VERBOSE"):
                print(where, code, argv[:2], repr(stderr[-200:]), file=sys.stderr)
            bad = code == 70 or "Traceback" in stderr or "internal error" in stderr
            assert not bad, f"{where}: exit {code} for {argv!r}: {stderr[-2000:]}"
            if argv[0] == "runs":
                assert code == 0, f"{where}: `graphrun {' '.join(argv)}` exit {code}: {stderr}"
        _remove(db)


def _remove(db: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def main() -> int:
    mode, count, workdir = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)
    os.environ.update(
        GRAPHRUN_DB=str(workdir / "events.db"),
        GRAPHRUN_CONFIG_DIR=str(workdir / "config"),
        GRAPHRUN_NO_TTY="1",
    )
    signal.signal(signal.SIGALRM, _alarm)
    codes: Counter[int] = Counter()
    cases = 0
    case_settings = settings(
        max_examples=count,
        deadline=None,
        database=None,
        derandomize=os.environ.get("GRAPHRUN_FUZZ_SEED") is None,
        suppress_health_check=list(HealthCheck),
    )
    graph_file = workdir / "agent" / "graph.yaml"
    graph_file.parent.mkdir(exist_ok=True)
    # Things command lines can name: an agent that completes, one that waits.
    for name, text in (("agent", BASE), ("waiting", BASE)):
        (workdir / name).mkdir(exist_ok=True)
        (workdir / name / "graph.yaml").write_text(text, encoding="utf-8")

    if mode == "stored":
        failure = None
        done_cases: list[int] = []
        try:
            fuzz_stored(workdir, count, codes, done_cases)
        except AssertionError as exc:
            failure = str(exc)
        cases = len(done_cases)
        import resource

        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(
            json.dumps(
                {"cases": cases, "codes": dict(codes), "failure": failure, "peak_kib": peak_kib}
            )
        )
        return 0

    if mode == "graphs":

        @case_settings
        @given(graph_texts)
        def fuzz(text: str) -> None:
            nonlocal cases
            cases += 1
            graph_file.write_bytes(text.encode("utf-8", "surrogateescape"))
            check(["validate", str(graph_file)], codes)

    else:
        call(["run", "waiting", "--answer", "ask=bob"])  # a run that waits at the gate
        from graphrun.eventstore.store import SqliteStore

        with SqliteStore(workdir / "events.db") as store:
            WAITING[0] = store.runs()[0].run_id

        @case_settings
        @given(command_lines())
        def fuzz(argv: list[str]) -> None:
            nonlocal cases
            cases += 1
            check(argv, codes)

    failure = None
    try:
        fuzz()
        if os.environ.get("GRAPHRUN_FUZZ_VERBOSE"):
            print(sorted(codes.items()), file=sys.stderr)
    except Exception as exc:  # the falsifying example, reported to the test
        failure = f"{type(exc).__name__}: {exc}"
    import resource

    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps({"cases": cases, "codes": dict(codes), "failure": failure, "peak_kib": peak_kib})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
