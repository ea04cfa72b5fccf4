"""``if`` / ``unless`` on every node: a false ``if`` (or a true ``unless``) skips the
node when it is about to run: no effect, no writes, recorded as a skipped completion
routed to ``next``; replay reproduces it; validate checks the expressions."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import GraphrunCli, write_agent

GRAPH = """
    name: conditional
    version: "1.0"
    start: prepare
    initial_state: {amount: 0, vip: false, note: "none"}
    nodes:
      prepare:
        type: script
        script: prepare.py
        next: charge
      charge:
        type: script
        script: charge.py
        if: "amount > 100"
        state_updates: {note: "charged"}
        next: greet
      greet:
        type: decision
        unless: "vip"
        routes: [{when: default, to: plain}]
        next: fancy
      plain: {type: end, output: "plain {{note}} {{amount}}"}
      fancy: {type: end, output: "fancy {{note}} {{amount}}"}
"""
PREPARE = """
    import json, os
    state = json.loads(os.environ["GRAPH_STATE"])
    amount, _, vip = state["initial_prompt"].partition(" ")
    print(json.dumps({"amount": int(amount), "vip": vip == "vip"}))
"""
# Leaves a mark each time it runs: a skipped node never starts it.
CHARGE = """
    import json, pathlib
    marks = pathlib.Path(__file__).with_name("charged")
    marks.write_text(marks.read_text() + "x" if marks.exists() else "x")
    print(json.dumps({}))
"""


def _agent(tmp_path: Path, graph: str = GRAPH) -> Path:
    return write_agent(tmp_path / "c", graph, {"prepare.py": PREPARE, "charge.py": CHARGE})


def _events(graphrun: GraphrunCli, run_id: str) -> list[dict]:  # type: ignore[type-arg]
    return graphrun("events", run_id, "--json").json_lines()  # type: ignore[return-value]


def test_a_false_if_skips_the_node_and_its_writes(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = _agent(tmp_path)
    ran = graphrun("run", str(root), "500")
    assert (ran.code, ran.stdout.strip()) == (0, "plain charged 500"), ran.stderr
    assert (root / "charged").read_text() == "x"
    skipped = graphrun("run", str(root), "50")
    # charge skipped: no script, no state_updates; greet ran (not vip).
    assert (skipped.code, skipped.stdout.strip()) == (0, "plain none 50"), skipped.stderr
    assert (root / "charged").read_text() == "x"
    done = {
        e["node_id"]: e
        for e in _events(graphrun, graphrun.last_run())
        if e["type"] == "NodeCompleted"
    }
    assert done["charge"]["skipped"] == "if 'amount > 100' is false"
    assert done["charge"]["routed_to"] == "greet"
    assert "updates" not in done["charge"]
    assert "skipped" not in done["greet"]
    replayed = graphrun("replay", graphrun.last_run())
    assert replayed.code == 0, replayed.stdout + replayed.stderr


def test_a_true_unless_skips_to_next(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = _agent(tmp_path)
    result = graphrun("run", str(root), "20 vip")
    assert (result.code, result.stdout.strip()) == (0, "fancy none 20"), result.stderr
    greet = [
        e
        for e in _events(graphrun, graphrun.last_run())
        if e["type"] == "NodeCompleted" and e["node_id"] == "greet"
    ]
    assert greet[0]["skipped"] == "unless 'vip' is true"
    assert graphrun("replay", graphrun.last_run()).code == 0


def test_a_changed_condition_is_a_divergence(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = _agent(tmp_path)
    assert graphrun("run", str(root), "50").code == 0
    run_id = graphrun.last_run()
    (root / "graph.yaml").write_text(
        (root / "graph.yaml").read_text().replace('if: "amount > 100"', 'if: "amount > 10"')
    )
    result = graphrun("replay", run_id, "--graph", str(root))
    assert result.code != 0
    assert "charge" in result.stdout + result.stderr


def test_a_condition_on_a_missing_key_fails_the_node(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = _agent(tmp_path, GRAPH.replace('if: "amount > 100"', 'if: "total > 100"'))
    result = graphrun("run", str(root), "50")
    assert result.code == 1
    assert (
        "node 'charge': if: expression 'total > 100' reads 'total', which is not in the state"
        in result.stderr
    )
    failed = [e for e in _events(graphrun, graphrun.last_run()) if e["type"] == "NodeFailed"]
    assert failed[0]["error_kind"] == "ExpressionError"


def test_validate_checks_the_conditions(graphrun: GraphrunCli, tmp_path: Path) -> None:
    graph = (
        GRAPH.replace('if: "amount > 100"', 'if: "ammount >"')
        .replace('unless: "vip"', 'unless: "vipp"')
        .replace("        next: fancy\n", "")
    )
    root = _agent(tmp_path, graph)
    result = graphrun("validate", str(root))
    assert result.code == 2
    f = root / "graph.yaml"
    assert f"error: {f}:13 ($.nodes.charge.if): expression 'ammount >' does not parse" in (
        result.stderr
    )
    assert (
        f"warning: {f}:18 ($.nodes.greet.unless): node 'greet': unless reads 'vipp', which no "
        "node, initial_state or output schema of this graph writes (did you mean 'vip'?)"
    ) in result.stderr
    assert (
        f"error: {f}:18 ($.nodes.greet.unless): node 'greet': `unless` needs a `next` to go to "
        "when the node is skipped"
    ) in result.stderr


def test_the_schema_and_the_picture_show_the_conditions(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    schema = graphrun("schema").stdout
    assert '"if": {' in schema and '"unless": {' in schema
    root = _agent(tmp_path)
    dot = graphrun("graph", str(root), "--format", "dot")
    assert dot.code == 0, dot.stderr
    assert (
        "skip: if amount &gt; 100 is false" in dot.stdout
        or "skip: if amount > 100 is false" in dot.stdout
    )
    assert "skip: unless vip is true" in dot.stdout


def test_the_report_and_the_events_show_the_skip(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = _agent(tmp_path)
    run = graphrun("run", str(root), "50")
    assert run.code == 0, run.stderr
    assert "▸ charge skipped (if 'amount > 100' is false) -> greet" in run.stderr
    out = tmp_path / "report.html"
    assert graphrun("report", graphrun.last_run(), "-o", str(out)).code == 0
    html = out.read_text()
    assert '<span class="st-skipped">skipped</span>' in html
    assert "skipped: if &#x27;amount &gt; 100&#x27; is false" in html
    events = graphrun("events", graphrun.last_run()).stdout
    assert "-> greet SKIPPED(if 'amount > 100' is false)" in events


def test_a_skipped_map_item_collects_null(graphrun: GraphrunCli, tmp_path: Path) -> None:
    graph = """
        name: mapped
        version: "1.0"
        start: each
        initial_state: {items: [1, 5, 2]}
        nodes:
          each:
            type: map
            over: "{{items}}"
            as: item
            branch: double
            collect_into: doubled
            next: done
          double:
            type: script
            script: double.py
            if: "item > 1"
          done: {type: end, output: "{{doubled}}"}
    """
    double = """
        import json, os
        state = json.loads(os.environ["GRAPH_STATE"])
        print(json.dumps({"output": state["item"] * 2}))
    """
    root = write_agent(tmp_path / "m", graph, {"double.py": double})
    assert graphrun("validate", str(root)).code == 0
    result = graphrun("run", str(root), "")
    assert (result.code, result.stdout.strip()) == (0, "[null,10,4]"), result.stderr
    assert graphrun("replay", graphrun.last_run()).code == 0


SLOW = """
    import json, os, pathlib, time
    here = pathlib.Path(__file__).parent
    (here / "slow.started").write_text(str(os.getpid()))
    time.sleep(float(os.environ.get("NAP", "0")))
    print(json.dumps({}))
"""


def test_kill_9_after_a_skip_then_resume_keeps_the_recorded_skip(
    graphrun: GraphrunCli, tmp_path: Path
) -> None:
    import signal
    import time

    graph = GRAPH.replace(
        "next: greet\n      greet:",
        "next: slow\n      slow:\n        type: script\n"
        "        script: slow.py\n        next: greet\n      greet:",
    )
    root = write_agent(
        tmp_path / "k", graph, {"prepare.py": PREPARE, "charge.py": CHARGE, "slow.py": SLOW}
    )
    proc = graphrun.popen("run", str(root), "50", NAP="60")
    deadline = time.monotonic() + 30
    while not (root / "slow.started").exists():
        assert time.monotonic() < deadline, "the slow node never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    run_id = graphrun.last_run()
    resumed = graphrun("resume", run_id, NAP="0")
    assert (resumed.code, resumed.stdout.strip()) == (0, "plain none 50"), resumed.stderr
    assert not (root / "charged").exists()  # skipped before the kill, not run after it
    done = [e for e in _events(graphrun, run_id) if e["type"] == "NodeCompleted"]
    assert [e["node_id"] for e in done if e.get("skipped")] == ["charge"]
    assert [e["node_id"] for e in done].count("slow") == 1
    replayed = graphrun("replay", run_id)
    assert replayed.code == 0, replayed.stdout + replayed.stderr
