"""Fuzzing graph.yaml loading and command lines: no traceback, no exit 70, no hang,
bounded memory.

Each campaign runs in its own process (``tests/support/fuzz_worker.py``), so its
peak memory is its own. CI runs a few hundred cases; set ``GRAPHRUN_FUZZ_GRAPHS``
and ``GRAPHRUN_FUZZ_CLI`` for more (and ``GRAPHRUN_FUZZ_SEED`` to any value for
random rather than derandomized cases), e.g.::

    GRAPHRUN_FUZZ_GRAPHS=10000 GRAPHRUN_FUZZ_CLI=2000 \\
        pytest -s tests/integration/test_fuzz_inputs.py

A few command lines also go through a real ``graphrun`` process with raw bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(7200)]

#: Peak resident memory allowed to a fuzzing process.
PEAK_MIB = 512


def campaign(mode: str, count: int, workdir: Path) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.fuzz_worker", mode, str(count), str(workdir)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=7000,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"fuzz {mode}: {report}")
    return report


@pytest.mark.parametrize(("mode", "variable", "default"), [
    ("graphs", "GRAPHRUN_FUZZ_GRAPHS", 500),
    ("cli", "GRAPHRUN_FUZZ_CLI", 300),
    # Commands per damaged column besides runs and show (every column x every damage).
    ("stored", "GRAPHRUN_FUZZ_STORED", 3),
])  # fmt: skip
def test_fuzz(mode: str, variable: str, default: int, tmp_path: Path) -> None:
    count = int(os.environ.get(variable, default))
    report = campaign(mode, count, tmp_path / mode)
    assert report["failure"] is None, report["failure"]
    assert report["cases"] >= (150 if mode == "stored" else min(count, 100))
    assert 70 not in report["codes"]
    assert report["peak_kib"] < PEAK_MIB * 1024, report


RAW = [
    [b"run", b"agent", b"\xff\xfe"],
    [b"run", b"agent", b"--set", b"v=" + b"[" * 50_000 + b"]" * 50_000],
    [b"run", b"agent", b"--answer", b"ask=\xc3"],
    [b"run", b"a" * 4000],
    [b"validate", b"\xed\xa0\x80"],
    [b"approve", b"\x7f\x80", b"x", b"--as", b"y"],
    [b"audit", b"x", b"--verify", b"--anchor", b"\xff"],
    [b"events", b"%" * 300],
    [b"run", b"agent", b"--set", b'k="\\ud800"'],
    [b"run", b"agent", b"--answer", b'ask="\\udfff"'],
]


@pytest.mark.parametrize("argv", RAW, ids=range(len(RAW)))
def test_raw_command_lines(graphrun: Any, agent: Any, argv: list[bytes]) -> None:
    agent("name: g\nversion: '1.0'\nstart: done\nnodes:\n  done:\n    type: end\n", name="agent")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "graphrun.cli", *argv],
            capture_output=True,
            env=graphrun.env(),
            cwd=graphrun.tmp_path,
            timeout=60,
        )
    except OSError:  # the OS refuses an argument this long: nothing to test
        pytest.skip("argument list too long for this OS")
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode not in (0, 70), stderr
    assert "Traceback" not in stderr and "internal error" not in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
