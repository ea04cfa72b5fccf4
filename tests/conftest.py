"""Fixtures for the whole suite: real SQLite files, real subprocesses, real HTTP.

* ``fake_llm``: an HTTP server on 127.0.0.1 speaking the OpenAI and Anthropic
  wire protocols (``tests/support/fake_llm.py``).
* ``graphrun``: runs the real CLI as a subprocess with a fresh database.
* Every test ends with no actor left running (pykka's own suite does the same).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# A shell starts a background job (``make test &``, a CI runner without job control)
# with Ctrl-C ignored, and every process the suite starts would inherit that: the
# tests of Ctrl-C send it to `graphrun run`, which must get it as a terminal gives
# it. Handlers are reset on exec, an ignored signal is not: so it is handled here.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

pytest_plugins = ["tests.support.fake_llm"]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _stop_all_actors() -> Iterator[None]:
    yield
    import pykka

    pykka.ActorRegistry.stop_all(block=True, timeout=10)


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads or writes the user's real config, agents or database."""
    monkeypatch.setenv("GRAPHRUN_CONFIG_DIR", str(tmp_path / "_config"))
    monkeypatch.setenv("GRAPHRUN_DB", str(tmp_path / "_default.db"))
    monkeypatch.setenv("GRAPHRUN_NO_TTY", "1")
    monkeypatch.delenv("GRAPHRUN_AGENTS_DIR", raising=False)
    monkeypatch.delenv("LOKI_CONFIG_DIR", raising=False)
    monkeypatch.delenv("GRAPHRUN_LOG", raising=False)
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    # LLM clients honour the environment's proxies: the local test servers must
    # be reached directly, whatever the machine running the suite has set.
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(key, raising=False)
        monkeypatch.delenv(key.lower(), raising=False)


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> object:
        return json.loads(self.stdout)

    def json_lines(self) -> list[object]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]


class GraphrunCli:
    """The real ``graphrun`` command in a subprocess, with its own database."""

    def __init__(self, tmp_path: Path) -> None:
        self.db = tmp_path / "events.db"
        self.tmp_path = tmp_path

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["GRAPHRUN_DB"] = str(self.db)
        env.update(extra)
        return env

    def __call__(
        self, *args: str, input: str | None = None, timeout: float = 60, **env: str
    ) -> Result:
        proc = subprocess.run(
            [sys.executable, "-m", "graphrun.cli", *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=timeout,
            env=self.env(**env),
            cwd=self.tmp_path,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def cmd_line(self, *args: str) -> str:
        """The command as one shell line (for pipelines)."""
        import shlex

        return shlex.join([sys.executable, "-m", "graphrun.cli", *args])

    def popen(self, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "graphrun.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=self.env(**env),
            cwd=self.tmp_path,
        )

    def last_run(self) -> str:
        rows = self("runs", "--json").json_lines()
        assert rows, "no runs"
        return str(rows[0]["run_id"])  # type: ignore[index]


@pytest.fixture
def graphrun(tmp_path: Path) -> GraphrunCli:
    return GraphrunCli(tmp_path)


def write_agent(root: Path, graph: str, files: dict[str, str] | None = None) -> Path:
    """An agent directory with graph.yaml and the given files (dedented)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "graph.yaml").write_text(textwrap.dedent(graph).lstrip(), encoding="utf-8")
    for name, text in (files or {}).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return root


@pytest.fixture
def agent(tmp_path: Path):  # type: ignore[no-untyped-def]
    """``agent(graph_yaml, files)`` writes an agent dir under tmp_path and returns it."""
    counter = iter(range(1000))

    def make(graph: str, files: dict[str, str] | None = None, name: str | None = None) -> Path:
        return write_agent(tmp_path / (name or f"agent{next(counter)}"), graph, files)

    return make
