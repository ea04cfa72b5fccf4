"""`graphrun logs` (Markdown) and `graphrun tail` (watching a run another process drives)."""

from __future__ import annotations

import os
import time

from tests.conftest import ROOT, GraphrunCli

TWO_STEPS = """
name: two-steps
version: "1.0"
start: first
nodes:
  first:
    type: script
    script: scripts/wait.sh
    next: second
  second:
    type: script
    script: scripts/wait.sh
    next: done
  done: {type: end, output: "ok"}
"""
WAIT_SH = """
    #!/usr/bin/env bash
    sleep 1.5
    echo '{}'
"""


def test_logs_prints_prompts_and_responses_as_markdown(graphrun: GraphrunCli):
    graphrun("import", str(ROOT / "replays" / "research-desk.run.jsonl"))
    rows = graphrun("runs", "--json").json_lines()
    parent = next(r["run_id"] for r in rows if not r["parent_run_id"])  # type: ignore[index]
    res = graphrun("logs", parent)
    assert res.code == 0, res.stderr
    out = res.stdout
    assert out.startswith(f"# Run {parent}\n")
    assert "## research-desk › plan #1" in out
    assert "## fact-finder › find #1" in out and "### tool call: search_archive" in out
    assert "### system\n\nYou are the editor of a research desk." in out
    assert "### response\n\nHow well do air-source heat pumps perform" in out
    # The second turn of the tool loop shows only what is new (the tool results).
    assert out.count("### system\n\nYou are the fact-finder") == 1
    usage = graphrun("logs", parent, "--usage").stdout
    assert usage == f"# Run {parent}\n\n## Usage\n\n" + out.split("## Usage\n\n", 1)[1]
    assert "1184 tokens (881 in, 303 out), 6 calls" in usage


def test_tail_follows_a_run_to_its_end(graphrun: GraphrunCli, agent):
    root = agent(TWO_STEPS, {"scripts/wait.sh": WAIT_SH})
    os.chmod(root / "scripts" / "wait.sh", 0o755)
    runner = graphrun.popen("run", str(root), "go")
    try:
        deadline = time.monotonic() + 30
        run_id = None
        while run_id is None and time.monotonic() < deadline:
            rows = graphrun("runs", "--json").json_lines() if graphrun.db.exists() else []
            run_id = rows[0]["run_id"] if rows else None  # type: ignore[index]
            time.sleep(0.1)
        assert run_id is not None
        watched = graphrun("tail", run_id, "--interval", "0.2", timeout=60)
    finally:
        runner.communicate(timeout=60)
    assert runner.returncode == 0
    assert watched.code == 0, watched.stderr
    lines = watched.stderr.splitlines()
    assert "▸ second (script)" in lines and "▸ second -> done" in lines
    assert lines[-1].startswith("▸ graph done in ")


def test_tail_and_report_watch_of_a_waiting_run_stop(graphrun: GraphrunCli, agent, tmp_path):
    root = agent(
        """
        name: gate
        version: "1.0"
        start: review
        nodes:
          review:
            type: approval
            question: "Ship it?"
            options: [approve, reject]
            routes: {approve: done, reject: done}
            on_other: done
          done: {type: end, output: "ok"}
        """
    )
    assert graphrun("run", str(root), "go").code == 3
    res = graphrun("tail", graphrun.last_run(), "--interval", "0.1")
    assert res.code == 3
    assert res.stderr.splitlines()[-1].endswith("waits for an answer at review")
    out = tmp_path / "r.html"
    res = graphrun("report", graphrun.last_run(), "-o", str(out), "--watch", "0.1", timeout=30)
    assert res.code == 3, res.stderr  # as `tail`
    assert res.stderr.splitlines()[-1].endswith("waits for an answer: stopped watching")
    assert res.stderr.count(f"wrote {out}") == 1


def test_report_watch_rewrites_until_the_run_ends(graphrun: GraphrunCli, agent, tmp_path):
    root = agent(TWO_STEPS, {"scripts/wait.sh": WAIT_SH})
    os.chmod(root / "scripts" / "wait.sh", 0o755)
    runner = graphrun.popen("run", str(root), "go")
    out = tmp_path / "live.html"
    try:
        deadline = time.monotonic() + 30
        run_id = None
        while run_id is None and time.monotonic() < deadline:
            rows = graphrun("runs", "--json").json_lines() if graphrun.db.exists() else []
            run_id = rows[0]["run_id"] if rows else None  # type: ignore[index]
            time.sleep(0.1)
        assert run_id is not None
        first = graphrun("report", run_id, "-o", str(out))
        assert first.code == 0, first.stderr
        assert "in progress" in out.read_text()
        watched = graphrun("report", run_id, "-o", str(out), "--watch", "0.2", timeout=60)
    finally:
        runner.communicate(timeout=60)
    assert watched.code == 0, watched.stderr
    final = out.read_text()
    assert "in progress" not in final and 'http-equiv="refresh"' not in final
    assert 'class="st-completed">completed' in final
    assert watched.stderr.count(f"wrote {out}") >= 2
    bad = graphrun("report", run_id, "-o", str(out), "--watch", "0")
    assert (bad.code, bad.stderr) == (
        2,
        "error: --watch 0: the interval must be more than 0 seconds\n",
    )
