"""``graphrun test --update`` re-records a run whose approval question embeds LLM
output that changed: the recorded answer is reused when the options are the same
(and it says so); otherwise ``--answer NODE=VALUE`` answers it."""

from __future__ import annotations

import json

from tests.integration.test_regression_behaviour import _offline
from tests.support.fake_llm import text

GRAPH = """
    version: "1.0"
    name: gate
    start: draft
    nodes:
      draft:
        type: llm
        model: openai:gpt-4o-mini
        prompt: "Title for: {{initial_prompt}}"
        state_updates:
          title: "{{output}}"
        next: review
      review:
        type: approval
        question: "Ship {{title}}?"
        options: [ship, hold]
        routes: {ship: shipped, hold: held}
        on_other: held
      shipped:
        type: end
        output: "Shipped: {{title}}"
      held:
        type: end
        output: "Held: {{title}}"
"""


def _record(graphrun, agent, fake_llm):  # type: ignore[no-untyped-def]
    root = agent(GRAPH, name="gate")
    fake_llm.script(text("Release 2.4"))
    env = {"OPENAI_BASE_URL": fake_llm.url_openai, "OPENAI_API_KEY": "sk-test"}
    ran = graphrun("run", str(root), "notes", "--answer", "review=ship", "--as", "alice", **env)
    assert ran.code == 0, ran.stderr
    export = graphrun.tmp_path / "replays" / "gate.run.jsonl"
    export.parent.mkdir()
    assert graphrun("export", graphrun.last_run(), "-o", str(export)).code == 0
    return root, export


def _outputs(export) -> list[str]:  # type: ignore[no-untyped-def]
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    return [
        line["event"]["output"]
        for line in lines
        if "event" in line and line["event"]["type"] == "RunCompleted"
    ]


def test_a_changed_question_reuses_the_recorded_answer_when_the_options_are_the_same(
    graphrun, agent, fake_llm
):
    root, export = _record(graphrun, agent, fake_llm)
    graph = root / "graph.yaml"
    graph.write_text(graph.read_text().replace("Title for:", "Short title for:"))
    fake_llm.script(text("Release 2.5"))
    updated = _offline(
        graphrun, "test", "--update", str(export), OPENAI_BASE_URL=fake_llm.url_openai
    )
    assert updated.code == 0, updated.stdout + updated.stderr
    assert (
        "node 'review': its question changed, its options did not: reused the recorded "
        "answer 'ship' (by alice)"
    ) in updated.stdout
    assert _outputs(export) == ["Shipped: Release 2.5"]
    assert _offline(graphrun, "test", str(export)).code == 0


def test_changed_options_take_an_answer_flag(graphrun, agent, fake_llm):
    root, export = _record(graphrun, agent, fake_llm)
    graph = root / "graph.yaml"
    graph.write_text(
        graph.read_text()
        .replace("Title for:", "Short title for:")
        .replace("options: [ship, hold]", "options: [ship, hold, drop]")
        .replace(
            "routes: {ship: shipped, hold: held}", "routes: {ship: shipped, hold: held, drop: held}"
        )
    )
    before = export.read_text()
    fake_llm.script(text("Release 2.5"))
    env = {"OPENAI_BASE_URL": fake_llm.url_openai}
    refused = _offline(graphrun, "test", "--update", str(export), **env)
    assert refused.code == 1
    assert "NOT UPDATED" in refused.stdout and "waiting at node 'review'" in refused.stdout
    assert export.read_text() == before
    fake_llm.script(text("Release 2.5"))
    answered = _offline(graphrun, "test", "--update", "--answer", "review=drop", str(export), **env)
    assert answered.code == 0, answered.stdout + answered.stderr
    assert "node 'review': answered 'drop' (--answer)" in answered.stdout
    assert _outputs(export) == ["Held: Release 2.5"]
