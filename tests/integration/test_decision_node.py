"""``decision`` nodes: routes on an expression, no LLM, no script; validated with the
YAML line; replayed from the log to the same route."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import GraphrunCli, write_agent

PICK = """
    name: pick
    version: "1.0"
    start: pick
    initial_state:
      ticket: {priority: p2, tags: []}
    nodes:
      pick:
        type: decision
        expr: "ticket.priority"
        routes:
          - {when: "p0", to: page}
          - {when: default, to: check}
        state_updates:
          picked: "{{ticket.priority}}"
      check:
        type: decision
        routes:
          - {when: "len(ticket.tags) > 1 and picked != 'p0'", to: batch}
          - {when: "contains(ticket.tags, 'vip')", to: page}
          - {when: default, to: queue}
      page:
        type: end
        output: "paged {{picked}}"
      batch:
        type: end
        output: "batched"
      queue:
        type: end
        output: "queued {{picked}}"
"""


def _run(graphrun: GraphrunCli, agent: Path, *sets: str) -> tuple[str, str]:
    args = [a for s in sets for a in ("--set", s)]
    result = graphrun("run", str(agent), "go", *args)
    assert result.code == 0, result.stderr
    return result.stdout.strip(), graphrun.last_run()


def test_first_matching_route_wins(graphrun: GraphrunCli, tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "pick", PICK)
    assert _run(graphrun, agent)[0] == "queued p2"
    assert _run(graphrun, agent, 'ticket={"priority": "p0", "tags": []}')[0] == "paged p0"
    assert _run(graphrun, agent, 'ticket={"priority": "p1", "tags": ["a", "b"]}')[0] == "batched"
    assert _run(graphrun, agent, 'ticket={"priority": "p1", "tags": ["vip"]}')[0] == "paged p1"


def test_recorded_routes_replay(graphrun: GraphrunCli, tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "pick", PICK)
    _out, run_id = _run(graphrun, agent, 'ticket={"priority": "p1", "tags": ["a", "b"]}')
    replayed = graphrun("replay", run_id)
    assert replayed.code == 0, replayed.stdout + replayed.stderr
    assert replayed.stderr.startswith(f"ok: run {run_id}: 8 events, 7 decisions"), replayed.stderr
    events = graphrun("events", run_id, "--json").json_lines()
    routes = [(e["node_id"], e["routed_to"]) for e in events if e["type"] == "NodeCompleted"]  # type: ignore[index,call-overload]
    assert routes[:2] == [("pick", "check"), ("check", "batch")]


def test_a_changed_route_is_a_divergence(graphrun: GraphrunCli, tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "pick", PICK)
    _out, run_id = _run(graphrun, agent, 'ticket={"priority": "p1", "tags": ["a", "b"]}')
    changed = write_agent(tmp_path / "changed", PICK.replace("len(ticket.tags) > 1", "False"))
    replayed = graphrun("replay", run_id, "--graph", str(changed))
    assert replayed.code == 1, replayed.stdout + replayed.stderr
    assert "check" in replayed.stdout + replayed.stderr


def test_no_matching_route_fails_the_node(graphrun: GraphrunCli, tmp_path: Path) -> None:
    graph = PICK.replace("          - {when: default, to: queue}\n", "")
    agent = write_agent(tmp_path / "pick", graph)
    result = graphrun("run", str(agent), "go")
    assert result.code != 0
    assert "node 'check': no route matched and there is no `when: default`" in result.stderr


def test_a_missing_state_key_fails_with_the_expression(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    graph = PICK.replace("len(ticket.tags) > 1", "len(ticket.labels) > 1")
    agent = write_agent(tmp_path / "pick", graph)
    result = graphrun("run", str(agent), "go")
    assert result.code != 0
    assert "node 'check': expression " in result.stderr
    assert "failed: 'labels'" in result.stderr or "labels" in result.stderr


def test_validate_points_at_the_line(graphrun: GraphrunCli, tmp_path: Path) -> None:
    graph = PICK.replace("len(ticket.tags) > 1 and", "len(ticket.tags) > 1 and and").replace(
        'expr: "ticket.priority"', 'expr: "tikcet.priority"'
    )
    agent = write_agent(tmp_path / "pick", graph)
    result = graphrun("validate", str(agent))
    assert result.code == 2
    graph_file = agent / "graph.yaml"
    assert (
        f"{graph_file}:18 ($.nodes.check.routes[0].when): expression "
        "\"len(ticket.tags) > 1 and and picked != 'p0'\" does not parse: invalid syntax"
    ) in result.stderr
    assert (
        f"{graph_file}:9 ($.nodes.pick.expr): node 'pick': expr reads 'tikcet', "
        "which no node, initial_state or output schema of this graph writes"
    ) in result.stderr
    assert "did you mean 'ticket'?" in result.stderr


def test_validate_refuses_unknown_route_targets_and_fields(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    graph = PICK.replace("to: batch}", "to: bacth}").replace(
        'expr: "ticket.priority"', 'expr: "ticket.priority"\n        model: x'
    )
    agent = write_agent(tmp_path / "pick", graph)
    result = graphrun("validate", str(agent))
    assert result.code == 2
    assert "unknown field 'model'" in result.stderr or "'model'" in result.stderr


def test_route_targets_are_edges(graphrun: GraphrunCli, tmp_path: Path) -> None:
    graph = PICK.replace("to: batch}", "to: bacth}")
    agent = write_agent(tmp_path / "pick", graph)
    result = graphrun("validate", str(agent))
    assert result.code == 2
    assert f"{agent / 'graph.yaml'}:18 ($.nodes.check.routes[0].to)" in result.stderr
    assert "bacth" in result.stderr
