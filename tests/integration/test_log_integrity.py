"""The log as evidence: a field written by a newer version verifies everywhere, a log
that does not verify is never extended, and damage to the stored bytes is named by
seq. Real SQLite files changed behind graphrun's back, the real CLI."""

from __future__ import annotations

import hashlib
import random
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from graphrun.eventstore import codec
from graphrun.eventstore.errors import CorruptStoreError
from graphrun.eventstore.store import SqliteStore

GATE = """
version: "1.0"
name: gate
start: draft
nodes:
  draft:
    type: script
    script: scripts/draft.sh
    next: review
  review:
    type: approval
    question: "Ship {{title}}?"
    options: [approve, reject]
    routes: {approve: shipped, reject: dropped}
    on_other: dropped
  shipped:
    type: end
    output: "shipped {{title}}"
  dropped:
    type: end
    output: "dropped"
"""
DRAFT = {"scripts/draft.sh": '#!/bin/sh\necho \'{"title": "v2.1"}\'\n'}


def _gate(agent: Any) -> Path:
    root: Path = agent(GATE, DRAFT)
    (root / "scripts" / "draft.sh").chmod(0o755)
    return root


def _last_run(graphrun: Any) -> str:
    return str(graphrun("runs", "--json").json_lines()[0]["run_id"])


def _digest(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT id, CAST(body AS BLOB), hash FROM events ORDER BY id")
        return hashlib.sha256(repr(rows.fetchall()).encode()).hexdigest()


def _rewrite(db: Path, run_id: str, seq: int, body: bytes, *, rechain: bool) -> None:
    """Store ``body`` at ``seq``; with ``rechain`` recompute the hashes from there on
    (what a newer graphrun writing that body would have stored)."""
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE events SET body = CAST(? AS TEXT) WHERE run_id = ? AND seq = ?",
            (body, run_id, seq),
        )
        if rechain:
            rows = conn.execute(
                "SELECT id, CAST(body AS BLOB) FROM events WHERE run_id = ? ORDER BY id",
                (run_id,),
            ).fetchall()
            prev = codec.GENESIS
            for key, stored in rows:
                prev = codec.chain_hash(prev, stored)
                conn.execute("UPDATE events SET hash = ? WHERE id = ?", (prev, key))
    conn.close()


def _body(db: Path, run_id: str, seq: int) -> bytes:
    with sqlite3.connect(db) as conn:
        (body,) = conn.execute(
            "SELECT CAST(body AS BLOB) FROM events WHERE run_id = ? AND seq = ?", (run_id, seq)
        ).fetchone()
    conn.close()
    return bytes(body)


def test_a_newer_versions_field_verifies_exports_imports_and_replays(
    graphrun: Any, agent: Any, tmp_path: Path
) -> None:
    root = _gate(agent)
    assert graphrun("run", str(root), "--answer", "review=approve").code == 0
    run_id = _last_run(graphrun)
    with sqlite3.connect(graphrun.db) as conn:
        (seq,) = conn.execute(
            "SELECT seq FROM events WHERE run_id = ? AND type = 'NodeCompleted' LIMIT 1",
            (run_id,),
        ).fetchone()
    conn.close()
    body = _body(graphrun.db, run_id, seq)
    newer = body[:-1] + b',"zz_superstep":{"branch":"b1","step":3}}'
    _rewrite(graphrun.db, run_id, seq, newer, rechain=True)

    verified = graphrun("audit", run_id, "--verify")
    assert verified.code == 0, verified.stderr
    assert graphrun("replay", run_id).code == 0
    exported = tmp_path / "newer.run.jsonl"
    assert graphrun("export", run_id, "-o", str(exported)).code == 0
    assert b"zz_superstep" in exported.read_bytes()
    imported = graphrun("import", str(exported), GRAPHRUN_DB=str(tmp_path / "other.db"))
    assert imported.code == 0, imported.stderr
    tested = graphrun("test", str(exported), GRAPHRUN_DB=str(tmp_path / "third.db"))
    assert tested.code == 0, tested.stdout + tested.stderr


@pytest.mark.parametrize("command", ["approve", "answer", "resume", "cancel", "fork"])
def test_a_tampered_log_is_not_extended(graphrun: Any, agent: Any, command: str) -> None:
    root = _gate(agent)
    assert graphrun("run", str(root)).code == 3  # waits for the approval
    run_id = _last_run(graphrun)
    body = _body(graphrun.db, run_id, 3)
    _rewrite(graphrun.db, run_id, 3, body.replace(b"v2.1", b"v9.9"), rechain=False)
    before = _digest(graphrun.db)
    args = {
        "approve": ["approve", run_id, "approve", "--as", "ann"],
        "answer": ["answer", run_id, "approve", "--as", "ann"],
        "resume": ["resume", run_id, "--answer", "review=approve"],
        "cancel": ["cancel", run_id],
        "fork": ["fork", run_id, "--at", "2"],
    }[command]
    result = graphrun(*args)
    assert result.code == 2, result.stdout + result.stderr
    assert f"run {run_id} does not verify at seq 3" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert _digest(graphrun.db) == before


def _cell_ranges(path: Path, bodies: list[bytes], hashes: list[str]) -> list[tuple[int, int]]:
    """Where each stored body and hash sits in the database file."""
    data = path.read_bytes()
    ranges = []
    for needle in [*bodies, *(h.encode() for h in hashes)]:
        at = data.find(needle)
        if at >= 0:
            ranges.append((at, at + len(needle)))
    return ranges


def test_single_byte_flips_in_event_pages_are_named_by_seq(
    graphrun: Any, agent: Any, tmp_path: Path
) -> None:
    """100 random flips of one byte inside stored events: every one is reported as a
    bad seq (or an unreadable page), by the store and by ``audit --verify``."""
    root = _gate(agent)
    assert graphrun("run", str(root), "--answer", "review=approve").code == 0
    run_id = _last_run(graphrun)
    store = SqliteStore(graphrun.db)
    rows = list(store.raw_rows(run_id))
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    pristine = tmp_path / "pristine.db"
    shutil.copy(graphrun.db, pristine)
    ranges = _cell_ranges(pristine, [r[1] for r in rows], [r[3] for r in rows])
    assert len(ranges) == 2 * len(rows)
    rng = random.Random(1234)
    outcomes: dict[str, int] = {}
    for trial in range(100):
        damaged = tmp_path / f"flip{trial}.db"
        shutil.copy(pristine, damaged)
        start, end = rng.choice(ranges)
        offset = rng.randrange(start, end)
        data = bytearray(damaged.read_bytes())
        data[offset] ^= 1 << rng.randrange(8)
        damaged.write_bytes(bytes(data))
        try:
            store = SqliteStore(damaged)
            problem = store.verify(run_id)
            store.close()
        except CorruptStoreError as exc:  # the page cannot be read at all
            assert "damaged" in str(exc) or "does not" in str(exc), exc
            outcomes["unreadable"] = outcomes.get("unreadable", 0) + 1
            continue
        assert problem is not None, f"flip at {offset} not found"
        assert 1 <= problem.seq <= len(rows)
        outcomes["seq"] = outcomes.get("seq", 0) + 1
        if trial % 20 == 0:  # the command a user runs says the same
            result = graphrun("audit", run_id, "--verify", GRAPHRUN_DB=str(damaged))
            assert result.code in (1, 2), result.stderr
            assert "Traceback" not in result.stderr
            assert f"first bad seq {problem.seq}" in result.stderr
    assert outcomes.get("seq", 0) > 50, outcomes


def test_flips_anywhere_in_the_file_end_in_a_report_never_an_internal_error(
    tmp_path: Path,
) -> None:
    """Random single-bit flips anywhere in a database (schema, runs, leases, free
    space): opening and verifying either works, names a seq, or raises a one-line
    store error. Nothing else escapes."""
    from graphrun.eventstore.errors import GraphrunError
    from tests.conformance.store_contract import started, step

    db = tmp_path / "events.db"
    store = SqliteStore(db)
    for n in range(3):
        store.append(f"r{n}", [started()])
        for visit in range(1, 15):
            store.append(f"r{n}", step("a", visit, visit, None))
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    pristine = db.read_bytes()
    rng = random.Random(99)
    outcomes: dict[str, int] = {}
    for trial in range(200):
        damaged = tmp_path / f"any{trial}.db"
        data = bytearray(pristine)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        damaged.write_bytes(bytes(data))
        try:
            with SqliteStore(damaged) as opened:
                found = [opened.verify(f"r{n}") for n in range(3) if opened.has_run(f"r{n}")]
            outcome = "seq" if any(found) else "ok"
        except GraphrunError as exc:
            assert "\n" not in str(exc), exc
            outcome = type(exc).__name__
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes.get("seq", 0) > 0, outcomes
