"""``tool`` nodes: one tool called directly with templated params, no LLM; the result
lands in the state like a script's; validated, replayed, retried."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import GraphrunCli, write_agent

TOOLS_PY = '''
import json
import pathlib


def lookup_order(order_id: str, tries: int = 1) -> str:
    """Look an order up.

    Args:
        order_id: The order.
        tries: How many calls fail first.
    """
    counter = pathlib.Path(__file__).with_name("calls")
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    if n < tries:
        raise RuntimeError(f"order service busy (call {n})")
    return json.dumps({"status": "shipped", "order": order_id, "items": [1, 2, 3]})
'''

GRAPH = """
    name: orders
    version: "1.0"
    start: look
    initial_state:
      customer: {order: "A-17"}
      tries: 1
    nodes:
      look:
        type: tool
        tool: lookup_order
        params: {order_id: "{{customer.order}}", tries: "{{tries}}"}
        retry: {max_attempts: 3, backoff: fixed, initial: 0.1, jitter: false}
        routes:
          - {when: "status == 'shipped' and len(items) > 2", to: shipped}
        next: other
        state_updates:
          raw: "{{output}}"
        on_error:
          - {default: true, to: broken}
      shipped: {type: end, output: "{{order}} shipped with {{items}}"}
      other: {type: end, output: "other"}
      broken: {type: end, output: "broken: {{_error.message}}"}
"""


def test_a_tool_node_calls_the_tool_and_routes_on_its_result(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    root = write_agent(tmp_path / "orders", GRAPH, {"tools.py": TOOLS_PY})
    result = graphrun("run", str(root), "")
    assert (result.code, result.stdout.strip()) == (0, "A-17 shipped with [1,2,3]"), result.stderr
    run_id = graphrun.last_run()
    events = graphrun("events", run_id, "--json").json_lines()
    finished = [e for e in events if e["type"] == "ToolFinished"]  # type: ignore[index]
    assert len(finished) == 1
    assert json.loads(finished[0]["arguments"]) == {"order_id": "A-17", "tries": 1}  # type: ignore[index]
    assert finished[0]["output"]["status"] == "shipped"  # type: ignore[index]
    replayed = graphrun("replay", run_id)
    assert replayed.code == 0, replayed.stdout + replayed.stderr
    assert (root / "calls").read_text() == "1"  # replay did not call the tool


def test_a_failing_tool_is_retried_then_routed(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = write_agent(tmp_path / "orders", GRAPH, {"tools.py": TOOLS_PY})
    result = graphrun("run", str(root), "", "--set", "tries=3")
    assert result.stdout.strip() == "A-17 shipped with [1,2,3]", result.stderr
    assert (root / "calls").read_text() == "3"
    (root / "calls").unlink()
    result = graphrun("run", str(root), "", "--set", "tries=9")
    assert result.stdout.startswith("broken: tool 'lookup_order' failed:"), result.stdout
    assert "order service busy (call 3)" in result.stdout


def test_changed_params_are_a_divergence(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = write_agent(tmp_path / "orders", GRAPH, {"tools.py": TOOLS_PY})
    assert graphrun("run", str(root), "").code == 0
    run_id = graphrun.last_run()
    changed = write_agent(
        tmp_path / "changed", GRAPH.replace("{{customer.order}}", "B-{{customer.order}}"),
        {"tools.py": TOOLS_PY},
    )  # fmt: skip
    replayed = graphrun("replay", run_id, "--graph", str(changed))
    assert replayed.code == 1
    assert "the tool's params differ" in replayed.stdout + replayed.stderr


def test_validate_names_an_unknown_tool(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = write_agent(
        tmp_path / "orders", GRAPH.replace("tool: lookup_order", "tool: lookup_ordr"),
        {"tools.py": TOOLS_PY},
    )  # fmt: skip
    result = graphrun("validate", str(root))
    assert result.code == 2
    assert f"{root / 'graph.yaml'}:10 ($.nodes.look.tool): tool node 'look': " in result.stderr
    assert "lookup_order" in result.stderr  # the closest name
