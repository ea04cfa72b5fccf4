"""State snapshots: a run's fold kept at a verified seq, used only when the log agrees.

* From any seq of real runs (the recordings in ``replays/``: sequential, parallel,
  map, agent with a child run, approvals; and runs made here, waiting inside a
  parallel step and after a loop), the fold started from a snapshot is the full
  fold, byte for byte once encoded.
* A drive that leaves a run waiting keeps a snapshot at its head, folded from the
  stored events; the next command that continues the run folds from it (``fold`` of
  every event is never called) and ends exactly as a run without snapshots does;
  the snapshot is dropped in the transaction that ends the run.
* A missing, stale, damaged, foreign or mismatching snapshot is ignored; a file
  without the table (schema 6) gains it and keeps working.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from graphrun.eventstore import snapshots
from graphrun.eventstore.events import Event, NodeEntered
from graphrun.eventstore.fold import RunState, fold
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine import runs
from graphrun.runtime.engine.runs import keep_snapshot, load_run
from tests.conftest import ROOT, write_agent

REPLAYS = sorted((ROOT / "replays").glob("*.run.jsonl"))

LOOP_GATE = """
name: loop-gate
version: "1.0"
start: step
settings: {max_loop_iterations: 1000}
initial_state: {i: 0, n: 12}
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
STEP = (
    "#!/bin/bash\n"
    's=${GRAPH_STATE:-$(<"$GRAPH_STATE_FILE")}\n'
    '[[ $s =~ \\"i\\":([0-9]+) ]] && i=${BASH_REMATCH[1]} || i=0\n'
    '[[ $s =~ \\"n\\":([0-9]+) ]] && n=${BASH_REMATCH[1]} || n=1\n'
    "i=$((i+1))\n"
    "if (( i < n )); then next=step; else next=gate; fi\n"
    'printf \'{"i":%d,"_next":"%s"}\\n\' "$i" "$next"\n'
)

#: A parallel step (a script beside a map) joined before an approval waits.
PARALLEL_GATE = """
name: parallel-gate
version: "1.0"
start: seed
initial_state: {items: [1, 2, 3]}
nodes:
  seed:
    type: script
    script: seed.py
    next: [count, each]
  count:
    type: script
    script: seed.py
    state_updates: {}
    next: ask
  each:
    type: map
    over: "{{items}}"
    as: item
    branch: double
    collect_into: doubled
    next: ask
  double:
    type: script
    script: double.py
    state_updates: {}
  ask:
    type: approval
    question: "Ship {{doubled}}?"
    options: [approve, reject]
    routes: {approve: done, reject: done}
    on_other: done
    state_updates: {decision: "{{choice}}"}
  done:
    type: end
    output: "{{decision}} {{doubled}}"
"""
PARALLEL_FILES = {
    "seed.py": 'import json\nprint(json.dumps({"seeded": True}))\n',
    "double.py": (
        "import json, os\n"
        'item = json.loads(os.environ["GRAPH_STATE"])["item"]\n'
        'print(json.dumps({"output": item * 2}))\n'
    ),
}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    opened = SqliteStore(tmp_path / "events.db")
    yield opened
    opened.close()


def encoded(state: RunState) -> bytes:
    """A state's canonical bytes (what equality must hold for, order included)."""
    made = snapshots.encode_state(state, "sha256:x")
    assert made is not None
    return made[0]


def read(store: Any, run_id: str) -> tuple[list[Event], dict[int, str]]:
    hashes: dict[int, str] = {}
    events, problem = store.read_verified(run_id, hashes=hashes)
    assert problem is None, problem
    return events, hashes


def snapshot_at(events: list[Event], hashes: dict[int, str], seq: int) -> snapshots.Stored:
    made = snapshots.encode_state(fold(events[:seq]), hashes[seq])
    assert made is not None
    return seq, hashes[seq], made[0], made[1]


def check_every_seq(store: Any, run_id: str) -> RunState:
    """From a snapshot at every seq of the run: the full fold."""
    events, hashes = read(store, run_id)
    full = fold(events)
    for seq in range(1, len(events) + 1):
        stored = snapshot_at(events, hashes, seq)
        assert snapshots.decode_state(stored, run_id) == fold(events[:seq])
        state = snapshots.state_from(stored, run_id, events, hashes)
        assert state is not None, f"seq {seq} not used"
        assert state == full
        assert encoded(state) == encoded(full)
    return full


def no_full_fold(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count each fold from now on: how many events it folded (all of the log
    without a usable snapshot, those after it with one)."""
    from graphrun.eventstore import fold as fold_module

    calls: list[int] = []
    real = fold_module.fold

    def counted(events: Any, state: RunState | None = None) -> RunState:
        events = list(events)
        calls.append(len(events))
        return real(events, state)

    monkeypatch.setattr(runs, "fold", counted)
    monkeypatch.setattr(fold_module, "fold", counted)
    return calls


def loop_gate(tmp_path: Path) -> Path:
    root = write_agent(tmp_path / "loop-gate", LOOP_GATE, {"step.sh": STEP})
    (root / "step.sh").chmod(0o755)
    return root


def start_and_drive(store: SqliteStore, root: Path) -> str:
    from graphrun.runtime.engine.driver import Driver, RunOptions, drive, start_run
    from graphrun.runtime.graph.loader import load_graph

    run_id = start_run(store, load_graph(root))
    outcome = drive(Driver(store, run_id, RunOptions(interactive=False)))
    assert outcome.status == "waiting", outcome.error
    return run_id


# -- equality on real runs ----------------------------------------------------------


@pytest.mark.parametrize("recording", REPLAYS, ids=lambda p: p.name.split(".")[0])
def test_a_fold_from_a_snapshot_at_any_seq_of_a_recorded_run_is_the_full_fold(
    tmp_path: Path, recording: Path
) -> None:
    from graphrun.runtime.replay.transfer import import_runs

    with SqliteStore(tmp_path / "events.db") as store:
        imported = import_runs(store, recording)
        assert imported
        kinds: set[str] = set()
        for run_id, _ in imported:
            full = check_every_seq(store, run_id)
            kinds.update(type(e).__name__ for e in store.read(run_id))
            # Kept at the head (as a drive that stops there keeps it) and loaded.
            assert keep_snapshot(store, run_id, "waiting")
            row = store.snapshot(run_id)
            assert row is not None and row[0] == full.last_seq
            assert load_run(store, run_id).state == full
    assert "RunStarted" in kinds


def test_the_recordings_cover_parallel_map_agent_and_approval_runs() -> None:
    found = "".join(p.read_text(encoding="utf-8") for p in REPLAYS)
    for kind in ("StepStarted", "BranchesMerged", "ChildRunStarted", "HumanInputReceived"):
        assert f'"type":"{kind}"' in found
    assert '"branch":"' in found


def test_a_run_waiting_after_a_parallel_step_keeps_a_snapshot_that_folds_right(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from graphrun.runtime.engine.answers import answer_run
    from graphrun.runtime.engine.driver import Driver, RunOptions, drive

    root = write_agent(tmp_path / "parallel", PARALLEL_GATE, PARALLEL_FILES)
    run_id = start_and_drive(store, root)
    full = check_every_seq(store, run_id)
    assert full.waiting is not None and full.step >= 1
    row = store.snapshot(run_id)
    assert row is not None and row[0] == full.last_seq
    calls = no_full_fold(monkeypatch)
    loaded = load_run(store, run_id)
    assert loaded.state == full and encoded(loaded.state) == encoded(full)
    assert calls == [0]  # only the events after the snapshot (none) were folded
    _received, answered = answer_run(
        store, run_id, "approve", kind="approval", as_user="ann", channel="approve", loaded=loaded
    )
    outcome = drive(
        Driver(store, run_id, RunOptions(interactive=False), resumed_by="ann", loaded=answered)
    )
    assert outcome.status == "completed", outcome.error
    assert outcome.output == "approve [2,4,6]"


# -- the commands ---------------------------------------------------------------------


def test_approve_continues_from_the_snapshot_and_ends_as_without_one(graphrun, tmp_path) -> None:
    root = loop_gate(tmp_path)
    ended = {}
    for kept in (True, False):
        graphrun.db = tmp_path / f"{kept}.db"
        started = graphrun("run", str(root))
        assert started.code == 3, started.stderr  # waiting
        run_id = graphrun.last_run()
        with sqlite3.connect(graphrun.db) as conn:
            (head,) = conn.execute(
                "SELECT last_seq FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            rows = conn.execute("SELECT run_id, seq FROM snapshots").fetchall()
            assert rows == [(run_id, head)]  # kept at the head the run waits at
            if not kept:
                conn.execute("DELETE FROM snapshots")
        approved = graphrun("approve", run_id, "approve", "--as", "ann")
        assert approved.code == 0, approved.stderr
        with sqlite3.connect(graphrun.db) as conn:  # dropped with the run's end
            assert conn.execute("SELECT count(*) FROM snapshots").fetchone()[0] == 0
        shown = graphrun("show", run_id, "--json")
        assert shown.code == 0, shown.stderr
        state = shown.json()
        with sqlite3.connect(graphrun.db) as conn:
            types = [t for (t,) in conn.execute("SELECT type FROM run_events ORDER BY seq")]
        ended[kept] = (state["status"], state["output"], types)  # type: ignore[index]
        assert graphrun("audit", run_id, "--verify").code == 0
    assert ended[True] == ended[False]
    assert ended[True][:2] == ("completed", "approve after 12")


def test_cancelling_a_waiting_run_drops_its_snapshot(graphrun, tmp_path) -> None:
    assert graphrun("run", str(loop_gate(tmp_path))).code == 3  # waiting
    run_id = graphrun.last_run()
    with sqlite3.connect(graphrun.db) as conn:
        assert conn.execute("SELECT count(*) FROM snapshots").fetchone()[0] == 1
    cancelled = graphrun("cancel", run_id, "--as", "ann")
    assert cancelled.code == 0, cancelled.stderr
    with sqlite3.connect(graphrun.db) as conn:
        assert conn.execute("SELECT count(*) FROM snapshots").fetchone()[0] == 0


def test_load_run_folds_only_what_follows_the_snapshot(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = start_and_drive(store, loop_gate(tmp_path))
    head = store.run(run_id).last_seq
    assert store.snapshot(run_id) is not None
    # Another writer (an older graphrun) extends the log and keeps no snapshot.
    store.append(run_id, [NodeEntered(node_id="note", node_type="end", visit=1)])
    calls = no_full_fold(monkeypatch)
    loaded = load_run(store, run_id)
    assert calls == [1]  # the one event after the snapshot
    assert loaded.state == fold(store.read(run_id))
    assert loaded.state.last_seq == head + 1
    # The next snapshot is folded from the last one and the stored events after it.
    assert keep_snapshot(store, run_id, "interrupted")
    row = store.snapshot(run_id)
    assert row is not None and row[0] == head + 1
    assert snapshots.decode_state(row, run_id) == loaded.state
    assert not keep_snapshot(store, run_id, "completed")  # only runs continued later


# -- snapshots that are ignored -------------------------------------------------------


def _rewrite(store: SqliteStore, run_id: str, change: Any, *, fix_digest: bool = True) -> None:
    """Store the run's snapshot with its body's JSON changed by ``change``."""
    row = store.snapshot(run_id)
    assert row is not None
    seq, digest, body, check = row
    value = json.loads(body)
    change(value)
    body = json.dumps(value).encode()
    if fix_digest:
        check = snapshots._digest(body)
    store.keep_snapshot(run_id, seq, digest, body, check)


@pytest.mark.parametrize(
    "spoil",
    [
        "another-fold",
        "edited-unsigned",
        "other-run",
        "seq-beyond-head",
        "wrong-hash",
        "not-json",
        "wrong-types",
    ],
)
def test_a_snapshot_that_does_not_fit_is_ignored(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spoil: str
) -> None:
    run_id = start_and_drive(store, loop_gate(tmp_path))
    events, hashes = read(store, run_id)
    full = fold(events)
    seq, digest, body, check = store.snapshot(run_id) or (0, "", b"", "")
    if spoil == "another-fold":
        _rewrite(store, run_id, lambda v: v.update(fold="sha256:" + "1" * 64))
    elif spoil == "edited-unsigned":  # the state changed, the digest not recomputed
        _rewrite(store, run_id, lambda v: v["state"]["state"].update(i=99), fix_digest=False)
    elif spoil == "other-run":
        _rewrite(store, run_id, lambda v: v.update(run_id="someone-else"))
    elif spoil == "seq-beyond-head":
        store.keep_snapshot(run_id, seq + 5, digest, body, check)
    elif spoil == "wrong-hash":  # a snapshot of another log at the same seq
        store.keep_snapshot(run_id, seq, "sha256:" + "2" * 64, body, check)
    elif spoil == "not-json":
        junk = b"\x00not json"
        store.keep_snapshot(run_id, seq, digest, junk, snapshots._digest(junk))
    else:
        with sqlite3.connect(store.path) as conn:
            conn.execute("UPDATE snapshots SET seq = 'x', body = 42")
    calls = no_full_fold(monkeypatch)
    assert load_run(store, run_id).state == full
    assert calls == [len(events)]  # folded from the first event
    # The next drive that stops keeps a right one again.
    assert keep_snapshot(store, run_id, "waiting")
    assert snapshots.state_from(store.snapshot(run_id), run_id, events, hashes) == full


def test_a_snapshot_with_a_forged_state_and_digest_is_still_tied_to_its_seq(
    store: SqliteStore, tmp_path: Path
) -> None:
    """What the snapshot claims about where it stands must match its row and the log."""
    run_id = start_and_drive(store, loop_gate(tmp_path))
    events, hashes = read(store, run_id)
    _rewrite(store, run_id, lambda v: v["state"].update(last_seq=3))
    assert snapshots.state_from(store.snapshot(run_id), run_id, events, hashes) is None


def test_audit_verify_names_a_snapshot_edited_to_disagree_with_the_log(graphrun, tmp_path) -> None:
    """An edited state whose digest was recomputed fits its row and its seq's hash:
    a continuing command cannot tell it from a true one without folding the log, so
    ``audit --verify`` (which does) names it, and the run is reported broken."""
    assert graphrun("run", str(loop_gate(tmp_path))).code == 3  # waiting
    run_id = graphrun.last_run()
    verified = graphrun("audit", run_id, "--verify")
    assert verified.code == 0, verified.stderr
    with SqliteStore(graphrun.db) as store:
        _rewrite(store, run_id, lambda v: v["state"]["state"].update(i=99))
        seq = store.run(run_id).last_seq
    broken = graphrun("audit", run_id, "--verify")
    assert broken.code == 1
    assert f"BROKEN: run {run_id}: first bad seq {seq}: its state snapshot" in broken.stderr
    # Without it, the run folds from its first event again and verifies.
    with sqlite3.connect(graphrun.db) as conn:
        conn.execute("DELETE FROM snapshots")
    assert graphrun("audit", run_id, "--verify").code == 0


def test_a_store_without_the_table_folds_from_the_start(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = start_and_drive(store, loop_gate(tmp_path))
    with sqlite3.connect(store.path) as conn:
        conn.execute("DROP TABLE snapshots")
    calls = no_full_fold(monkeypatch)
    assert load_run(store, run_id).state == fold(store.read(run_id))
    assert calls and calls[0] == store.run(run_id).last_seq
    assert not keep_snapshot(store, run_id, "waiting")  # nowhere to keep it: no error


def test_a_schema_6_file_gains_the_table_and_its_waiting_run_goes_on(graphrun, tmp_path) -> None:
    from graphrun.eventstore.migrations import SCHEMA_USER_VERSION

    root = loop_gate(tmp_path)
    assert graphrun("run", str(root)).code == 3  # waiting
    run_id = graphrun.last_run()
    with sqlite3.connect(graphrun.db) as conn:
        conn.execute("DROP TABLE snapshots")
        conn.execute("PRAGMA user_version = 6")
    approved = graphrun("approve", run_id, "approve", "--as", "ann")
    assert approved.code == 0, approved.stderr
    with sqlite3.connect(graphrun.db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_USER_VERSION
        assert conn.execute("SELECT count(*) FROM snapshots").fetchone()[0] == 0
        (status,) = conn.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    assert status == "completed"


def test_a_snapshot_holds_what_the_log_holds_not_the_drivers_working_state(
    store: SqliteStore, tmp_path: Path
) -> None:
    """Secrets the store redacts from events never reach a snapshot either: it is
    folded from the stored events, not from the driver's own."""
    from graphrun.eventstore import redaction

    secret = "hunter2-very-secret"
    root = write_agent(
        tmp_path / "secret",
        LOOP_GATE.replace("initial_state: {i: 0, n: 12}", "initial_state: {i: 0, n: 2}"),
        {"step.sh": STEP.replace('"_next"', f'"key":"{secret}","_next"')},
    )
    (root / "step.sh").chmod(0o755)
    redaction.register(secret)
    try:
        run_id = start_and_drive(store, root)
    finally:
        redaction.clear()
    row = store.snapshot(run_id)
    assert row is not None and secret.encode() not in row[2]
    state = snapshots.decode_state(row, run_id)
    assert state is not None and state.state["key"] == redaction.MASK
    assert state == fold(store.read(run_id))


def test_a_state_round_trips_through_its_snapshot_encoding() -> None:
    events, _ = _recorded_events("source-survey")
    for seq in range(1, len(events) + 1):
        state = fold(events[:seq])
        made = snapshots.encode_state(state, "sha256:h")
        assert made is not None
        body, check = made
        assert snapshots.decode_state((seq, "sha256:h", body, check), state.run_id) == state
        assert msgspec.json.decode(body)["seq"] == seq


def _recorded_events(name: str) -> tuple[list[Event], str]:
    from graphrun.runtime.replay.transfer import read_export

    runs_by_id = read_export(ROOT / "replays" / f"{name}.run.jsonl")
    run_id, events = next(iter(runs_by_id.items()))
    return list(events), run_id
