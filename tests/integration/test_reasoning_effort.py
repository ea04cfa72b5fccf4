"""`reasoning_effort` (graph default, node override) reaches the models that take it."""

from __future__ import annotations

from tests.support.fake_llm import text


def test_reasoning_effort_goes_to_reasoning_models_only(graphrun, agent, fake_llm) -> None:
    root = agent(
        """
        name: effort
        version: "1.0"
        model: openai:o3
        temperature: 0.2
        reasoning_effort: low
        start: think
        nodes:
          think:
            type: llm
            prompt: "think"
            reasoning_effort: high
            next: plain
          plain:
            type: llm
            model: openai:gpt-4o-mini
            prompt: "plain"
            next: graph_default
          graph_default:
            type: llm
            prompt: "again"
            next: done
          done:
            type: end
            output: ok
        """
    )
    fake_llm.script(text("a"), text("b"), text("c"))
    result = graphrun(
        "run", str(root), "x", OPENAI_BASE_URL=fake_llm.url_openai, OPENAI_API_KEY="sk-x"
    )
    assert result.code == 0, result.stderr
    think, plain, default = (r.body for r in fake_llm.requests)
    assert think["reasoning_effort"] == "high" and "temperature" not in think
    assert "reasoning_effort" not in plain and plain["temperature"] == 0.2
    assert default["reasoning_effort"] == "low"
