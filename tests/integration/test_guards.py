"""``guard:`` on llm, tool and agent nodes: an input guard stops the effect before it
runs; an output guard checks its result; both route to on_fail; replayed."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import GraphrunCli, write_agent

TOOLS_PY = '''
import json
import pathlib


def lookup_order(order_id: str) -> str:
    """Look an order up.

    Args:
        order_id: The order.
    """
    calls = pathlib.Path(__file__).with_name("calls")
    calls.write_text(str(int(calls.read_text()) + 1 if calls.exists() else 1))
    status = {"A-1": "shipped"}.get(order_id, "unknown")
    return json.dumps({"status": status})
'''

GRAPH = """
    name: guarded
    version: "1.0"
    start: look
    initial_state: {order: ""}
    nodes:
      look:
        type: tool
        tool: lookup_order
        params: {order_id: "{{order}}"}
        guard:
          input: "len(order) > 2 and not contains(order, ' ')"
          output: "output.status != 'unknown'"
          on_fail: refused
        next: done
      done: {type: end, output: "{{status}}"}
      refused: {type: end, output: "refused: {{_error.message}}"}
"""


def _run(graphrun: GraphrunCli, root: Path, order: str) -> str:
    result = graphrun("run", str(root), "", "--set", f"order={order}")
    assert result.code == 0, result.stderr
    return result.stdout.strip()


def test_guards_route_to_on_fail(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = write_agent(tmp_path / "g", GRAPH, {"tools.py": TOOLS_PY})
    assert _run(graphrun, root, "A-1") == "shipped"
    assert (root / "calls").read_text() == "1"
    refused = _run(graphrun, root, "x")
    assert refused == "refused: input guard failed: len(order) > 2 and not contains(order, ' ')"
    assert (root / "calls").read_text() == "1"  # the input guard stopped the call
    assert _run(graphrun, root, "B-2") == "refused: output guard failed: output.status != 'unknown'"
    assert (root / "calls").read_text() == "2"
    replayed = graphrun("replay", graphrun.last_run())
    assert replayed.code == 0, replayed.stdout + replayed.stderr


def test_without_on_fail_a_guard_fails_the_run(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = write_agent(
        tmp_path / "g", GRAPH.replace("          on_fail: refused\n", ""), {"tools.py": TOOLS_PY}
    )
    result = graphrun("run", str(root), "", "--set", "order=x")
    assert result.code == 1
    assert "node 'look': input guard failed" in result.stderr


def test_validate_checks_guard_expressions(graphrun: GraphrunCli, tmp_path: Path) -> None:
    graph = GRAPH.replace("len(order) > 2 and", "len(order) > 2 and and").replace(
        "on_fail: refused", "on_fail: refsued"
    )
    root = write_agent(tmp_path / "g", graph, {"tools.py": TOOLS_PY})
    result = graphrun("validate", str(root))
    assert result.code == 2
    f = root / "graph.yaml"
    assert f"error: {f}:11 ($.nodes.look.guard.input): expression " in result.stderr
    assert (
        f"error: {f}:13 ($.nodes.look.guard.on_fail): node 'look': guard.on_fail points to "
        "unknown node 'refsued' (did you mean 'refused'?)"
    ) in result.stderr


SCHEMA_GRAPH = """
    name: guarded
    version: "1.0"
    start: look
    initial_state: {order: ""}
    nodes:
      look:
        type: tool
        tool: lookup_order
        params: {order_id: "{{order}}"}
        guard:
          input:
            type: object
            properties: {order: {type: string, pattern: "^[A-Z]-[0-9]+$"}}
            required: [order]
          output:
            type: object
            properties: {status: {enum: [shipped, packed]}}
            required: [status]
          on_fail: refused
        next: done
      done: {type: end, output: "{{status}}"}
      refused: {type: end, output: "refused: {{_error.message}}"}
"""


def test_schema_guards_check_the_state_and_the_result(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    root = write_agent(tmp_path / "g", SCHEMA_GRAPH, {"tools.py": TOOLS_PY})
    assert _run(graphrun, root, "A-1") == "shipped"
    assert _run(graphrun, root, "x y") == (
        "refused: input guard failed: schema: order: 'x y' does not match '^[A-Z]-[0-9]+$'"
    )
    assert (root / "calls").read_text() == "1"  # the input schema stopped the call
    assert _run(graphrun, root, "B-2") == (
        "refused: output guard failed: schema: status: 'unknown' is not one of "
        "['shipped', 'packed']"
    )
    assert (root / "calls").read_text() == "2"
    events = graphrun("events", graphrun.last_run(), "--json").json_lines()
    [failed] = [e for e in events if e["type"] == "NodeCompleted" and e.get("failed")]
    assert failed["error_kind"] == "GuardFailed"  # type: ignore[index]
    replayed = graphrun("replay", graphrun.last_run())
    assert replayed.code == 0, replayed.stdout + replayed.stderr


def test_validate_checks_a_guard_schema(graphrun: GraphrunCli, tmp_path: Path) -> None:
    graph = SCHEMA_GRAPH.replace("required: [status]", "required: status")
    root = write_agent(tmp_path / "g", graph, {"tools.py": TOOLS_PY})
    result = graphrun("validate", str(root))
    assert result.code == 2
    f = root / "graph.yaml"
    assert (
        f"error: {f}:15 ($.nodes.look.guard.output): node 'look': guard.output is not a valid "
        "JSON Schema (at required): 'status' is not of type 'array'"
    ) in result.stderr
