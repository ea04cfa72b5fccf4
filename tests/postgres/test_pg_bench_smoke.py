"""bench/pg_bench.py still runs: its smallest mode, as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_pg_bench_runs_and_prints_every_ratio(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pg_bench.py"), "--smoke"],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        cwd=tmp_path,
        timeout=280,
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    out = proc.stdout
    for name in ("throughput, 2 workers vs 1", "throughput, 4 workers vs 1"):
        assert f"  {name}: " in out, out
    assert "per-step overhead of a driven llm step" in out, out
    assert out.rstrip().splitlines()[-1].startswith("== pg_bench: ")
