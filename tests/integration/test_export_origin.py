"""Exports say nothing about the machine a run was made on unless asked to."""

from __future__ import annotations

import getpass
import json
import socket
from pathlib import Path

from tests.integration.test_human_nodes import APPROVAL, DRAFT

ROOT = Path(__file__).resolve().parents[2]


def _lines(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_an_export_has_relative_paths_and_no_host_account_or_pid(graphrun, agent, tmp_path):
    path = agent(APPROVAL, DRAFT, name="gate")
    (path / "scripts" / "draft.sh").chmod(0o755)
    assert graphrun("run", str(path)).code == 3
    run_id = graphrun.last_run()
    # Answered by a claimed name: that stays; the OS account and host do not.
    assert graphrun("approve", run_id, "approve", "--as", "alice").code == 0
    out = tmp_path / "exports" / "gate.run.jsonl"
    res = graphrun("export", run_id, "-o", str(out))
    assert res.code == 0, res.stderr
    text = out.read_text(encoding="utf-8")
    lines = _lines(out)
    assert lines[0]["origin"] == "omitted"
    started = lines[1]["event"]
    assert (started["agent_dir"], started["graph_path"]) == ("../gate", "../gate/graph.yaml")
    for secret in (str(tmp_path), f'"{socket.gethostname()}"', f'"{getpass.getuser()}"'):
        assert secret not in text
    assert '"pid"' not in text and '"os_user"' not in text and '"host"' not in text
    answer = next(e["event"] for e in lines[1:] if e["event"]["type"] == "HumanInputReceived")
    assert answer["by"] == "alice"
    # The file verifies and replays in a fresh database, and the run it holds is
    # the same run as the original (importing it back is a no-op).
    fresh = str(tmp_path / "fresh.db")
    assert graphrun("import", str(out), "--db", fresh).code == 0
    assert graphrun("audit", run_id, "--verify", "--db", fresh).code == 0
    replayed = graphrun("replay", run_id, "--db", fresh)
    assert replayed.code == 0, replayed.stderr
    assert replayed.stdout == "shipped v2.1 (approve)\n"
    again = graphrun("import", str(out))
    assert again.code == 0, again.stderr
    assert again.stdout == f"present: {run_id}\n"
    assert graphrun("test", str(out)).code == 0
    # --with-origin keeps everything as stored.
    full = tmp_path / "full.run.jsonl"
    assert graphrun("export", run_id, "-o", str(full), "--with-origin").code == 0
    kept = _lines(full)
    assert "origin" not in kept[0]
    assert kept[1]["event"]["agent_dir"] == str(path.resolve())
    assert kept[1]["event"]["host"] == socket.gethostname()


def test_old_exports_still_import_and_replay(graphrun):
    old = ROOT / "replays" / "format-v1.run.jsonl"
    res = graphrun("import", str(old))
    assert res.code == 0, res.stderr
    run_id = res.stdout.split(": ")[1].strip()
    assert graphrun("replay", run_id).code == 0
