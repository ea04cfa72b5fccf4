"""Paths a graph names: rag folders through ``..`` or a symlink work; absolute
``documents`` and ``agent:`` paths outside the graph's folder need the user's opt-in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

RAG = """\
name: rag
version: "1.0"
start: r
nodes:
  r:
    type: rag
    documents: ["{docs}"]
    embedding_model: local:hash-384
    chunk_size: 600
    chunk_overlap: 60
    state_updates:
      c: "{{{{output.context}}}}"
    next: done
  done:
    type: end
    output: "{{{{c}}}}"
"""

PARENT = """\
name: parent
version: "1.0"
start: a
nodes:
  a:
    type: agent
    agent: {agent}
    prompt: hi
    state_updates:
      o: "{{{{output}}}}"
    next: done
  done:
    type: end
    output: "{{{{o}}}}"
"""

CHILD = 'name: child\nversion: "1.0"\nstart: done\nnodes:\n  done:\n    type: end\n    output: "child {{initial_prompt}}"\n'  # noqa: E501


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    folder = tmp_path / "shared" / "docs"
    folder.mkdir(parents=True)
    (folder / "bees.md").write_text("# Bees\nBees make honey from nectar.\n")
    return folder


@pytest.mark.parametrize("how", ["dotdot", "symlink", "glob-through-symlink"])
def test_rag_folders_through_dotdot_or_a_symlink(
    graphrun: Any, agent: Any, docs: Path, tmp_path: Path, how: str
) -> None:
    root = tmp_path / "agent"
    root.mkdir()
    if how == "dotdot":
        entry = "../shared/docs/"
    else:
        (root / "linked").symlink_to(docs, target_is_directory=True)
        entry = "./linked/" if how == "symlink" else "./linked/*.md"
    agent(RAG.format(docs=entry), name="agent")
    res = graphrun("run", str(root), "bees")
    assert res.code == 0, res.stderr
    cited = entry.removesuffix("*.md") + "bees.md"
    assert res.stdout == f"[Source: {cited}]\n# Bees\nBees make honey from nectar.\n"


def test_absolute_documents_need_the_opt_in(graphrun: Any, agent: Any, docs: Path) -> None:
    root = agent(RAG.format(docs=f"{docs}/"))
    res = graphrun("run", str(root), "bees")
    assert res.code == 2, res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: rag node 'r': document '{docs}/' is an absolute path (name documents "
        "relative to the agent directory, or set GRAPHRUN_ALLOW_OUTSIDE_PATHS=1)"
    )
    assert graphrun("runs", "--json").stdout == ""
    allowed = graphrun("run", str(root), "bees", GRAPHRUN_ALLOW_OUTSIDE_PATHS="1")
    assert allowed.code == 0, allowed.stderr
    assert "Bees make honey" in allowed.stdout


def test_an_agent_path_inside_the_graphs_folder(graphrun: Any, agent: Any, tmp_path: Path) -> None:
    root = agent(PARENT.format(agent="sub/child"), {"sub/child/graph.yaml": CHILD})
    res = graphrun("run", str(root))
    assert res.code == 0, res.stderr
    assert res.stdout == "child hi\n"


@pytest.mark.parametrize("where", ["dotdot", "absolute"])
def test_an_agent_outside_the_graphs_folder_needs_the_opt_in(
    graphrun: Any, agent: Any, tmp_path: Path, where: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "graph.yaml").write_text(CHILD)
    root = tmp_path / "parent"
    name = "../outside" if where == "dotdot" else str(outside)
    agent(PARENT.format(agent=name), name="parent")
    res = graphrun("run", str(root))
    assert res.code == 1, res.stderr
    assert (
        f"node 'a': agent '{name}' is outside the graph's folder (name an agent in the agents "
        "directory, or set GRAPHRUN_ALLOW_OUTSIDE_PATHS=1)"
    ) in res.stderr
    assert not (outside / "ran").exists()
    allowed = graphrun("run", str(root), GRAPHRUN_ALLOW_OUTSIDE_PATHS="1")
    assert allowed.code == 0, allowed.stderr
    assert allowed.stdout == "child hi\n"


def test_an_agent_name_is_not_looked_up_in_the_working_directory(
    graphrun: Any, agent: Any, tmp_path: Path
) -> None:
    # A folder named like the agent in the directory graphrun runs in is not used.
    (graphrun.tmp_path / "helper").mkdir()
    (graphrun.tmp_path / "helper" / "graph.yaml").write_text(CHILD)
    root = agent(PARENT.format(agent="helper"))
    agents = tmp_path / "agents"
    agents.mkdir()
    res = graphrun("run", str(root), "--agents-dir", str(agents))
    assert res.code == 2
    assert "no agent 'helper' in" in res.stderr
