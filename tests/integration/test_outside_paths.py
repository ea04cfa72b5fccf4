"""One rule for the paths a graph names: inside the agent folder once ``..`` and
symlinks are resolved (rag ``documents`` and the files they reach, ``agent:``,
scripts, knowledge-base files), unless the user allows a root
(``GRAPHRUN_ALLOWED_ROOTS``) or any path (``GRAPHRUN_ALLOW_OUTSIDE_PATHS=1``);
``validate`` refuses what the run would refuse, with the line."""

from __future__ import annotations

import os
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


HINT = (
    "keep it inside the folder, or let graphs read there: GRAPHRUN_ALLOWED_ROOTS=DIR "
    "(or GRAPHRUN_ALLOW_OUTSIDE_PATHS=1), set by the user who runs the graph"
)


def rag_agent(tmp_path: Path, docs: Path, how: str) -> tuple[Path, str]:
    root = tmp_path / "agent"
    root.mkdir()
    if how == "dotdot":
        entry = "../shared/docs/"
    elif how == "absolute":
        entry = f"{docs}/"
    elif how == "symlinked-file":
        (root / "kb").mkdir()
        (root / "kb" / "bees.md").symlink_to(docs / "bees.md")
        entry = "./kb/"
    else:
        (root / "linked").symlink_to(docs, target_is_directory=True)
        entry = "./linked/" if how == "symlink" else "./linked/*.md"
    (root / "graph.yaml").write_text(RAG.format(docs=entry))
    return root, entry


HOWS = ["dotdot", "symlink", "glob-through-symlink", "symlinked-file", "absolute"]


@pytest.mark.parametrize("how", HOWS)
def test_rag_documents_outside_the_folder_are_refused(
    graphrun: Any, docs: Path, tmp_path: Path, how: str
) -> None:
    root, entry = rag_agent(tmp_path, docs, how)
    for command in (["validate", str(root)], ["run", str(root), "bees"]):
        res = graphrun(*command)
        assert res.code == 2, res.stderr
        assert "Bees make honey" not in res.stdout
        shown = "" if how != "symlinked-file" else " (file ./kb/bees.md)"
        assert (
            f"graph.yaml:7 ($.nodes.r.documents[0]): rag node 'r': document '{entry}'{shown} "
            f"is outside the agent folder ({docs}"
        ) in res.stderr, res.stderr
        assert f"({HINT})" in res.stderr
    assert graphrun("runs", "--json").stdout == ""


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("allow", ["roots", "any"])
def test_rag_documents_the_user_allows(
    graphrun: Any, docs: Path, tmp_path: Path, how: str, allow: str
) -> None:
    root, _entry = rag_agent(tmp_path, docs, how)
    env = (
        {"GRAPHRUN_ALLOWED_ROOTS": f"/nonexistent{os.pathsep}{tmp_path / 'shared'}"}
        if allow == "roots"
        else {"GRAPHRUN_ALLOW_OUTSIDE_PATHS": "1"}
    )
    assert graphrun("validate", str(root), **env).code == 0
    res = graphrun("run", str(root), "bees", **env)
    assert res.code == 0, res.stderr
    assert "Bees make honey from nectar." in res.stdout


def test_an_allowed_root_is_not_a_prefix_match(graphrun: Any, docs: Path, tmp_path: Path) -> None:
    root, _entry = rag_agent(tmp_path, docs, "dotdot")
    res = graphrun("run", str(root), "bees", GRAPHRUN_ALLOWED_ROOTS=str(tmp_path / "sha"))
    assert res.code == 2 and "is outside the agent folder" in res.stderr


def test_an_agent_path_inside_the_graphs_folder(graphrun: Any, agent: Any, tmp_path: Path) -> None:
    root = agent(PARENT.format(agent="sub/child"), {"sub/child/graph.yaml": CHILD})
    res = graphrun("run", str(root))
    assert res.code == 0, res.stderr
    assert res.stdout == "child hi\n"


@pytest.mark.parametrize("where", ["dotdot", "absolute", "symlink"])
def test_an_agent_outside_the_graphs_folder(
    graphrun: Any, agent: Any, tmp_path: Path, where: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "graph.yaml").write_text(CHILD)
    root = tmp_path / "parent"
    name = {"dotdot": "../outside", "absolute": str(outside), "symlink": "./sub"}[where]
    agent(PARENT.format(agent=name), name="parent")
    if where == "symlink":
        (root / "sub").symlink_to(outside, target_is_directory=True)
    # validate refuses it as the run does, with the line (it used to pass it).
    res = graphrun("validate", str(root))
    assert res.code == 2, res.stdout + res.stderr
    assert (
        f"graph.yaml:7 ($.nodes.a.agent): agent '{name}' is outside the agent folder "
        f"({outside}) (name an agent in the agents directory, or {HINT})"
    ) in res.stderr
    res = graphrun("run", str(root))
    assert res.code == 2, res.stderr
    assert f"agent '{name}' is outside the agent folder ({outside})" in res.stderr
    assert graphrun("runs", "--json").stdout == ""
    for env in ({"GRAPHRUN_ALLOW_OUTSIDE_PATHS": "1"}, {"GRAPHRUN_ALLOWED_ROOTS": str(outside)}):
        assert graphrun("validate", str(root), **env).code == 0
        allowed = graphrun("run", str(root), **env)
        assert allowed.code == 0, allowed.stderr
        assert allowed.stdout == "child hi\n"


@pytest.mark.parametrize("where", ["dotdot", "symlink"])
def test_a_script_outside_the_folder_and_the_allowance(
    graphrun: Any, agent: Any, tmp_path: Path, where: str
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "hello.py").write_text('import json\nprint(json.dumps({"o": "shared"}))\n')
    root = tmp_path / "scripted"
    script = "../shared/hello.py" if where == "dotdot" else "scripts/hello.py"
    agent(
        "name: s\nversion: '1.0'\nstart: a\nnodes:\n  a:\n    type: script\n"
        f"    script: {script}\n    next: done\n  done:\n    type: end\n    output: '{{{{o}}}}'\n",
        name="scripted",
    )
    if where == "symlink":
        (root / "scripts").mkdir()
        (root / "scripts" / "hello.py").symlink_to(shared / "hello.py")
    for command in (["validate", str(root)], ["run", str(root)]):
        res = graphrun(*command)
        assert res.code == 2, res.stderr
        assert f"script '{script}' is outside the agent folder" in res.stderr
    res = graphrun("run", str(root), GRAPHRUN_ALLOWED_ROOTS=str(shared))
    assert res.code == 0, res.stderr
    assert res.stdout == "shared\n"


def test_a_rag_node_id_cannot_place_its_knowledge_base_outside(
    graphrun: Any, tmp_path: Path, docs: Path
) -> None:
    root = tmp_path / "agent"
    (root / "kb").mkdir(parents=True)
    (root / "kb" / "bees.md").write_text("# Bees\nBees make honey.\n")
    graph = (
        RAG.format(docs="./kb/")
        .replace("start: r", "start: ../../r")
        .replace("  r:\n", "  ../../r:\n")
    )
    (root / "graph.yaml").write_text(graph)
    res = graphrun("validate", str(root))
    assert res.code == 2
    assert "the knowledge base file of rag node '../../r' is outside the agent folder" in (
        res.stderr
    )
    assert not (tmp_path.parent / "r.yaml").exists()


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
