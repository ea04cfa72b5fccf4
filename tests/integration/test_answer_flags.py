"""``--answer`` for a node the graph does not ask at is refused before anything runs."""

from __future__ import annotations

GRAPH = """
name: ask
version: "1.0"
start: review
nodes:
  review:
    type: approval
    question: "Ship it?"
    options: ["yes", "no"]
    routes: {"yes": done, "no": done}
    on_other: done
    next: done
  done:
    type: end
    output: "decided"
"""


def test_unknown_answer_node_is_a_usage_error(graphrun, agent) -> None:
    path = agent(GRAPH)
    result = graphrun("run", str(path), "--answer", "revew=yes")
    assert result.code == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --answer revew=…: the graph has no node 'revew' (did you mean 'review'?)"
    )
    assert not graphrun.db.exists() or graphrun("runs", "--json").stdout == ""


def test_answer_for_a_non_human_node_is_a_usage_error(graphrun, agent) -> None:
    path = agent(GRAPH)
    result = graphrun("run", str(path), "--answer", "done=yes")
    assert result.code == 2
    assert "node 'done' (end) is not an input or approval node" in result.stderr


def test_known_answer_node_runs(graphrun, agent) -> None:
    path = agent(GRAPH)
    result = graphrun("run", str(path), "--answer", "review=yes")
    assert result.code == 0, result.stderr
    assert result.stdout == "decided\n"
