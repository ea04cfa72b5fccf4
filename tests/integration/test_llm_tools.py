"""The llm node's tool-call loop through ``graphrun run``, with real agent tools."""

from __future__ import annotations

import json

from tests.support.fake_llm import text, tool_calls

TOOLS_SH = """\
#!/usr/bin/env bash
set -e
# @env LLM_OUTPUT=/dev/stdout The output path

# @cmd Look up the shipping status of an order
# @option --order-id! <ID>   The order id, e.g. A-1001
lookup_order() {
    echo "order $argc_order_id: shipped 2024-05-02 via DHL, tracking 00340434" >> "$LLM_OUTPUT"
}

# @cmd Not whitelisted, never offered
refund_order() {
    echo "refunded" >> "$LLM_OUTPUT"
}

eval "$(argc --argc-eval "$0" "$@")"
"""

TOOLS_PY = '''
def count_words(text: str) -> int:
    """Count the words in a text.

    Args:
        text: The text to count.
    """
    return len(text.split())
'''


def test_tools_sh_tool_loop(graphrun, agent, fake_llm):
    root = agent(
        """
        name: support
        version: "1.0"
        model: openai:gpt-test
        start: answer
        nodes:
          answer:
            type: llm
            prompt: "{{initial_prompt}}"
            tools: [lookup_order]
            state_updates:
              reply: "{{output}}"
            next: done
          done:
            type: end
            output: "{{reply}}"
        """,
        {"tools.sh": TOOLS_SH},
    )
    fake_llm.script(
        tool_calls(("lookup_order", {"order_id": "A-1001"})),
        text("Your order A-1001 shipped on 2 May with DHL."),
    )
    result = graphrun(
        "run", str(root), "Where is order A-1001?", OPENAI_BASE_URL=fake_llm.url_openai,
        OPENAI_API_KEY="sk-x",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert result.stdout.strip() == "Your order A-1001 shipped on 2 May with DHL."

    first, second = fake_llm.requests
    # exactly the whitelisted tool, declared from the argc comments
    assert [t["function"]["name"] for t in first.body["tools"]] == ["lookup_order"]
    parameters = first.body["tools"][0]["function"]["parameters"]
    assert parameters["required"] == ["order_id"]
    assert first.body["tools"][0]["function"]["description"].startswith("Look up the shipping")
    # the tool's real output goes back to the model
    call, result_message = second.body["messages"][-2:]
    assert call["role"] == "assistant"
    assert call["tool_calls"][0]["function"]["name"] == "lookup_order"
    assert result_message["role"] == "tool"
    assert result_message["tool_call_id"] == call["tool_calls"][0]["id"]
    assert result_message["content"].strip() == (
        "order A-1001: shipped 2024-05-02 via DHL, tracking 00340434"
    )
    events = graphrun("events", graphrun.last_run(), "--json").json_lines()
    tools_run = [e for e in events if e["type"] == "ToolCalled"]  # type: ignore[index]
    assert len(tools_run) == 1
    assert json.loads(tools_run[0]["arguments"]) == {"order_id": "A-1001"}  # type: ignore[index]


def test_tools_py_loop_stops_at_max_iterations(graphrun, agent, fake_llm):
    root = agent(
        """
        name: looping
        version: "1.0"
        model: anthropic:claude-test
        start: count
        nodes:
          count:
            type: llm
            prompt: "Count the words of {{initial_prompt}}"
            tools: [count_words]
            max_iterations: 2
            fallback: gave_up
            state_updates:
              why: "{{output}}"
            next: done
          gave_up:
            type: end
            output: "gave up: {{why}}"
          done:
            type: end
            output: "{{why}}"
        """,
        {"tools.py": TOOLS_PY},
    )
    fake_llm.script(
        tool_calls(("count_words", {"text": "one two three"})),
        tool_calls(("count_words", {"text": "one two"})),
        text("never asked for"),
    )
    result = graphrun(
        "run", str(root), "one two three", ANTHROPIC_BASE_URL=fake_llm.url_anthropic,
        ANTHROPIC_API_KEY="sk-ant-x",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert result.stdout.strip() == (
        "gave up: LLM node failed: tool-call loop hit max_iterations=2"
    )
    assert len(fake_llm.requests) == 2
    first, second = fake_llm.requests
    assert first.body["tools"] == [
        {
            "name": "count_words",
            "description": "Count the words in a text.",
            "input_schema": first.body["tools"][0]["input_schema"],
        }
    ]
    assert first.body["tools"][0]["input_schema"]["required"] == ["text"]
    # the tools.py function ran and its result went back as a tool_result block
    tool_result = second.body["messages"][-1]["content"][0]
    assert tool_result["type"] == "tool_result"
    assert tool_result["content"].strip() == "3"
