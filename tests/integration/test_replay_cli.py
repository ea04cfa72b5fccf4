"""``graphrun replay``, ``export``/``import``, ``fork``, ``show --at`` and ``diff``
through the real CLI, on real runs of real agents (scripts run as subprocesses)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

APPROVAL_AGENT = """
    version: "1.0"
    name: shipit
    start: build
    nodes:
      build:
        type: script
        script: scripts/build.sh
        next: review
      review:
        type: approval
        question: "Ship {{artifact}}?"
        options: [approve, reject]
        routes:
          approve: shipped
          reject: held
        on_other: held
      shipped:
        type: end
        output: "shipped {{artifact}}"
      held:
        type: end
        output: "held {{artifact}}"
"""
BUILD_SH = """
    #!/usr/bin/env bash
    echo '{"artifact": "app-1.2"}'
"""


@pytest.fixture
def shipit(agent):  # type: ignore[no-untyped-def]
    return agent(APPROVAL_AGENT, {"scripts/build.sh": BUILD_SH}, name="shipit")


def last_run(graphrun) -> str:  # type: ignore[no-untyped-def]
    return graphrun.last_run()


def test_replay_of_a_completed_run_matches(graphrun, shipit) -> None:  # type: ignore[no-untyped-def]
    ran = graphrun("run", str(shipit), "go", "--answer", "review=approve")
    assert ran.code == 0, ran.stderr
    run_id = last_run(graphrun)
    replayed = graphrun("replay", run_id)
    assert replayed.code == 0, replayed.stdout + replayed.stderr
    assert f"ok: run {run_id}" in replayed.stderr
    assert "run completed" in replayed.stderr
    data = graphrun("replay", run_id, "--json").json()
    assert data["runs"][0]["ok"] is True
    assert data["runs"][0]["effects"] == 2  # ScriptFinished + HumanInputReceived


def _rechain(db: sqlite3.Connection, run_id: str) -> None:
    """Recompute the hash chain after an edit, so the log verifies (as a log written
    by an older decider would) and only the decision differs."""
    from graphrun.eventstore import codec

    prev = codec.GENESIS
    rows = db.execute(
        "SELECT seq, CAST(body AS BLOB) FROM run_events WHERE run_id=? ORDER BY seq", (run_id,)
    ).fetchall()
    for seq, body in rows:
        digest = codec.chain_hash(prev, body)
        db.execute(
            "UPDATE events SET hash=? WHERE id = (SELECT id FROM run_events "
            "WHERE run_id=? AND seq=?)",
            (digest, run_id, seq),
        )
        prev = digest
    # ... and the runs table says what the edited events say.
    from graphrun.eventstore.store import SqliteStore

    db.commit()
    with SqliteStore(db.execute("PRAGMA database_list").fetchone()[2]) as store:
        store.rebuild_runs()


def test_replay_reports_a_changed_decider_outcome(graphrun, shipit) -> None:  # type: ignore[no-untyped-def]
    """A log whose recorded decision no longer follows: the report names node, seq,
    event type, recorded vs now and a diff (the log is edited directly in SQLite,
    as a decider change would look)."""
    graphrun("run", str(shipit), "go", "--answer", "review=approve")
    run_id = last_run(graphrun)
    with sqlite3.connect(graphrun.db) as db:
        row = db.execute(
            "SELECT seq, body FROM run_events WHERE run_id=? AND type = 'RunCompleted'", (run_id,)
        ).fetchone()
        body = json.loads(row[1])
        body["output"] = "shipped something else"
        db.execute(
            "UPDATE events SET body=? WHERE id = (SELECT id FROM run_events "
            "WHERE run_id=? AND seq=?)",
            (json.dumps(body).encode(), run_id, row[0]),
        )
        _rechain(db, run_id)
    replayed = graphrun("replay", run_id)
    assert replayed.code == 1
    out = replayed.stdout
    assert f"DIVERGED: run {run_id}" in out
    assert f"seq {row[0]} (RunCompleted)" in out
    assert "node 'shipped'" in out
    assert "-shipped something else" in out and "+shipped app-1.2" in out


def test_waiting_run_replays_with_a_note_then_resumed_run_replays(graphrun, shipit) -> None:  # type: ignore[no-untyped-def]
    waiting = graphrun("run", str(shipit), "go")
    assert waiting.code == 3
    run_id = last_run(graphrun)
    replayed = graphrun("replay", run_id)
    assert replayed.code == 0
    assert "waiting for a person at node 'review'" in replayed.stderr
    approved = graphrun("approve", run_id, "reject", "--as", "bob")
    assert approved.code == 0, approved.stderr
    assert "held app-1.2" in approved.stdout
    events = graphrun("events", run_id, "--json").json_lines()
    assert any(e["type"] == "RunResumed" for e in events)  # type: ignore[index]
    replayed = graphrun("replay", run_id)
    assert replayed.code == 0, replayed.stdout
    assert "run completed" in replayed.stderr


def test_cancelled_run_replays(graphrun, shipit) -> None:  # type: ignore[no-untyped-def]
    graphrun("run", str(shipit), "go")
    run_id = last_run(graphrun)
    assert graphrun("cancel", run_id, "--as", "carol").code == 0
    replayed = graphrun("replay", run_id)
    assert replayed.code == 0, replayed.stdout
    assert "run cancelled" in replayed.stderr


def test_timed_out_run_replays(graphrun, agent) -> None:  # type: ignore[no-untyped-def]
    slow = agent(
        """
        version: "1.0"
        name: slow
        start: wait
        settings: {timeout: 0.5}
        nodes:
          wait: {type: script, script: wait.sh, next: done}
          done: {type: end, output: done}
        """,
        {"wait.sh": "sleep 5\necho '{}'\n"},
    )
    ran = graphrun("run", str(slow))
    assert ran.code == 1
    run_id = last_run(graphrun)
    types = [e["type"] for e in graphrun("events", run_id, "--json").json_lines()]  # type: ignore[index]
    assert "TimeoutFired" in types
    replayed = graphrun("replay", run_id)
    assert replayed.code == 0, replayed.stdout
    assert "run failed" in replayed.stderr


def test_failed_effect_replays(graphrun, agent, shipit, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """An effect that raises (an LLM call with no recorded response to serve) fails
    its node: NodeFailed right after the request, then RunFailed. Replay reproduces it."""
    graphrun("run", str(shipit), "go", "--answer", "review=approve")
    recording = tmp_path / "no-llm.run.jsonl"
    graphrun("export", last_run(graphrun), "-o", str(recording))
    llm = agent(
        """
        version: "1.0"
        name: asks
        start: ask
        nodes:
          ask: {type: llm, model: "openai:gpt-test", prompt: "Say {{initial_prompt}}", next: done}
          done: {type: end, output: done}
        """
    )
    ran = graphrun("run", str(llm), "hi", "--llm-replay", str(recording))
    assert ran.code == 1
    run_id = last_run(graphrun)
    types = [e["type"] for e in graphrun("events", run_id, "--json").json_lines()]  # type: ignore[index]
    assert types == ["RunStarted", "NodeEntered", "NodeFailed", "RunFailed"]
    replayed = graphrun("replay", run_id)
    assert replayed.code == 0, replayed.stdout
    assert "run failed" in replayed.stderr


def test_export_import_into_a_fresh_database_replays_identically(
    graphrun, shipit, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    graphrun("run", str(shipit), "go", "--answer", "review=approve")
    run_id = last_run(graphrun)
    out = tmp_path / "shipit.run.jsonl"
    assert graphrun("export", run_id, "-o", str(out), "--with-origin").code == 0
    header = json.loads(out.read_text().splitlines()[0])
    assert header["format"] == "graphrun-export" and header["version"] == 2
    assert header["agent_dirs"][run_id] == "shipit"
    assert header["sources"][run_id]["scripts/build.sh"].startswith("#!/usr/bin/env bash")
    fresh = str(tmp_path / "fresh.db")
    imported = graphrun("import", str(out), "--db", fresh)
    assert imported.code == 0, imported.stderr
    assert f"imported: {run_id}" in imported.stdout
    original = graphrun("events", run_id, "--json").stdout
    assert graphrun("events", run_id, "--json", "--db", fresh).stdout == original
    replayed = graphrun("replay", run_id, "--db", fresh, "--json").json()
    assert replayed["runs"][0]["ok"] is True
    assert graphrun("audit", run_id, "--verify", "--db", fresh).code == 0
    # An edited file is refused, naming the line.
    lines = out.read_text().splitlines()
    edited = next(i for i, line in enumerate(lines) if i > 0 and "review" in line)
    lines[edited] = lines[edited].replace("review", "revue")
    bad = tmp_path / "bad.run.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    refused = graphrun("import", str(bad), "--db", str(tmp_path / "other.db"))
    assert refused.code == 2
    assert f"bad.run.jsonl:{edited + 1}" in refused.stderr
    assert "does not match its hash" in refused.stderr and "Traceback" not in refused.stderr


def test_fork_at_a_human_decision_with_another_answer(graphrun, shipit) -> None:  # type: ignore[no-untyped-def]
    graphrun("run", str(shipit), "go", "--answer", "review=approve")
    source = last_run(graphrun)
    events = graphrun("events", source, "--json").json_lines()
    asked = next(e["seq"] for e in events if e["type"] == "HumanInputRequested")  # type: ignore[index]
    forked = graphrun("fork", source, "--at", str(asked), "--answer", "review=reject")
    assert forked.code == 0, forked.stderr
    assert "held app-1.2" in forked.stdout
    new_id = forked.stderr.split(" as ")[1].split()[0]
    first = graphrun("events", new_id, "--json").json_lines()[0]
    assert first["forked_from"] == source and first["forked_at"] == asked  # type: ignore[index]
    shown = graphrun("show", new_id)
    assert f"forked from run {source} at seq {asked}" in shown.stdout
    assert graphrun("show", new_id, "--json").json()["forked_from"] == source  # type: ignore[index]
    # The fork replays like any run.
    assert graphrun("replay", new_id).code == 0
    # Where the runs part ways: the answer, then the route and the output.
    diff = graphrun("diff", source, new_id)
    assert diff.code == 1
    assert "node 'review' visit 1" in diff.stdout
    assert "a=approve" in diff.stdout and "b=reject" in diff.stdout
    assert "node 'held' visit 1: only in b" in diff.stdout
    same = graphrun("diff", source, source)
    assert same.code == 0 and "made the same decisions" in same.stdout


def test_fork_refuses_a_seq_that_splits_a_step_or_after_the_end(graphrun, shipit) -> None:  # type: ignore[no-untyped-def]
    graphrun("run", str(shipit), "go", "--answer", "review=approve")
    source = last_run(graphrun)
    events = graphrun("events", source, "--json").json_lines()
    last = events[-1]["seq"]  # type: ignore[index]
    split = graphrun(
        "fork", source, "--at", str(last - 1)
    )  # between NodeCompleted and RunCompleted
    assert split.code == 2 and "splits the decisions" in split.stderr
    ended = graphrun("fork", source, "--at", str(last))
    assert ended.code == 2 and "already completed" in ended.stderr
    outside = graphrun("fork", source, "--at", "999")
    assert outside.code == 2 and "outside run" in outside.stderr


def test_show_at_any_seq(graphrun, shipit) -> None:  # type: ignore[no-untyped-def]
    graphrun("run", str(shipit), "go", "--answer", "review=approve")
    run_id = last_run(graphrun)
    at3 = graphrun("show", run_id, "--at", "3", "--json").json()
    assert at3["status"] == "running" and at3["current_node"] == "build"  # type: ignore[index]
    assert "artifact" not in at3["state"]  # type: ignore[index]
    at4 = graphrun("show", run_id, "--at", "4", "--json").json()
    assert at4["state"]["artifact"] == "app-1.2"  # type: ignore[index]
    text = graphrun("show", run_id, "--at", "6").stdout
    assert "waiting at: review" in text


def test_regression_with_a_changed_script_reports_and_live_rerun_records(
    graphrun, shipit, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    graphrun("run", str(shipit), "go", "--answer", "review=approve")
    run_id = last_run(graphrun)
    changed = tmp_path / "shipit-v2"
    changed.mkdir()
    (changed / "scripts").mkdir()
    (changed / "graph.yaml").write_text((shipit / "graph.yaml").read_text())
    (changed / "scripts" / "build.sh").write_text(
        '#!/usr/bin/env bash\necho \'{"artifact": "app-2.0"}\'\n'
    )
    same = graphrun("replay", run_id, "--graph", str(shipit))
    assert same.code == 0, same.stdout
    report = graphrun("replay", run_id, "--graph", str(changed))
    assert report.code == 1
    assert "node 'build'" in report.stdout and "scripts/build.sh changed" in report.stdout
    live = graphrun("replay", run_id, "--graph", str(changed), "--live", "--json")
    assert live.code == 1
    data = live.json()
    assert data["live"]["performed"] == ["build#1 (script changed)", "review#1 (request changed)"]
    new_id = data["live"]["run_id"]
    # The new run ran the new script for real, then waits: the question changed.
    assert data["live"]["status"] == "waiting"
    state = graphrun("show", new_id, "--json").json()["state"]  # type: ignore[index]
    assert state["artifact"] == "app-2.0"
    # A change that leaves requests alone reuses every recorded effect.
    (changed / "scripts" / "build.sh").write_text((shipit / "scripts" / "build.sh").read_text())
    graph = (
        (shipit / "graph.yaml").read_text().replace('"shipped {{artifact}}"', '"out: {{artifact}}"')
    )
    (changed / "graph.yaml").write_text(graph)
    live2 = graphrun("replay", run_id, "--graph", str(changed), "--live", "--json").json()
    assert live2["live"]["performed"] == []
    assert live2["live"]["reused"] == ["build#1", "review#1"]
    assert live2["live"]["output"] == "out: app-1.2"


def test_replay_of_unknown_run_is_one_line(graphrun, shipit) -> None:  # type: ignore[no-untyped-def]
    graphrun("run", str(shipit), "go", "--answer", "review=approve")
    missing = graphrun("replay", "zzzzzz")
    assert missing.code == 2
    assert missing.stderr.startswith("error:") and "Traceback" not in missing.stderr
    live = graphrun("replay", last_run(graphrun), "--live")
    assert live.code == 2 and "--live and --update need --graph" in live.stderr
