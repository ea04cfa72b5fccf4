"""``graph`` pictures: SVG and HTML for every shipped example (Graphviz), and a run's
visits counted for a map's branch node (one per item)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").iterdir() if (p / "graph.yaml").exists())


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz (make test installs it)")
@pytest.mark.parametrize("example", EXAMPLES)
@pytest.mark.parametrize("fmt", ["svg", "html"])
def test_every_example_draws_as_svg_and_html(graphrun, example, fmt, tmp_path):
    out = tmp_path / f"{example}.{fmt}"
    agents = ROOT / "examples" / example / "agents"
    extra = ["--agents-dir", str(agents)] if agents.is_dir() else []
    res = graphrun(
        "graph", str(ROOT / "examples" / example), "--format", fmt, "-o", str(out), *extra
    )
    assert res.code == 0, res.stderr
    text = out.read_text(encoding="utf-8")
    assert "<svg" in text
    assert "</svg>" in text


def test_dot_gives_every_node_a_shape_attribute(graphrun):
    res = graphrun("graph", str(ROOT / "examples" / "ticket-triage"), "--format", "dot")
    assert res.code == 0, res.stderr
    for line in res.stdout.splitlines():
        if "[label=" in line and "->" not in line:
            assert re.search(r", shape=\w+", line), line
            assert ", box" not in line


def test_graph_run_counts_a_maps_branch_visits(graphrun):
    assert graphrun("import", str(ROOT / "replays" / "source-survey.run.jsonl")).code == 0
    run_id = graphrun.last_run()
    events = graphrun("events", run_id, "--json").json_lines()
    items = {
        e["branch"]  # type: ignore[index]
        for e in events
        if str(e.get("branch", "")).startswith("survey[")  # type: ignore[union-attr]
    }
    assert len(items) >= 2
    res = graphrun("graph", str(ROOT / "examples" / "source-survey"), "--run", run_id)
    assert res.code == 0, res.stderr
    branch_line = next(
        line for line in res.stdout.splitlines() if "answer_one" in line and "×" in line
    )
    assert f"×{len(items)}" in branch_line
