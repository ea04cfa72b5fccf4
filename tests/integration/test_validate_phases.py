"""``graphrun validate`` reports every error of every phase at once, and takes a Loki
configuration directory as it is (``--loki-dir``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import GraphrunCli, write_agent

DATA = Path(__file__).resolve().parents[1] / "data" / "loki"


def test_schema_errors_do_not_hide_semantic_ones(graphrun: GraphrunCli, tmp_path: Path) -> None:
    agent = write_agent(
        tmp_path / "broken",
        """\
        name: broken
        version: "1.0"
        start: ask
        nodes:
          ask:
            type: llm
            prompt: "{{initial_prompt}}"
            next: tidy
          tidy:
            type: script
            script: tidy.sh
            timeout: soon
            next: done
          done:
            type: end
            next: nowhere
        """,
    )
    result = graphrun("validate", str(agent))
    assert result.code == 2
    graph = agent / "graph.yaml"
    assert result.stderr.splitlines() == [
        # the model phase, the schema phase and the graph rules, in file order
        f"error: {graph}:5 ($.nodes.ask): llm node 'ask' has no model and the graph sets "
        "none (set model: provider:model on the node or graph)",
        f"error: {graph}:12 ($.nodes.tidy.timeout): expected float, got str",
        f"error: {graph}:16 ($.nodes.done.next): node 'done': next points to unknown node "
        "'nowhere'",
        f"warning: {graph}:5 ($.nodes.ask): node 'ask': a failure of this llm node routes on "
        "to 'tidy' unhandled (no fallback or on_error default); it ends the run "
        "completed_with_errors (exit 4) (add `fallback: <node>` (or an `on_error` route) to "
        "handle it, or set settings.on_unhandled_failure: continue "
        "(Loki's plain completed))",
        "invalid: 3 error(s), 1 warning(s)",
    ]


def test_loki_dir_gives_the_default_model(graphrun: GraphrunCli, tmp_path: Path) -> None:
    loki = tmp_path / "loki"
    shutil.copytree(DATA, loki)
    result = graphrun("validate", "scribe", "--loki-dir", str(loki))
    assert result.code == 2
    assert result.stderr.splitlines()[0] == (
        f"error: {loki}/agents/scribe/graph.yaml:18 ($.model): llm node 'write': "
        f"{loki}/config.yaml ($.clients[0]): client 'local' uses {{{{LOKI_TEST_API_KEY}}}}, "
        "{{LOKI_TEST_API_BASE}}, which are not set (export LOKI_TEST_API_KEY=... or add it "
        "to the .env of the config directory)"
    )
    env = {"LOKI_TEST_API_KEY": "k" * 10, "LOKI_TEST_API_BASE": "http://127.0.0.1:9/v1"}
    for agent in ("scribe", "writer"):
        result = graphrun("validate", agent, "--loki-dir", str(loki), **env)
        assert result.code == 0, result.stdout + result.stderr
