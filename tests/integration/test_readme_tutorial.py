"""The runnable blocks of the README and of every page in docs/, run literally, in
order, as a reader would.

A fenced block whose info string is ``bash runnable`` is run with ``bash -e`` in
one fresh working folder shared by all such blocks of one file (``cwd=repo``: in
the repository's root instead), against one fresh database per file; ``exit=N``
says the exit status the block must end with (default 0). A ``text output``
block right after a runnable block is what that block must print on stdout,
exactly. The checkout is on ``PYTHONPATH`` (the tutorial starts the test suite's
stand-in LLM server).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


@dataclass
class Block:
    line: int
    code: str
    exit: int = 0
    in_repo: bool = False
    output: str | None = None


def runnable_blocks(text: str) -> list[Block]:
    """The runnable blocks of a Markdown text, each with the output it must print."""
    blocks: list[Block] = []
    last_end = -1
    for match in _FENCE.finditer(text):
        info = match.group(1).split()
        line = text.count("\n", 0, match.start()) + 1
        if info[:2] == ["bash", "runnable"]:
            attrs = dict(a.split("=", 1) for a in info[2:] if "=" in a)
            blocks.append(
                Block(
                    line,
                    match.group(2),
                    exit=int(attrs.get("exit", "0")),
                    in_repo=attrs.get("cwd") == "repo",
                )
            )
        elif info[:2] == ["text", "output"]:
            between = text[last_end : match.start()]
            assert blocks and not between.strip(), f"line {line}: output of no block"
            blocks[-1].output = match.group(2)
        last_end = match.end()
    return blocks


DOCS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))


def test_the_readme_and_the_tutorial_have_runnable_blocks() -> None:
    assert runnable_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    # The tutorial: folder, graph, script, validate, run, approve, a free-form
    # answer, the audit, an llm node.
    tutorial = runnable_blocks((ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8"))
    assert len(tutorial) >= 10
    assert sum(b.output is not None for b in tutorial) >= 3


@pytest.mark.parametrize("doc", ["README.md", *DOCS])
def test_the_runnable_blocks_run_as_written(doc: str, tmp_path: Path) -> None:
    blocks = runnable_blocks((ROOT / doc).read_text(encoding="utf-8"))
    if not blocks:
        return  # a page of reference text only
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **os.environ,
        "GRAPHRUN_DB": str(tmp_path / "docs.db"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    for block in blocks:
        done = subprocess.run(
            ["bash", "-e", "-c", block.code],
            cwd=ROOT if block.in_repo else work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        where = f"{doc}:{block.line}\n{block.code}\nstderr:\n{done.stderr}"
        assert done.returncode == block.exit, where
        assert "Traceback" not in done.stderr, where
        if block.output is not None:
            assert done.stdout == block.output, where


def test_the_tutorial_graph_is_a_script_an_approval_and_ends() -> None:
    text = (ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8")
    graph = next(b.code for b in runnable_blocks(text) if "hello/graph.yaml" in b.code)
    kinds = re.findall(r"type: (\w+)", graph)
    assert kinds == ["script", "approval", "end", "end"]
