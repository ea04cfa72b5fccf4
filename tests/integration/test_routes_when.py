"""``routes:`` lists with ``when`` on every routing kind, and ``on_error`` routes:
behaviour, validation (with the YAML line), the routing order, and replay."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import GraphrunCli, write_agent
from tests.support.fake_llm import http_error, text

CLASSIFY = """
    name: classify
    version: "1.0"
    model: openai:gpt-test
    start: classify
    nodes:
      classify:
        type: llm
        prompt: "Classify: {{initial_prompt}}"
        output_schema:
          type: object
          properties: {category: {type: string}}
          required: [category]
        routes:
          - {when: "category == 'refund'", to: refund}
          - {when: default, to: triage}
        on_error:
          # (Not a bare 50x: the fake server's port is in the message too.)
          - {match: "HTTP 5[0-9][0-9] |status 5[0-9][0-9]", to: retry_later}
          - {default: true, to: log_it}
      refund: {type: end, output: "refund"}
      triage: {type: end, output: "triage {{category}}"}
      retry_later: {type: end, output: "later: {{_error.message}}"}
      log_it: {type: end, output: "logged"}
"""

SCRIPTED = """
    name: scripted
    version: "1.0"
    start: work
    nodes:
      work:
        type: script
        script: work.py
        routes:
          - {when: "score >= 0.8", to: good}
          - {when: "score >= 0.5", to: fair}
        next: poor
        on_error:
          - {match: "exit (code|status) 3|code 3", to: three}
          - {match: "boom", to: boom}
      good: {type: end, output: "good {{score}}"}
      fair: {type: end, output: "fair {{score}}"}
      poor: {type: end, output: "poor {{score}}"}
      three: {type: end, output: "three"}
      boom: {type: end, output: "boom: {{_error.message}}"}
"""

WORK = """
    import json, os, sys
    state = json.loads(os.environ["GRAPH_STATE"])
    prompt = state["initial_prompt"]
    if prompt == "boom":
        print("boom went the script", file=sys.stderr)
        sys.exit(1)
    if prompt == "three":
        sys.exit(3)
    if prompt == "next":
        print(json.dumps({"score": 0.9, "_next": "poor"}))
        sys.exit(0)
    print(json.dumps({"score": float(prompt)}))
"""


def _env(fake) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {"OPENAI_BASE_URL": fake.url_openai, "OPENAI_API_KEY": "sk-test"}


def test_llm_routes_on_its_structured_output(
    graphrun: GraphrunCli, tmp_path: Path, fake_llm
) -> None:  # type: ignore[no-untyped-def]
    root = write_agent(tmp_path / "c", CLASSIFY)
    fake_llm.script(text('{"category": "refund"}'), text('{"category": "bug"}'))
    first = graphrun("run", str(root), "money back", **_env(fake_llm))
    assert (first.code, first.stdout.strip()) == (0, "refund"), first.stderr
    second = graphrun("run", str(root), "it crashes", **_env(fake_llm))
    assert (second.code, second.stdout.strip()) == (0, "triage bug"), second.stderr
    run_id = graphrun.last_run()
    replayed = graphrun("replay", run_id)
    assert replayed.code == 0, replayed.stdout + replayed.stderr


def test_llm_on_error_matches_the_message(graphrun: GraphrunCli, tmp_path: Path, fake_llm) -> None:  # type: ignore[no-untyped-def]
    root = write_agent(tmp_path / "c", CLASSIFY)
    fake_llm.script(http_error(503, "overloaded"))
    result = graphrun("run", str(root), "x", **_env(fake_llm))
    assert result.code == 0, result.stderr
    assert result.stdout.startswith("later: LLM node failed:"), result.stdout
    fake_llm.script(http_error(400, "bad request"))
    result = graphrun("run", str(root), "x", **_env(fake_llm))
    assert (result.code, result.stdout.strip()) == (0, "logged"), result.stderr
    replayed = graphrun("replay", graphrun.last_run())
    assert replayed.code == 0, replayed.stdout + replayed.stderr


def test_script_routes_and_their_order(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = write_agent(tmp_path / "s", SCRIPTED, {"work.py": WORK})
    outputs = {}
    for prompt in ("0.95", "0.6", "0.1", "next", "boom"):
        result = graphrun("run", str(root), prompt)
        assert result.code == 0, result.stderr
        outputs[prompt] = result.stdout.strip()
    assert outputs["0.95"] == "good 0.95"
    assert outputs["0.6"] == "fair 0.6"
    assert outputs["0.1"] == "poor 0.1"  # no route holds: next
    assert outputs["next"] == "poor 0.9"  # a script's _next comes before routes
    assert outputs["boom"].startswith("boom: ")


def test_validate_checks_routes_and_on_error(graphrun: GraphrunCli, tmp_path: Path) -> None:
    graph = (
        SCRIPTED.replace("score >= 0.5", "scroe >= 0.5")
        .replace("score >= 0.8", "score >= ")
        .replace('match: "boom"', 'match: "(boom"')
        .replace("next: poor", "next: poor\n        fallback: poor")
        .replace("to: fair}", "to: fiar}")
    )
    root = write_agent(tmp_path / "s", graph, {"work.py": WORK})
    result = graphrun("validate", str(root))
    assert result.code == 2
    f = root / "graph.yaml"
    assert result.stderr.splitlines()[:5] == [
        f"error: {f}:9 ($.nodes.work.routes[0].when): expression 'score >= ' does not parse: "
        "invalid syntax",
        f"error: {f}:10 ($.nodes.work.routes[1].to): node 'work': routes[1].to points to "
        "unknown node 'fiar' (did you mean 'fair'?)",
        f"error: {f}:12 ($.nodes.work.fallback): node 'work' has both on_error and fallback; "
        "they both route failures (keep on_error and end it with {default: true, to: <the "
        "fallback>})",
        f"error: {f}:15 ($.nodes.work.on_error[1].match): node 'work': on_error[1].match is not "
        "a regular expression: missing ), unterminated subpattern at position 0",
        # A script may write any key: a warning.
        f"warning: {f}:10 ($.nodes.work.routes[1].when): node 'work': routes[1].when reads "
        "'scroe', which no node, initial_state or output schema of this graph writes (a script or "
        "tool may write it)",
    ]


def test_schema_and_picture_show_the_routes(graphrun: GraphrunCli, tmp_path: Path) -> None:
    schema = graphrun("schema")
    assert schema.code == 0
    assert '"on_error"' in schema.stdout and '"ErrorRoute"' in schema.stdout
    root = write_agent(tmp_path / "s", SCRIPTED, {"work.py": WORK})
    pic = graphrun("graph", str(root), "--format", "mermaid")
    assert pic.code == 0, pic.stderr
    assert '"score &gt;= 0.8"| n1' in pic.stdout
    assert "on_error /boom/" in pic.stdout
