"""``on_error`` matches a failure's kind as well as its message: ``kind: TimeoutError``
exactly, or ``match`` searched in ``"<kind>: <message>"``; the kind is recorded on
the failure (``error_kind``), ``retry.on`` sees it too, and replay reproduces it."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import GraphrunCli, write_agent
from tests.support.fake_llm import http_error

GRAPH = """
    name: kinds
    version: "1.0"
    start: work
    nodes:
      work:
        type: script
        script: work.py
        timeout: 0.5
        on_error:
          - {match: "TimeoutError", to: later}
          - {kind: ScriptExit, match: "code 3|status 3", to: three}
          - {kind: ScriptExit, to: exited}
          - {default: true, to: other}
        next: done
      done: {type: end, output: "done"}
      later: {type: end, output: "later: {{_error.message}}"}
      three: {type: end, output: "three"}
      exited: {type: end, output: "exited"}
      other: {type: end, output: "other: {{_error.message}}"}
"""
WORK = """
    import json, os, sys, time
    prompt = json.loads(os.environ["GRAPH_STATE"])["initial_prompt"]
    if prompt == "slow":
        time.sleep(5)
    if prompt.startswith("exit"):
        sys.exit(int(prompt[4:]))
    if prompt == "garbage":
        print(json.dumps({"_next": 5}))
        sys.exit(0)
    print(json.dumps({}))
"""


def _events(graphrun: GraphrunCli, run_id: str) -> list[dict]:  # type: ignore[type-arg]
    return graphrun("events", run_id, "--json").json_lines()  # type: ignore[return-value]


def _failure(graphrun: GraphrunCli) -> dict:  # type: ignore[type-arg]
    events = _events(graphrun, graphrun.last_run())
    return next(e for e in events if e["type"] == "NodeCompleted" and e.get("failed"))


def test_on_error_matches_the_kind(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = write_agent(tmp_path / "k", GRAPH, {"work.py": WORK})
    outputs = {}
    for prompt in ("slow", "exit3", "exit1", "garbage"):
        result = graphrun("run", str(root), prompt)
        assert result.code == 0, result.stderr
        outputs[prompt] = (result.stdout.strip(), _failure(graphrun)["error_kind"])
        replayed = graphrun("replay", graphrun.last_run())
        assert replayed.code == 0, replayed.stdout + replayed.stderr
    assert outputs["slow"][0].startswith("later: ")  # the message need not say "TimeoutError"
    assert "TimeoutError" not in outputs["slow"][0]
    assert outputs["slow"][1] == "TimeoutError"
    assert outputs["exit3"] == ("three", "ScriptExit")
    assert outputs["exit1"] == ("exited", "ScriptExit")
    assert outputs["garbage"][0].startswith("other: _next must be a node id string")
    assert outputs["garbage"][1] == "ScriptOutput"


def test_an_unrouted_failure_records_its_kind(graphrun: GraphrunCli, tmp_path: Path) -> None:
    graph = """
        name: kinds
        version: "1.0"
        start: work
        nodes:
          work: {type: decision, expr: "missing.key", routes: [{when: default, to: done}]}
          done: {type: end, output: "done"}
    """
    root = write_agent(tmp_path / "k", graph)
    result = graphrun("run", str(root), "x")
    assert result.code == 1
    [failed] = [e for e in _events(graphrun, graphrun.last_run()) if e["type"] == "NodeFailed"]
    assert failed["error_kind"] == "ExpressionError"


def test_an_http_error_is_its_own_kind(graphrun: GraphrunCli, tmp_path: Path, fake_llm) -> None:  # type: ignore[no-untyped-def]
    graph = """
        name: asks
        version: "1.0"
        start: ask
        nodes:
          ask:
            type: llm
            model: openai:gpt-4o-mini
            prompt: "{{initial_prompt}}"
            on_error:
              - {kind: HTTPError, match: "503", to: busy}
              - {match: "^HTTPError", to: refused}
              - {default: true, to: other}
            next: done
          done: {type: end, output: "{{output}}"}
          busy: {type: end, output: "busy"}
          refused: {type: end, output: "refused"}
          other: {type: end, output: "other"}
    """
    root = write_agent(tmp_path / "a", graph)
    env = {"OPENAI_BASE_URL": fake_llm.url_openai, "OPENAI_API_KEY": "sk-test"}
    fake_llm.script(http_error(503, "overloaded"))
    busy = graphrun("run", str(root), "x", **env)
    assert (busy.code, busy.stdout.strip()) == (0, "busy"), busy.stderr
    assert _failure(graphrun)["error_kind"] == "HTTPError"
    assert graphrun("replay", graphrun.last_run()).code == 0
    fake_llm.script(http_error(400, "bad request"))
    refused = graphrun("run", str(root), "x", **env)
    assert (refused.code, refused.stdout.strip()) == (0, "refused"), refused.stderr


def test_retry_on_sees_the_kind(graphrun: GraphrunCli, tmp_path: Path) -> None:
    graph = GRAPH.replace(
        "        timeout: 0.5\n",
        "        timeout: 0.5\n"
        "        retry: {max_attempts: 2, backoff: fixed, initial: 0.1, jitter: false, "
        "on: [TimeoutError]}\n",
    )
    root = write_agent(tmp_path / "k", graph, {"work.py": WORK})
    assert graphrun("run", str(root), "slow").stdout.startswith("later: ")
    retries = [e for e in _events(graphrun, graphrun.last_run()) if e["type"] == "NodeRetrying"]
    assert len(retries) == 1
    assert graphrun("run", str(root), "exit1").stdout.strip() == "exited"
    retries = [e for e in _events(graphrun, graphrun.last_run()) if e["type"] == "NodeRetrying"]
    assert retries == []  # a ScriptExit is not retried


def test_validate_checks_the_kind(graphrun: GraphrunCli, tmp_path: Path) -> None:
    graph = GRAPH.replace("{kind: ScriptExit, to: exited}", "{kind: ScriptExitt, to: exited}")
    graph = graph.replace("{default: true, to: other}", "{to: other}")
    root = write_agent(tmp_path / "k", graph, {"work.py": WORK})
    result = graphrun("validate", str(root))
    assert result.code == 2
    f = root / "graph.yaml"
    assert (
        f"error: {f}:12 ($.nodes.work.on_error[2].kind): node 'work': on_error[2].kind "
        "'ScriptExitt' is not a failure kind (did you mean 'ScriptExit'?)"
    ) in result.stderr
    assert (
        f"error: {f}:13 ($.nodes.work.on_error[3]): node 'work': on_error[3] needs either "
        "`match: PATTERN` and/or `kind: KIND`, or `default: true`"
    ) in result.stderr


def test_the_report_and_the_picture_show_the_kind(graphrun: GraphrunCli, tmp_path: Path) -> None:
    root = write_agent(tmp_path / "k", GRAPH, {"work.py": WORK})
    assert graphrun("run", str(root), "exit1").code == 0
    out = tmp_path / "report.html"
    assert graphrun("report", graphrun.last_run(), "-o", str(out)).code == 0
    assert "error (ScriptExit): script exited with code 1" in out.read_text()
    mermaid = graphrun("graph", str(root), "--format", "mermaid").stdout
    assert '-->|"on_error /TimeoutError/"|' in mermaid
    assert '-->|"on_error ScriptExit /code 3#124;status 3/"|' in mermaid
    assert '-->|"on_error ScriptExit"|' in mermaid


def test_a_log_recorded_before_kinds_still_replays(graphrun: GraphrunCli, tmp_path: Path) -> None:
    import msgspec

    from graphrun.eventstore.events import NodeCompleted, NodeFailed
    from graphrun.eventstore.store import SqliteStore
    from graphrun.runtime.replay.divergence import replay_events

    root = write_agent(tmp_path / "k", GRAPH, {"work.py": WORK})
    assert graphrun("run", str(root), "exit1").code == 0
    store = SqliteStore(graphrun.db)
    try:
        events = store.read(graphrun.last_run())
    finally:
        store.close()
    old = [
        msgspec.structs.replace(e, error_kind="")
        if isinstance(e, NodeCompleted | NodeFailed)
        else e
        for e in events
    ]
    assert old != events  # the run had a kind to drop
    result = replay_events(old)
    assert result.ok, result.divergence and result.divergence.format()
