"""No failure goes unseen: a run that reached its end through a failure no
``fallback`` handled ends ``completed_with_errors`` (exit 4), names the failure on
stderr, in ``runs``, ``show`` and ``--json``; ``settings.on_unhandled_failure``
opts back into Loki's plain ``completed`` or makes the failure fail the run."""

from __future__ import annotations

import json
import socket

from graphrun.eventstore.events import NodeCompleted, RunCompleted, RunStarted
from graphrun.eventstore.fold import fold

SCRIPT_GRAPH = """
version: "1.0"
name: filer
start: file_them
{settings}
nodes:
  file_them:
    type: script
    script: scripts/file.py
    next: done
  done:
    type: end
    output: "Filed 6 issues"
"""

CRASH = {"scripts/file.py": "state = {}\nstate['ticket_ids']\n"}

LLM_GRAPH = """
version: "1.0"
name: asker
start: one
nodes:
  one:
    type: llm
    model: openai:gpt-test
    prompt: "Say hi"
    state_updates:
      answer: "{{output}}"
    next: done
  done:
    type: end
    output: "{{answer}}"
"""


def _script_agent(agent, settings: str = ""):  # type: ignore[no-untyped-def]
    return agent(SCRIPT_GRAPH.format(settings=settings), CRASH)


def test_a_script_crash_without_fallback_ends_completed_with_errors(graphrun, agent):
    res = graphrun("run", str(_script_agent(agent)))
    assert res.code == 4, res.stderr
    assert res.stdout == "Filed 6 issues\n"
    assert "completed with errors: 1 unhandled failure: node 'file_them': " in res.stderr
    assert "KeyError" in res.stderr
    rows = graphrun("runs", "--json").json_lines()
    assert rows[0]["status"] == "completed_with_errors"  # type: ignore[index]
    assert "node 'file_them'" in rows[0]["error"]  # type: ignore[index]
    table = graphrun("runs").stdout
    assert "completed_with_errors" in table
    shown = graphrun("show", "@last")
    assert "completed_with_errors" in shown.stdout
    assert "node 'file_them'" in shown.stdout
    data = graphrun("show", "@last", "--json").json()
    assert data["unhandled_failures"][0]["node"] == "file_them"  # type: ignore[index]
    waiting = graphrun("runs", "--status", "completed_with_errors", "--json").json_lines()
    assert len(waiting) == 1


def test_run_json_lists_the_unhandled_failures(graphrun, agent):
    res = graphrun("run", str(_script_agent(agent)), "--json")
    assert res.code == 4
    data = json.loads(res.stdout)
    assert data["status"] == "completed_with_errors"
    assert [f["node"] for f in data["unhandled_failures"]] == ["file_them"]


def test_the_llm_server_down_is_not_a_result(graphrun, agent):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = f"http://127.0.0.1:{port}/v1"
    res = graphrun("run", str(agent(LLM_GRAPH)), OPENAI_BASE_URL=base, OPENAI_API_KEY="sk-x")
    assert res.code == 4, res.stderr
    assert res.stdout.startswith("LLM node failed: could not reach")
    assert "completed with errors: 1 unhandled failure: node 'one': LLM node failed" in res.stderr
    assert "the output above contains a failure's text: it is not a result" in res.stderr


def test_continue_keeps_lokis_plain_completed(graphrun, agent):
    root = _script_agent(agent, "settings:\n  on_unhandled_failure: continue")
    res = graphrun("run", str(root))
    assert res.code == 0, res.stderr
    assert graphrun("runs", "--json").json_lines()[0]["status"] == "completed"  # type: ignore[index]


def test_fail_makes_the_first_unhandled_failure_fail_the_run(graphrun, agent):
    root = _script_agent(agent, "settings:\n  on_unhandled_failure: fail")
    res = graphrun("run", str(root))
    assert res.code == 1
    assert "node 'file_them'" in res.stderr
    assert "settings.on_unhandled_failure: fail" in res.stderr
    assert res.stdout == ""


def test_a_fallback_handles_the_failure(graphrun, agent):
    graph = SCRIPT_GRAPH.format(settings="").replace(
        "    next: done\n", "    next: done\n    fallback: done\n", 1
    )
    res = graphrun("run", str(agent(graph, CRASH)))
    assert res.code == 0, res.stderr
    assert "unhandled" not in res.stderr


def test_replay_reproduces_a_run_with_unhandled_failures(graphrun, agent):
    assert graphrun("run", str(_script_agent(agent))).code == 4
    res = graphrun("replay", "@last")
    assert res.code == 0, res.stderr + res.stdout


def test_an_old_log_folds_to_its_old_status():
    """A log written before unhandled failures were recorded folds to ``completed``."""
    events = [
        RunStarted(run_id="r", seq=1, graph_name="g", graph_source="", graph_hash=""),
        NodeCompleted(
            run_id="r", seq=2, node_id="a", visit=1, routed_to="done", failed=True, error="x"
        ),
        RunCompleted(run_id="r", seq=3, node_id="done", output="ok"),
    ]
    state = fold(events)
    assert state.status == "completed"
    assert state.failures == (("a", 1, "x", "done"),)
    assert fold(
        [
            *events[:2],
            RunCompleted(
                run_id="r",
                seq=3,
                node_id="done",
                output="ok",
                unhandled_failures=[{"node": "a", "visit": 1, "error": "x"}],
            ),
        ]
    ).status == ("completed_with_errors")


def test_validate_warns_about_a_failure_that_flows_into_next(graphrun, agent):
    res = graphrun("validate", str(_script_agent(agent)))
    assert res.code == 0, res.stderr
    assert (
        "node 'file_them': a failure of this script node routes on to 'done' unhandled "
        "(no fallback or on_error default)" in res.stderr
    )
    quiet = graphrun(
        "validate", str(_script_agent(agent, "settings:\n  on_unhandled_failure: continue"))
    )
    assert "unhandled" not in quiet.stderr


def test_the_report_names_the_unhandled_failures(graphrun, agent, tmp_path):
    assert graphrun("run", str(_script_agent(agent))).code == 4
    out = tmp_path / "r.html"
    res = graphrun("report", "@last", "-o", str(out))
    assert res.code == 0, res.stderr
    page = out.read_text(encoding="utf-8")
    assert 'class="st-completed_with_errors">completed_with_errors</b>' in page
    assert "Unhandled failures" in page
    assert "node <code>file_them</code> (visit 1)" in page
    assert "graph version <code>" in page
