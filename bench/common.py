"""What every benchmark shares: timing, targets, the ratio report, ``--quick``.

Every benchmark measures graphrun against a baseline measured *in the same run*
(same machine, same moment), so the numbers it prints are ratios that mean
something on any machine. A :class:`Report` collects one :class:`Check` per
target, prints one line each, and gives the process exit code: 0 when every
target is met, 1 when one is missed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mode_of(args: argparse.Namespace) -> str:
    """``"smoke"``, ``"quick"`` or ``"full"``."""
    return "smoke" if args.smoke else "quick" if args.quick else "full"


def parse_args(
    doc: str | None,
    argv: list[str] | None = None,
    extra: Callable[[argparse.ArgumentParser], object] | None = None,
) -> argparse.Namespace:
    """``--quick`` (smaller sizes, same checks; for CI), ``--smoke`` and ``--json``;
    ``extra`` adds a benchmark's own options."""
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0])
    if extra is not None:
        extra(parser)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, same checks (CI)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes: only shows the benchmark still runs (its numbers mean little)",
    )
    parser.add_argument("--json", action="store_true", help="print the checks as JSON lines")
    args = parser.parse_args(argv)
    args.quick = args.quick or args.smoke
    return args


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes (the process as it is: no collector or
    scheduler settings changed, for either side of a comparison)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def timed_with_cpu(fn: Callable[[], object]) -> tuple[float, float]:
    """``(wall seconds, CPU seconds of the whole process, every thread)`` of one call.

    On a machine shared with other work, wall time also measures how the scheduler
    shares the CPUs out (per thread: an engine that spreads a step over two threads
    gets more of them than one that does it on one); CPU time does not.
    """
    cpu = time.process_time()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` timings of ``fn`` (the least disturbed run)."""
    return min(timed(fn) for _ in range(max(1, repeat)))


def median_of(fn: Callable[[], object], repeat: int) -> float:
    """The median of ``repeat`` timings of ``fn``."""
    return statistics.median(timed(fn) for _ in range(max(1, repeat)))


def run_seconds(
    cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None
) -> float:
    """Wall seconds of one subprocess run; raises if it exits non-zero."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-400:]}"
        )
    return elapsed


def graphrun_cmd() -> list[str]:
    """The installed ``graphrun`` console script next to this interpreter."""
    script = Path(sys.executable).with_name("graphrun")
    return [str(script)] if script.exists() else [sys.executable, "-m", "graphrun.cli"]


def isolated_env(tmp: Path, **extra: str) -> dict[str, str]:
    """An environment that reads and writes nothing of the user's."""
    env = dict(os.environ)
    env.update(
        GRAPHRUN_DB=str(tmp / "events.db"),
        GRAPHRUN_CONFIG_DIR=str(tmp / "config"),
        GRAPHRUN_NO_TTY="1",
    )
    for key in ("GRAPHRUN_AGENTS_DIR", "LOKI_CONFIG_DIR", "GRAPHRUN_LOG"):
        env.pop(key, None)
    env.update(extra)
    return env


@dataclass
class Check:
    """One target: ``value`` compared with ``target`` (``"<="`` or ``">="``)."""

    name: str
    value: float
    op: str
    target: float
    unit: str = "x"
    detail: str = ""
    skipped: str | None = None

    @property
    def ok(self) -> bool:
        if self.skipped is not None:
            return True
        return self.value <= self.target if self.op == "<=" else self.value >= self.target

    def line(self) -> str:
        if self.skipped is not None:
            return f"SKIP  {self.name}: {self.skipped}"
        mark = "ok  " if self.ok else "MISS"
        value = _fmt(self.value)
        target = f"{self.op} {_fmt(self.target)}{self.unit}"
        text = f"{mark}  {self.name}: {value}{self.unit} (target {target})"
        if not self.ok:
            if self.op == "<=":
                text += f", {self.value / self.target:.2f}x over"
            else:
                text += f", {self.value / self.target:.2f} of it"
        return f"{text}  [{self.detail}]" if self.detail else text


def _fmt(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


@dataclass
class Report:
    """The checks of one benchmark run, printed as they come."""

    title: str
    mode: str = "full"
    as_json: bool = False
    checks: list[Check] = field(default_factory=list)

    def __post_init__(self) -> None:
        print(f"== {self.title} ({self.mode}) ==", flush=True)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        if self.as_json:
            import json

            print(json.dumps({**check.__dict__, "ok": check.ok}), flush=True)
        else:
            print(check.line(), flush=True)
        return check

    def note(self, text: str) -> None:
        """A measured number that is context, not a target."""
        if not self.as_json:
            print(f"      {text}", flush=True)

    def exit_code(self) -> int:
        missed = [c for c in self.checks if not c.ok]
        skipped = [c for c in self.checks if c.skipped is not None]
        met = len(self.checks) - len(missed) - len(skipped)
        summary = f"{met} met, {len(missed)} missed, {len(skipped)} skipped"
        print(f"== {self.title}: {summary} ==", flush=True)
        return 1 if missed else 0


def loop_script(then: str = "done") -> str:
    """A bash script node that counts its visits in state (``i``) and routes back to
    ``step`` with ``_next`` until ``i`` reaches ``n``, then to ``then``."""
    return (
        "#!/bin/bash\n"
        's=${GRAPH_STATE:-$(<"$GRAPH_STATE_FILE")}\n'
        '[[ $s =~ \\"i\\":([0-9]+) ]] && i=${BASH_REMATCH[1]} || i=0\n'
        '[[ $s =~ \\"n\\":([0-9]+) ]] && n=${BASH_REMATCH[1]} || n=1\n'
        "i=$((i+1))\n"
        f"if (( i < n )); then next=step; else next={then}; fi\n"
        'printf \'{"i":%d,"_next":"%s"}\\n\' "$i" "$next"\n'
    )
