"""``graphrun test`` and the pytest plugin: recorded runs as regression tests.

Runs are recorded for real (scripts as subprocesses, the LLM over HTTP on
127.0.0.1), exported, then the agent is edited: each edit must fail the suite
with a report naming the node and showing the change; reverting must pass.
"""

from __future__ import annotations

import io
import json
import shutil
import textwrap
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine.driver import Driver, RunOptions, drive, start_run
from graphrun.runtime.graph.loader import load_graph
from graphrun.runtime.replay.testing import run_suite
from graphrun.runtime.replay.transfer import write_export

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]

GRAPH = """
    version: "1.0"
    name: release-notes
    start: collect
    nodes:
      collect:
        type: script
        script: scripts/collect.sh
        next: write
      write:
        type: llm
        model: openai:gpt-test
        instructions: You write release notes.
        prompt: |
          Write one line about {{feature}}.
          Audience: {{initial_prompt}}
        state_updates:
          notes: "{{output}}"
        next: review
      review:
        type: approval
        question: "Publish these notes?"
        options: [publish, hold]
        routes:
          publish: published
          hold: held
        on_other: held
      published:
        type: end
        output: "published: {{notes}}"
      held:
        type: end
        output: "held"
"""
COLLECT = """
    #!/usr/bin/env bash
    echo '{"feature": "dark mode"}'
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")


@pytest.fixture
def recorded(tmp_path: Path, fake_llm, monkeypatch: pytest.MonkeyPatch) -> Path:  # type: ignore[no-untyped-def]
    """A project with an agent and one recorded run of it in replays/."""
    project = tmp_path / "project"
    agent_dir = project / "agents" / "release-notes"
    write(agent_dir / "graph.yaml", GRAPH)
    write(agent_dir / "scripts" / "collect.sh", COLLECT)
    monkeypatch.setenv("OPENAI_BASE_URL", fake_llm.url_openai)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    from tests.support.fake_llm import text

    fake_llm.script(text("Dark mode arrives for everyone."))
    store = SqliteStore(tmp_path / "record.db", create=True)
    run_id = start_run(store, load_graph(agent_dir), prompt="users")
    outcome = drive(Driver(store, run_id, RunOptions(answers={"review": ["publish"]})))
    assert outcome.status == "completed", outcome.error
    _drop_llm_connections()
    (project / "replays").mkdir()
    out = project / "replays" / "release-notes.run.jsonl"
    with out.open("w", encoding="utf-8") as fh:
        write_export(store, run_id, fh, relative_to=out.parent)
    store.close()
    # Replaying needs no network and no key.
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.delenv("OPENAI_API_KEY")
    return project


def _drop_llm_connections() -> None:
    """The llm node actor does not close its HTTP clients when it stops; stop the
    actors and collect them here so the leftover keep-alive socket is not reported
    as an unraisable warning in a later, unrelated test."""
    import gc
    import warnings

    import pykka

    pykka.ActorRegistry.stop_all(block=True, timeout=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def suite(*paths: Path) -> tuple[int, str]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        code = run_suite([str(p) for p in paths])
    return code, buf.getvalue()


EDITS = [
    # (what, file, old, new, node, shown in the report)
    (
        "prompt",
        "graph.yaml",
        "Write one line about {{feature}}.",
        "Write two lines about {{feature}}.",
        "write",
        ["-Write one line about dark mode.", "+Write two lines about dark mode."],
    ),
    (
        "route",
        "graph.yaml",
        "publish: published",
        "publish: held",
        "review",
        ["routed to 'held', recorded 'published'"],
    ),
    (
        "script output key",
        "scripts/collect.sh",
        '{"feature": "dark mode"}',
        '{"feature_name": "dark mode"}',
        "collect",
        ['-echo \'{"feature": "dark mode"}\'', '+echo \'{"feature_name": "dark mode"}\''],
    ),
    (
        "template",
        "graph.yaml",
        '"published: {{notes}}"',
        '"out: {{notes}}"',
        "published",
        ["-published: Dark mode arrives", "+out: Dark mode arrives"],
    ),
]


@pytest.mark.parametrize(
    ("what", "file", "old", "new", "node", "shown"), EDITS, ids=[e[0] for e in EDITS]
)
def test_an_edit_fails_the_suite_naming_the_node_and_reverting_passes(
    recorded: Path, what: str, file: str, old: str, new: str, node: str, shown: list[str]
) -> None:
    replays = recorded / "replays"
    code, out = suite(replays)
    assert code == 0, out
    assert out.endswith("1 passed, 0 failed\n")
    path = recorded / "agents" / "release-notes" / file
    original = path.read_text()
    assert old in original
    path.write_text(original.replace(old, new))
    code, out = suite(replays)
    assert code == 1, out
    assert out.startswith("FAIL ")
    assert f"node '{node}'" in out
    for fragment in shown:
        assert fragment in out, out
    assert out.endswith("0 passed, 1 failed\n")
    path.write_text(original)
    code, out = suite(replays)
    assert code == 0, out


def test_graphrun_test_cli_exit_codes_and_summary(recorded: Path, graphrun) -> None:  # type: ignore[no-untyped-def]
    ok = graphrun("test", str(recorded / "replays"))
    assert ok.code == 0, ok.stdout + ok.stderr
    lines = ok.stdout.splitlines()
    assert lines[0].startswith("PASS ") and "release-notes" in lines[0]
    assert lines[-1] == "1 passed, 0 failed"
    graph = recorded / "agents" / "release-notes" / "graph.yaml"
    graph.write_text(graph.read_text().replace("Publish these notes?", "Ship these notes?"))
    failed = graphrun("test", str(recorded / "replays"), "--json")
    assert failed.code == 1
    (case,) = failed.json_lines()
    assert case["ok"] is False  # type: ignore[index]
    assert case["divergence"]["node_id"] == "review"  # type: ignore[index]
    assert case["divergence"]["field"] == "question"  # type: ignore[index]
    empty = graphrun("test", str(recorded / "agents"))
    assert empty.code == 2 and "0 passed, 0 failed" in empty.stdout
    missing = graphrun("test", str(recorded / "nope"))
    assert missing.code == 2 and missing.stderr.startswith("error: no such file")


def test_default_path_is_replays(recorded: Path, graphrun) -> None:  # type: ignore[no-untyped-def]
    shutil.copytree(recorded, graphrun.tmp_path / "copy")
    # The fixture runs the CLI in tmp_path; `replays/` there is the copy's.
    shutil.move(str(graphrun.tmp_path / "copy" / "replays"), str(graphrun.tmp_path / "replays"))
    shutil.move(str(graphrun.tmp_path / "copy" / "agents"), str(graphrun.tmp_path / "agents"))
    result = graphrun("test")
    assert result.code == 0, result.stdout + result.stderr
    assert "1 passed, 0 failed" in result.stdout


def test_every_recorded_run_in_the_repository_replays() -> None:
    """replays/ keeps one file per export format version and the examples' runs."""
    replays = ROOT / "replays"
    assert (replays / "format-v1.run.jsonl").exists()
    header = json.loads((replays / "format-v1.run.jsonl").read_text().splitlines()[0])
    assert header["version"] == 1
    code, out = suite(replays)
    assert code == 0, out
    assert "FAIL" not in out and "format-v1" in out


def test_the_divergent_fixture_fails_naming_the_node(graphrun) -> None:  # type: ignore[no-untyped-def]
    result = graphrun("test", str(ROOT / "tests" / "data" / "divergent.run.jsonl"))
    assert result.code == 1
    assert "FAIL" in result.stdout and "node 'review'" in result.stdout
    assert "-File invoice-7 as finance?" in result.stdout
    assert "+Store invoice-7 in the finance folder?" in result.stdout
    assert result.stdout.endswith("0 passed, 1 failed\n")


def test_a_damaged_file_is_a_failure_not_a_crash(tmp_path: Path, graphrun) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.run.jsonl"
    bad.write_text('{"format": "something-else"}\n')
    result = graphrun("test", str(bad))
    assert result.code == 1
    assert "not a graphrun export file" in result.stdout and "Traceback" not in result.stderr


def test_pytest_plugin_collects_recorded_runs(recorded: Path, pytester: pytest.Pytester) -> None:
    shutil.copytree(recorded / "agents", pytester.path / "agents")
    shutil.copytree(recorded / "replays", pytester.path / "replays")
    result = pytester.runpytest("-p", "no:cacheprovider", "replays")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*release-notes.run.jsonl*"])
    graph = pytester.path / "agents" / "release-notes" / "graph.yaml"
    graph.write_text(graph.read_text().replace("publish: published", "publish: held"))
    result = pytester.runpytest("-p", "no:cacheprovider", "replays")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*recorded run * diverged*", "*node 'review'*"])
    (pytester.path / "replays" / "junk.run.jsonl").write_text("not json\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "replays/junk.run.jsonl")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*not a graphrun export file*"])
