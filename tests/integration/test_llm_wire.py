"""llm nodes through ``graphrun run`` against a real HTTP server: the exact wire requests."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.fake_llm import http_error, text

KEY = "sk-test-7f3a9c1e5b2d4f60"
ANTHROPIC_KEY = "sk-ant-test-0d9e8c7b6a5f4e3d"

SCHEMA = {
    "type": "object",
    "properties": {"category": {"type": "string"}, "urgent": {"type": "boolean"}},
    "required": ["category", "urgent"],
}
# The spec's wording of the hint, followed by the schema.
HINT = (
    "Respond with a JSON object that matches this schema. Output ONLY the JSON\n"
    "object with no surrounding prose or markdown fences.\n"
    "\n"
    "Schema:\n" + json.dumps(SCHEMA, indent=2)
)
SCHEMA_YAML = json.dumps(SCHEMA)  # JSON is YAML


def _db_bytes(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))


def test_openai_bodies_defaults_and_overrides(graphrun, agent, fake_llm):
    root = agent(
        f"""
        name: wire
        version: "1.0"
        model: openai:gpt-default
        temperature: 0.3
        start: classify
        nodes:
          classify:
            type: llm
            instructions: "Be brief about {{{{initial_prompt}}}}."
            prompt: "Classify: {{{{initial_prompt}}}}"
            output_schema: {SCHEMA_YAML}
            next: answer
          answer:
            type: llm
            model: openai:gpt-node
            temperature: 0.9
            top_p: 0.5
            prompt: "Category was {{{{category}}}}"
            state_updates:
              reply: "{{{{output}}}}"
            next: done
          done:
            type: end
            output: "{{{{category}}}}/{{{{urgent}}}}: {{{{reply}}}}"
        """
    )
    fake_llm.script(text('{"category": "billing", "urgent": true}'), text("We will refund you."))
    result = graphrun(
        "run", str(root), "card charged twice", OPENAI_BASE_URL=fake_llm.url_openai,
        OPENAI_API_KEY=KEY,
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert result.stdout.strip() == "billing/true: We will refund you."

    first, second = fake_llm.requests
    assert first.path == "/v1/chat/completions"
    assert first.headers["authorization"] == f"Bearer {KEY}"
    assert first.body == {
        "model": "gpt-default",
        "messages": [
            # instructions set: the hint goes to the system prompt
            {"role": "system", "content": "Be brief about card charged twice.\n\n" + HINT},
            {"role": "user", "content": "Classify: card charged twice"},
        ],
        "temperature": 0.3,
    }
    assert second.body == {
        "model": "gpt-node",
        "messages": [{"role": "user", "content": "Category was billing"}],
        "temperature": 0.9,
        "top_p": 0.5,
    }
    assert KEY.encode() not in _db_bytes(graphrun.db)


def test_anthropic_bodies_without_sampling_settings(graphrun, agent, fake_llm):
    root = agent(
        f"""
        name: wire
        version: "1.0"
        model: anthropic:claude-test
        start: extract
        nodes:
          extract:
            type: llm
            prompt: "Parse: {{{{initial_prompt}}}}"
            output_schema: {SCHEMA_YAML}
            next: polish
          polish:
            type: llm
            instructions: "You write one line."
            prompt: "Summarise {{{{category}}}}"
            state_updates:
              line: "{{{{output}}}}"
            next: done
          done:
            type: end
            output: "{{{{line}}}}"
        """
    )
    fake_llm.script(
        text('```json\n{"category": "outage", "urgent": false}\n```'), text("An outage.")
    )
    result = graphrun(
        "run", str(root), "site is down", ANTHROPIC_BASE_URL=fake_llm.url_anthropic,
        ANTHROPIC_API_KEY=ANTHROPIC_KEY,
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert result.stdout.strip() == "An outage."

    first, second = fake_llm.requests
    assert first.path == "/v1/messages"
    assert first.headers["x-api-key"] == ANTHROPIC_KEY
    assert first.headers["anthropic-version"] == "2023-06-01"
    # no instructions: the hint is appended to the user prompt; no temperature/top_p
    assert first.body == {
        "model": "claude-test",
        "max_tokens": 4096,
        "messages": [{"role": "user", "content": "Parse: site is down\n\n" + HINT}],
    }
    assert second.body == {
        "model": "claude-test",
        "max_tokens": 4096,
        "system": "You write one line.",
        "messages": [{"role": "user", "content": "Summarise outage"}],
    }
    assert ANTHROPIC_KEY.encode() not in _db_bytes(graphrun.db)


def test_key_echoed_by_server_is_never_stored_or_printed(graphrun, agent, fake_llm):
    root = agent(
        """
        name: leaky
        version: "1.0"
        model: openai:gpt-test
        start: ask
        nodes:
          ask:
            type: llm
            prompt: "hi"
            state_updates:
              said: "{{output}}"
            next: done
          done:
            type: end
            output: "{{said}}"
        """
    )
    fake_llm.script(http_error(401, f"Incorrect API key provided: {KEY}."))
    result = graphrun("run", str(root), OPENAI_BASE_URL=fake_llm.url_openai, OPENAI_API_KEY=KEY)
    # A failure without fallback routes to next, and the run says so: completed_with_errors.
    assert result.code == 4, result.stderr
    assert result.stdout.startswith("LLM node failed: HTTP 401")
    assert "Incorrect API key provided: ***" in result.stdout
    assert KEY not in result.stdout + result.stderr
    assert KEY.encode() not in _db_bytes(graphrun.db)
    events = graphrun("events", graphrun.last_run(), "--json")
    assert KEY not in events.stdout
    assert '"status":401' in events.stdout.replace(" ", "")
