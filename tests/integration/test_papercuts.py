"""Small things a new user trips over: each a clear message, the right stream, the
right database."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_human_nodes import APPROVAL, DRAFT, events
from tests.support.fake_llm import text

ROOT = Path(__file__).resolve().parents[2]

LLM_GATE = """
version: "1.0"
name: llmgate
start: write
nodes:
  write:
    type: llm
    model: openai:gpt-test
    prompt: "Write a title"
    state_updates:
      title: "{{output}}"
    next: review
  review:
    type: approval
    question: "Ship {{title}}?"
    options: [approve, reject]
    routes: {approve: done, reject: done}
    on_other: done
  done:
    type: end
    output: "{{title}}"
"""


def _gate(agent):  # type: ignore[no-untyped-def]
    path = agent(APPROVAL, DRAFT)
    (path / "scripts" / "draft.sh").chmod(0o755)
    return path


def test_export_into_a_missing_folder_creates_it(graphrun, agent, tmp_path):
    assert graphrun("run", str(_gate(agent)), "--answer", "review=approve").code == 0
    target = tmp_path / "new" / "deeper" / "run.jsonl"
    res = graphrun("export", "@last", "-o", str(target))
    assert res.code == 0, res.stderr
    assert target.read_text(encoding="utf-8").count("\n") > 5
    res = graphrun("export", "@last", "-o", str(tmp_path))
    assert res.code == 2
    assert res.stderr == f"error: -o {tmp_path}: is a directory (give a file name)\n"


def test_llm_replay_of_a_missing_file_says_so(graphrun, agent):
    res = graphrun("run", str(_gate(agent)), "--llm-replay", "missing.jsonl")
    assert res.code == 2
    assert res.stderr == (
        "error: --llm-replay missing.jsonl: no such file "
        "(give an exported run file (graphrun export RUN -o FILE) or a run id)\n"
    )


def test_an_unterminated_template_fails_validate_with_node_field_and_line(graphrun, agent):
    path = agent(APPROVAL.replace('"Ship {{title}}?"', '"Ship {{title?"'), DRAFT)
    res = graphrun("validate", str(path))
    assert res.code == 2
    assert res.stderr.startswith(
        f"error: {path}/graph.yaml:11 ($.nodes.review.question): unterminated template: "
        "'{{title?' has no closing '}}'"
    )


def test_replay_prints_the_result_on_stdout(graphrun, agent):
    assert graphrun("run", str(_gate(agent)), "--answer", "review=approve").code == 0
    res = graphrun("replay", "@last")
    assert res.code == 0, res.stderr
    assert res.stdout == "shipped v2.1 (approve)\n"


def test_resume_and_fork_check_the_model_key_as_run_does(graphrun, agent, fake_llm):
    fake_llm.script(text("v3"))
    env = {"OPENAI_BASE_URL": fake_llm.url_openai, "OPENAI_API_KEY": "sk-test"}
    res = graphrun("run", str(agent(LLM_GATE)), **env)
    assert res.code == 3, res.stderr
    run_id = graphrun.last_run()
    before = events(graphrun.db)
    for args in (
        ("resume", run_id, "--answer", "review=approve"),
        ("fork", run_id, "--at", "3", "--answer", "review=approve"),
    ):
        res = graphrun(*args)
        assert res.code == 2, res.stderr
        assert res.stderr.startswith("error: llm node 'write': "), res.stderr
        assert "OPENAI_API_KEY" in res.stderr
        assert events(graphrun.db) == before
    res = graphrun("resume", run_id, "--answer", "review=approve", **env)
    assert res.code == 0, res.stderr
    assert res.stdout == "v3\n"


@pytest.mark.skipif(
    subprocess.run(["make", "-q", ".venv/.installed"], cwd=ROOT, check=False).returncode != 0,
    reason="needs the installed .venv (make install)",
)
def test_make_demo_writes_to_the_database_the_next_commands_read(tmp_path):
    db = tmp_path / "default.db"
    env = {**os.environ, "GRAPHRUN_DB": str(db)}
    done = subprocess.run(
        ["make", "-s", "demo"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    listed = subprocess.run(
        [str(ROOT / ".venv/bin/graphrun"), "runs"], env=env, capture_output=True, text=True
    )
    assert "ticket-triage" in listed.stdout, listed.stdout + listed.stderr
