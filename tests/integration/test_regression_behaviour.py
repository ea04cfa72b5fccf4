"""Recorded runs as regression tests that follow behaviour, through the real CLI.

A script is judged by what it does: a comment or a reformat passes, a changed
output fails with the output diff and the script diff; ``graphrun test --update``
re-records the run without any API key when no LLM request changed; a replay
lists every divergence of a run, not only the first.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.fake_llm import http_error, text

GRAPH = """
    version: "1.0"
    name: digest
    start: summarize
    nodes:
      summarize:
        type: llm
        model: openai:gpt-4o-mini
        prompt: "Summarize: {{initial_prompt}}"
        state_updates:
          summary: "{{output}}"
        next: label
      label:
        type: script
        script: scripts/label.py
        next: done
      done:
        type: end
        output: "{{label}}: {{summary}}"
"""
LABEL = """
    import json, os
    state = json.loads(os.environ["GRAPH_STATE"])
    print(json.dumps({"label": "short" if len(state["summary"]) < 40 else "long"}))
"""


def _record(graphrun, agent, fake_llm) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    root = agent(GRAPH, {"scripts/label.py": LABEL}, name="digest")
    fake_llm.script(text("Ovens heat stones."))
    env = {"OPENAI_BASE_URL": fake_llm.url_openai, "OPENAI_API_KEY": "sk-test"}
    ran = graphrun("run", str(root), "bread ovens", **env)
    assert ran.code == 0, ran.stderr
    assert ran.stdout.strip() == "short: Ovens heat stones."
    export = graphrun.tmp_path / "replays" / "digest.run.jsonl"
    export.parent.mkdir()
    out = graphrun("export", graphrun.last_run(), "-o", str(export))
    assert out.code == 0, out.stderr
    return root, export


def _offline(graphrun, *args: str, **extra: str):  # type: ignore[no-untyped-def]
    """``graphrun`` with no model key (and no server unless given)."""
    env = graphrun.env()
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY"):
        env.pop(name, None)
    env.update(extra)
    import subprocess
    import sys

    from tests.conftest import Result

    proc = subprocess.run(
        [sys.executable, "-m", "graphrun.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=graphrun.tmp_path,
        timeout=60,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def test_a_comment_or_reformat_passes_a_changed_output_fails_with_both_diffs(
    graphrun, agent, fake_llm
) -> None:  # type: ignore[no-untyped-def]
    root, export = _record(graphrun, agent, fake_llm)
    script = root / "scripts" / "label.py"
    assert _offline(graphrun, "test", str(export)).code == 0

    # A comment and a reformat change the file, not what it prints.
    script.write_text(
        "# Label a summary by its length.\nimport json\nimport os\n\n"
        'state = json.loads(os.environ["GRAPH_STATE"])\n'
        'label = "short" if len(state["summary"]) < 40 else "long"\n'
        'print(json.dumps({"label": label}))\n'
    )
    same = _offline(graphrun, "test", str(export))
    assert same.code == 0, same.stdout
    assert "script scripts/label.py changed; re-run offline" in same.stdout

    # Another output: a divergence with the output diff and the script diff.
    script.write_text(script.read_text().replace('"short"', '"brief"'))
    changed = _offline(graphrun, "test", str(export))
    assert changed.code == 1, changed.stdout
    report = changed.stdout
    assert "node 'label'" in report
    assert '-  "label": "short"' in report and '+  "label": "brief"' in report
    assert "script file scripts/label.py changed" in report
    assert '+label = "brief"' in report and "-import json, os" in report  # the script diff
    assert "duration_ms" not in report and "script_hash" not in report


def test_update_re_records_without_an_api_key_then_test_passes(graphrun, agent, fake_llm) -> None:  # type: ignore[no-untyped-def]
    root, export = _record(graphrun, agent, fake_llm)
    script = root / "scripts" / "label.py"
    script.write_text(script.read_text().replace('"short"', '"brief"'))
    before = export.read_text()
    assert _offline(graphrun, "test", str(export)).code == 1

    dry = _offline(graphrun, "test", "--update", "--dry-run", str(export))
    assert dry.code == 1 and "WOULD UPDATE" in dry.stdout and "label" in dry.stdout
    assert export.read_text() == before  # a dry run writes nothing

    requests = len(fake_llm.requests)
    updated = _offline(graphrun, "test", "--update", str(export))
    assert updated.code == 0, updated.stdout + updated.stderr
    assert "UPDATED" in updated.stdout and "label#1 (script changed)" in updated.stdout
    assert len(fake_llm.requests) == requests  # the unchanged LLM call was reused
    rerun = _offline(graphrun, "test", str(export))
    assert rerun.code == 0, rerun.stdout
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    outputs = [
        line["event"].get("output")
        for line in lines
        if "event" in line and line["event"]["type"] == "RunCompleted"
    ]
    assert outputs == ["brief: Ovens heat stones."]


def test_update_performs_only_a_changed_llm_request_and_refuses_when_it_fails(
    graphrun, agent, fake_llm
) -> None:  # type: ignore[no-untyped-def]
    root, export = _record(graphrun, agent, fake_llm)
    graph = root / "graph.yaml"
    graph.write_text(graph.read_text().replace("Summarize:", "Summarize briefly:"))
    before = export.read_text()
    # The changed request is made (with no key: the provider refuses it).
    fake_llm.script(http_error(401, "invalid api key"))
    requests = len(fake_llm.requests)
    updated = _offline(
        graphrun, "test", "--update", str(export), OPENAI_BASE_URL=fake_llm.url_openai
    )
    assert updated.code == 1, updated.stdout
    assert len(fake_llm.requests) == requests + 1  # only the changed call was made
    assert "NOT UPDATED" in updated.stdout and "the file is unchanged" in updated.stdout
    assert "401" in updated.stdout
    assert export.read_text() == before


def test_every_divergence_of_a_run_is_reported(graphrun, agent, fake_llm) -> None:  # type: ignore[no-untyped-def]
    root, export = _record(graphrun, agent, fake_llm)
    graph = root / "graph.yaml"
    graph.write_text(
        graph.read_text()
        .replace("Summarize:", "Summarize briefly:")
        .replace('output: "{{label}}: {{summary}}"', 'output: "{{label}} - {{summary}}"')
    )
    found = _offline(graphrun, "test", str(export))
    assert found.code == 1
    report = found.stdout
    assert "2 divergences, in summarize, done" in report
    assert "[1]" in report and "[2]" in report
    assert "-Summarize: bread ovens" in report and "+Summarize briefly: bread ovens" in report
    data = _offline(graphrun, "replay", "--help")
    assert data.code == 0


def test_update_keeps_a_reused_child_agent_as_the_new_runs_child(graphrun, agent) -> None:  # type: ignore[no-untyped-def]
    """A parent whose script changed is re-recorded; its child agent's request did not
    change, so the recorded child run is served, and the file keeps it, as the new
    run's child. The file then replays, and updates again."""
    agents = graphrun.tmp_path / "agents"
    agent(
        """
        name: counter
        version: "1.0"
        start: count
        nodes:
          count:
            type: script
            script: scripts/count.py
            next: done
          done:
            type: end
            output: "counted {{n}}"
        """,
        {"scripts/count.py": 'import json\nprint(json.dumps({"n": 3}))\n'},
        name="agents/counter",
    )
    root = agent(
        """
        name: boss
        version: "1.0"
        start: ask
        nodes:
          ask:
            type: agent
            agent: counter
            prompt: "{{initial_prompt}}"
            state_updates:
              got: "{{output}}"
            next: label
          label:
            type: script
            script: scripts/label.py
            next: done
          done:
            type: end
            output: "{{label}}: {{got}}"
        """,
        {"scripts/label.py": 'import json\nprint(json.dumps({"label": "old"}))\n'},
        name="boss",
    )
    ran = _offline(graphrun, "run", str(root), "go", "--agents-dir", str(agents))
    assert ran.code == 0, ran.stderr
    assert ran.stdout.strip() == "old: counted 3"
    export = graphrun.tmp_path / "replays" / "boss.run.jsonl"
    export.parent.mkdir()
    listed = _offline(graphrun, "runs", "--json").stdout.splitlines()
    top = next(r for r in map(json.loads, listed) if r["parent_run_id"] is None)["run_id"]
    assert _offline(graphrun, "export", top, "-o", str(export)).code == 0
    old_header = json.loads(export.read_text().splitlines()[0])
    old_top, old_child = old_header["runs"]

    label = root / "scripts" / "label.py"
    label.write_text(label.read_text().replace('"old"', '"new"'))
    assert _offline(graphrun, "test", str(export)).code == 1
    updated = _offline(graphrun, "test", "--update", str(export))
    assert updated.code == 0, updated.stdout + updated.stderr
    assert "UPDATED" in updated.stdout and "label#1 (script changed)" in updated.stdout

    lines = [json.loads(line) for line in export.read_text().splitlines()]
    new_top, child = lines[0]["runs"]
    assert new_top != old_top and child == old_child  # the recorded child, kept
    starts = {
        line["event"]["run_id"]: line["event"]
        for line in lines
        if "event" in line and line["event"]["type"] == "RunStarted"
    }
    assert starts[child]["parent_run_id"] == new_top
    outputs = [
        line["event"]["output"]
        for line in lines
        if "event" in line and line["event"]["type"] == "RunCompleted"
    ]
    assert sorted(outputs) == ["counted 3", "new: counted 3"]
    again = _offline(graphrun, "test", str(export))
    assert again.code == 0, again.stdout
    assert _offline(graphrun, "test", "--update", str(export)).code == 0  # nothing to do
