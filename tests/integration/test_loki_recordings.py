"""Recorded runs of Loki-configured agents replay without the configuration directory.

A Loki graph (or config.yaml agent) that names no model takes config.yaml's: a
recording made with the configuration replays on a checkout without it (CI), the
model being the one the log holds; ``--loki-dir`` loads the graphs with it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import GraphrunCli
from tests.integration.test_loki_config import DATA, KEY, run_env
from tests.support.fake_llm import FakeLlm, text, tool_calls


def _record(graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path) -> tuple[Path, Path]:
    """Runs of scribe (graph agent) and writer (config.yaml agent), exported next to a
    copy of the agents, as a project keeps them."""
    project = tmp_path / "project"
    loki = project / "loki"
    shutil.copytree(DATA, loki)
    env = run_env(fake_llm, loki)
    fake_llm.script(
        tool_calls(("fs_write", {"path": str(tmp_path / "a.txt"), "contents": "x"})),
        text("written"),
        text("plain answer"),
    )
    assert graphrun("run", "scribe", "go", **env).code == 0
    assert graphrun("run", "writer", "hello", **env).code == 0
    recordings = project / "recordings"
    recordings.mkdir()
    rows = graphrun("runs", "--json").json_lines()
    for row in rows:
        name = f"{row['graph']}.run.jsonl"  # type: ignore[index]
        out = graphrun("export", row["run_id"], "-o", str(recordings / name))  # type: ignore[index]
        assert out.code == 0, out.stderr
    return loki, recordings


def test_a_recording_replays_without_the_config_dir_and_with_loki_dir(
    graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    loki, recordings = _record(graphrun, fake_llm, tmp_path)

    # No configuration here (the isolated environment's config dir does not exist).
    bare = graphrun("test", str(recordings), LOKI_TEST_API_KEY=KEY)
    assert bare.code == 0, bare.stdout + bare.stderr
    assert bare.stdout.strip().endswith("2 passed, 0 failed")
    assert "model changed" not in bare.stdout

    flagged = graphrun("test", "--loki-dir", str(loki), str(recordings), LOKI_TEST_API_KEY=KEY)
    assert flagged.code == 0, flagged.stdout + flagged.stderr

    # A changed graph is still a divergence without the config dir.
    graph = loki / "agents" / "scribe" / "graph.yaml"
    graph.write_text(graph.read_text().replace('"{{initial_prompt}}"', '"say: {{initial_prompt}}"'))
    changed = graphrun("test", str(recordings))
    assert changed.code == 1
    assert "FAIL" in changed.stdout and "scribe" in changed.stdout


def test_the_pytest_plugin_takes_loki_dir(
    graphrun: GraphrunCli, fake_llm: FakeLlm, tmp_path: Path
) -> None:
    loki, recordings = _record(graphrun, fake_llm, tmp_path)
    for extra in ([], ["--loki-dir", str(loki)]):
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, "."],
            cwd=recordings,
            env=graphrun.env(LOKI_TEST_API_KEY=KEY),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "2 passed" in proc.stdout
