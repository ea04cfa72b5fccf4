"""Crafted export files (hashes recomputed, so only the import's own checks stand
between them and the database), trailers, and anchors against a recomputed chain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from graphrun.eventstore import codec
from tests.conftest import ROOT

GATE = """\
name: gate
version: "1.0"
start: review
nodes:
  review:
    type: approval
    question: "Ship {{initial_prompt}}?"
    options: [approve, reject]
    routes:
      approve: shipped
      reject: held
    on_other: held
    approvers: [alice, bob]
  shipped:
    type: end
    output: "shipped {{initial_prompt}}"
  held:
    type: end
    output: "held {{initial_prompt}}"
"""


class Export:
    """An export file as a header, event dicts and a trailer; written back with every
    hash (and the trailer) recomputed, as a forger would."""

    def __init__(self, path: Path) -> None:
        lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        self.header: dict[str, Any] = lines[0]
        self.events: list[dict[str, Any]] = [r["event"] for r in lines[1:] if "event" in r]
        self.trailer = [r for r in lines[1:] if "trailer" in r]

    def write(self, path: Path, *, trailer: bool = True, runs: list[str] | None = None) -> Path:
        out = [json.dumps(self.header)]
        prev: dict[str, str] = {}
        heads: dict[str, dict[str, Any]] = {}
        for event in self.events:
            body = codec.encode(codec.decode(json.dumps(event)))
            digest = codec.chain_hash(prev.get(event["run_id"], codec.GENESIS), body)
            prev[event["run_id"]] = digest
            count = heads.get(event["run_id"], {}).get("events", 0) + 1
            heads[event["run_id"]] = {"events": count, "head": digest}
            out.append(f'{{"hash":"{digest}","event":{body.decode("utf-8")}}}')
        if trailer:
            out.append(json.dumps({"trailer": {"runs": heads}}))
        path.write_text("\n".join(out) + "\n", encoding="utf-8")
        return path


@pytest.fixture
def gate(agent: Any) -> Path:
    return agent(GATE, name="gate")


def exported(graphrun: Any, tmp_path: Path, *args: str) -> tuple[str, Path]:
    res = graphrun("run", *args)
    assert res.code in (0, 3), res.stderr
    run_id = graphrun.last_run()
    out = tmp_path / "out.run.jsonl"
    assert graphrun("export", run_id, "-o", str(out)).code == 0
    return run_id, out


def import_into(graphrun: Any, path: Path, db: Path, *flags: str) -> Any:
    return graphrun("import", str(path), "--db", str(db), *flags, timeout=30)


def refused(res: Any, *needles: str) -> str:
    assert res.code == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr
    line = res.stderr.strip()
    assert "\n" not in line, line
    for needle in needles:
        assert needle in line, line
    return line


def runs_in(graphrun: Any, db: Path) -> list[Any]:
    if not db.exists():
        return []
    return graphrun("runs", "--json", "--db", str(db)).json_lines()


# -- trailers ---------------------------------------------------------------------


def test_an_export_ends_with_a_trailer_and_round_trips(graphrun, gate, tmp_path) -> None:
    run_id, out = exported(
        graphrun, tmp_path, str(gate), "v1", "--as", "bob", "--answer", "review=approve"
    )
    lines = out.read_text().splitlines()
    assert json.loads(lines[0])["version"] == 2
    trailer = json.loads(lines[-1])["trailer"]["runs"][run_id]
    assert trailer["events"] == len(lines) - 2
    assert trailer["head"] == json.loads(lines[-2])["hash"]
    res = import_into(graphrun, out, tmp_path / "fresh.db")
    assert res.code == 0, res.stderr
    assert res.stdout == f"imported: {run_id}\n"


def test_a_cut_tail_is_refused(graphrun, gate, tmp_path) -> None:
    _, out = exported(
        graphrun, tmp_path, str(gate), "v1", "--as", "bob", "--answer", "review=approve"
    )
    lines = out.read_text().splitlines()
    db = tmp_path / "fresh.db"
    # The last event gone, the trailer kept.
    cut = tmp_path / "cut.run.jsonl"
    cut.write_text("\n".join(lines[:-2] + lines[-1:]) + "\n")
    refused(import_into(graphrun, cut, db), "the trailer says", "cut or added to")
    # The last event and the trailer gone: no trailer at all.
    cut.write_text("\n".join(lines[:-2]) + "\n")
    refused(import_into(graphrun, cut, db), "ends without its trailer")
    # Only the trailer gone.
    cut.write_text("\n".join(lines[:-1]) + "\n")
    refused(import_into(graphrun, cut, db), "ends without its trailer")
    # A line after the trailer.
    cut.write_text("\n".join([*lines, lines[-2]]) + "\n")
    refused(import_into(graphrun, cut, db), "a line after the trailer")
    assert runs_in(graphrun, db) == []


def test_a_cut_with_a_recomputed_trailer_is_an_unended_run(graphrun, gate, tmp_path) -> None:
    _, out = exported(
        graphrun, tmp_path, str(gate), "v1", "--as", "bob", "--answer", "review=approve"
    )
    crafted = Export(out)
    crafted.events.pop()  # a forger cuts the tail and rewrites the trailer to match
    short = crafted.write(tmp_path / "short.run.jsonl")
    # The file is consistent: only an anchor kept elsewhere can tell (see below). The
    # run has lost its end, so its agent directory must be named to import it.
    refused(import_into(graphrun, short, tmp_path / "fresh.db"), "has not ended")
    assert import_into(graphrun, short, tmp_path / "fresh.db", "--agent-dir", str(gate)).code == 0


@pytest.mark.parametrize("name", ["format-v1", "ticket-triage", "file-triage", "release-checklist"])
def test_old_exports_without_a_trailer_still_import(graphrun, tmp_path, name) -> None:
    recorded = ROOT / "replays" / f"{name}.run.jsonl"
    lines = recorded.read_text().splitlines()
    header = json.loads(lines[0])
    if header["version"] != 1:
        # A version-1 file is a version-2 file without its trailer.
        header["version"] = 1
        lines = [json.dumps(header), *(ln for ln in lines[1:] if not ln.startswith('{"trailer"'))]
        recorded = tmp_path / f"{name}.run.jsonl"
        recorded.write_text("\n".join(lines) + "\n")
    res = import_into(graphrun, recorded, tmp_path / "fresh.db")
    assert res.code == 0, res.stderr
    assert res.stdout.startswith("imported: ")


# -- anchors ----------------------------------------------------------------------


def test_an_anchor_catches_a_recomputed_chain(graphrun, gate, tmp_path) -> None:
    run_id, out = exported(
        graphrun, tmp_path, str(gate), "v1", "--as", "bob", "--answer", "review=approve"
    )
    anchor = graphrun("audit", run_id, "--anchor")
    assert anchor.code == 0
    kept = anchor.stdout.strip()
    assert kept.startswith(f"{run_id}@") and ":sha256:" in kept
    ok = graphrun("audit", run_id, "--verify", "--anchor", kept)
    assert ok.code == 0, ok.stderr
    assert f"ok: run {run_id}: the anchor at seq " in ok.stderr

    # A forger rewrites the answer and recomputes every hash and the trailer.
    crafted = Export(out)
    for event in crafted.events:
        if event["type"] == "HumanInputReceived":
            event["answer"] = "reject"
    forged = crafted.write(tmp_path / "forged.run.jsonl")
    db = tmp_path / "forged.db"
    assert import_into(graphrun, forged, db).code == 0
    # The chain verifies (it was recomputed) ...
    assert graphrun("audit", run_id, "--verify", "--db", str(db)).code == 0
    # ... but the anchor kept elsewhere does not hold.
    res = graphrun("audit", run_id, "--verify", "--anchor", kept, "--db", str(db))
    assert res.code == 1
    assert res.stderr.strip() == (
        f"BROKEN: run {run_id}: anchor at seq {kept.split('@')[1].split(':')[0]}: "
        "the events up to it are not those anchored (changed or rewritten)"
    )
    # A log cut below the anchor.
    crafted = Export(out)
    crafted.events.pop()
    db = tmp_path / "cut.db"
    cut = crafted.write(tmp_path / "cut.run.jsonl")
    assert import_into(graphrun, cut, db, "--agent-dir", str(gate)).code == 0
    res = graphrun("audit", run_id, "--verify", "--anchor", kept, "--db", str(db))
    assert res.code == 1 and "(cut)" in res.stderr


def test_a_bad_anchor_is_a_usage_error(graphrun, gate, tmp_path) -> None:
    run_id, _ = exported(
        graphrun, tmp_path, str(gate), "v1", "--as", "bob", "--answer", "review=approve"
    )
    refused(graphrun("audit", run_id, "--verify", "--anchor", "nonsense"), "is not an anchor")
    other = "0" * 18 + "@1:sha256:" + "0" * 64
    refused(graphrun("audit", run_id, "--verify", "--anchor", other), "belongs to run")


# -- untrusted files --------------------------------------------------------------


def test_an_empty_run_id_is_refused(graphrun, gate, tmp_path) -> None:
    _, out = exported(
        graphrun, tmp_path, str(gate), "v1", "--as", "bob", "--answer", "review=approve"
    )
    crafted = Export(out)
    for event in crafted.events:
        event["run_id"] = ""
    crafted.header["runs"] = [""]
    db = tmp_path / "fresh.db"
    refused(
        import_into(graphrun, crafted.write(tmp_path / "x.run.jsonl"), db),
        "'' is not a valid run id",
    )
    crafted.header.pop("runs")
    refused(
        import_into(graphrun, crafted.write(tmp_path / "x.run.jsonl"), db),
        "'' is not a valid run id",
    )
    assert runs_in(graphrun, db) == []


def test_a_run_that_is_its_own_parent_is_refused(graphrun, gate, tmp_path) -> None:
    run_id, out = exported(
        graphrun, tmp_path, str(gate), "v1", "--as", "bob", "--answer", "review=approve"
    )
    crafted = Export(out)
    crafted.events[0]["parent_run_id"] = run_id
    db = tmp_path / "fresh.db"
    line = refused(import_into(graphrun, crafted.write(tmp_path / "x.run.jsonl"), db))
    assert f"run {run_id} is its own ancestor" in line
    assert runs_in(graphrun, db) == []


def test_two_runs_that_are_each_others_parent_are_refused(graphrun, gate, tmp_path) -> None:
    run_id, out = exported(
        graphrun, tmp_path, str(gate), "v1", "--as", "bob", "--answer", "review=approve"
    )
    crafted = Export(out)
    twin = "0" * 17 + "1"
    copy = [{**e, "run_id": twin} for e in crafted.events]
    copy[0]["parent_run_id"] = run_id
    crafted.events[0]["parent_run_id"] = twin
    crafted.events += copy
    crafted.header["runs"] = [run_id, twin]
    db = tmp_path / "fresh.db"
    refused(import_into(graphrun, crafted.write(tmp_path / "x.run.jsonl"), db), "its own ancestor")
    assert runs_in(graphrun, db) == []


def test_a_run_that_does_not_start_with_run_started_is_refused(graphrun, gate, tmp_path) -> None:
    run_id, out = exported(
        graphrun, tmp_path, str(gate), "v1", "--as", "bob", "--answer", "review=approve"
    )
    crafted = Export(out)
    crafted.events.pop(0)
    for seq, event in enumerate(crafted.events, 1):
        event["seq"] = seq
    db = tmp_path / "fresh.db"
    line = refused(import_into(graphrun, crafted.write(tmp_path / "x.run.jsonl"), db))
    assert f"run {run_id} starts with NodeEntered, not RunStarted" in line
    # A second RunStarted inside a run.
    crafted = Export(out)
    crafted.events.append({**crafted.events[0], "seq": len(crafted.events) + 1})
    refused(
        import_into(graphrun, crafted.write(tmp_path / "x.run.jsonl"), db), "starts a second time"
    )
    assert runs_in(graphrun, db) == []


def test_one_new_and_one_conflicting_run_import_nothing(graphrun, gate, tmp_path) -> None:
    run_id, out = exported(
        graphrun, tmp_path, str(gate), "v1", "--as", "bob", "--answer", "review=approve"
    )
    # The database already holds the run with another answer.
    crafted = Export(out)
    for event in crafted.events:
        if event["type"] == "HumanInputReceived":
            event["answer"] = "reject"
    db = tmp_path / "fresh.db"
    assert import_into(graphrun, crafted.write(tmp_path / "other.run.jsonl"), db).code == 0
    # The file: a new run first, then the original (conflicting) one.
    crafted = Export(out)
    new = "0" * 17 + "2"
    crafted.events = [{**e, "run_id": new} for e in crafted.events] + crafted.events
    crafted.header["runs"] = [new, run_id]
    line = refused(import_into(graphrun, crafted.write(tmp_path / "x.run.jsonl"), db))
    assert f"run {run_id} already exists" in line
    assert [r["run_id"] for r in runs_in(graphrun, db)] == [run_id]


def test_an_approval_by_someone_not_an_approver_is_refused(graphrun, gate, tmp_path) -> None:
    _, out = exported(
        graphrun, tmp_path, str(gate), "v1", "--as", "bob", "--answer", "review=approve"
    )
    crafted = Export(out)
    for event in crafted.events:
        if event["type"] == "HumanInputReceived":
            event["by"] = "mallory"
    db = tmp_path / "fresh.db"
    line = refused(import_into(graphrun, crafted.write(tmp_path / "x.run.jsonl"), db))
    assert "an answer by 'mallory' at node 'review', whose approvers are alice, bob" in line
    assert runs_in(graphrun, db) == []


def test_a_run_that_has_not_ended_needs_its_agent_dir_named(graphrun, gate, tmp_path) -> None:
    run_id, out = exported(graphrun, tmp_path, str(gate), "v1")  # waits at the gate
    db = tmp_path / "fresh.db"
    line = refused(import_into(graphrun, out, db), f"run {run_id} has not ended", "--agent-dir")
    assert runs_in(graphrun, db) == []
    # A folder the file names that the user did not: still refused.
    refused(import_into(graphrun, out, db, "--agent-dir", str(tmp_path)), "has not ended")
    res = import_into(graphrun, out, db, "--agent-dir", str(gate))
    assert res.code == 0, res.stderr
    approved = graphrun("approve", run_id, "approve", "--as", "alice", "--db", str(db))
    assert approved.code == 0, approved.stderr
    assert approved.stdout == "shipped v1\n"
    assert line


def test_garbage_lines_are_refused_without_a_hang(graphrun, tmp_path) -> None:
    db = tmp_path / "fresh.db"
    cases = {
        "deep.jsonl": '{"format": "graphrun-export", "version": 2, "runs": ' + "[" * 100_000 + "\n",
        "deep2.jsonl": '{"format": "graphrun-export", "version": 2}\n'
        + '{"hash": "x", "event": '
        + "[" * 100_000
        + "\n",
        "bool.jsonl": '{"format": "graphrun-export", "version": true}\n',
        "runs.jsonl": '{"format": "graphrun-export", "version": 2, "runs": "abc"}\n',
        "trailer.jsonl": '{"format": "graphrun-export", "version": 2}\n{"trailer": 5}\n',
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        refused(import_into(graphrun, path, db))


def test_an_alias_bomb_in_a_recorded_graph_source_is_refused(graphrun, gate, tmp_path) -> None:
    """Import reads the run's recorded graph to check who answered: the bomb is refused
    there, quickly and in one line, and the database is left untouched."""
    _run_id, out = exported(
        graphrun, tmp_path, str(gate), "v1", "--as", "bob", "--answer", "review=approve"
    )
    lines = ['  a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 12):
        lines.append(f"  a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    bomb = GATE + "initial_state:\n" + "\n".join(lines) + "\n"
    crafted = Export(out)
    crafted.events[0]["graph_source"] = bomb
    crafted.events[0]["graph_hash"] = codec.content_hash(bomb)
    db = tmp_path / "fresh.db"
    res = import_into(graphrun, crafted.write(tmp_path / "bomb.run.jsonl"), db)
    assert res.code == 2, res.stderr
    assert "more than 200,000 values once aliases are expanded" in res.stderr
    assert "internal error" not in res.stderr
    assert graphrun("runs", "--db", str(db), "--json").stdout == ""
