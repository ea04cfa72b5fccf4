"""Loader commands run through the one subprocess runner: a timeout kills the whole
process group, and the command gets no terminal input."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from graphrun.actors.rag import loaders as kb_loaders
from graphrun.actors.rag.loaders import RagError, load_documents


def test_a_loader_that_runs_too_long_is_killed_with_its_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kb_loaders, "_LOADER_TIMEOUT_S", 0.5)
    pids = tmp_path / "pids"
    loaders = {"slow": f'sleep 30 & echo $! > "{pids}"; sleep 30; echo $1'}
    started = time.monotonic()
    with pytest.raises(RagError, match=r"document 'slow:x': loader command timed out"):
        load_documents(["slow:x"], tmp_path, loaders=loaders, node_id="n")
    assert time.monotonic() - started < 5
    background = int(pids.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(background, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    else:
        pytest.fail("the loader's background job outlived the timeout")


def test_a_loader_reads_no_terminal_input(tmp_path: Path) -> None:
    # stdin is /dev/null: `cat` with no file argument ends at once with nothing.
    (doc,) = load_documents(["stdin:x"], tmp_path, loaders={"stdin": "cat; echo $1"}).documents
    assert doc.text == "x\n"
