"""graphrun never changes its process for speed and never reads private internals.

A library user embedding graphrun gets their process exactly as it was: no CPU
affinity, no scheduler policy, no garbage-collector settings; and nothing here
reaches into CPython's or another library's private attributes.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("runtime", "actors", "eventstore", "cli")

FORBIDDEN = {
    "CPU affinity": r"sched_setaffinity",
    "scheduler policy": r"sched_setscheduler|\bSCHED_[A-Z]+",
    "gc.freeze": r"\bgc\.freeze\b",
    "gc.disable": r"\bgc\.disable\b",
    "gc.set_threshold": r"\bgc\.set_threshold\b",
    "gc.collect": r"\bgc\.collect\b",
    "os.environ internals": r"environ\._data|\"_data\"",
    # Another object's private attribute; an object's own (``self._pool``) is fine.
    "httpx transport internals": (
        r"(?<!\bself)\._transport\b|[\"']_transport[\"']|_transport_for_url"
    ),
    "httpcore pool internals": (
        r"(?<!\bself)\._pool\b|[\"']_pool[\"']|_network_backend|[\"']_mounts[\"']"
    ),
    "pykka future internals": r"_get_hook|_create_actor_inbox|_create_future",
}

# The SQLite store pauses the collector while it decodes a log; that file is
# being reworked separately and is the one known offender left.


def _offences() -> list[tuple[str, int, str, str]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for what, pattern in FORBIDDEN.items():
                    if re.search(pattern, line):
                        found.append((rel, number, what, line.strip()))
    return found


def test_no_process_tuning_or_private_reach_in_the_package() -> None:
    offences = _offences()
    assert offences == [], "\n".join(f"{f}:{n}: {what}: {line}" for f, n, what, line in offences)


def test_the_grep_finds_what_it_looks_for(tmp_path: Path) -> None:
    samples = {
        "os.sched_setaffinity(0, {1})": "CPU affinity",
        "os.sched_setscheduler(0, os.SCHED_BATCH, p)": "scheduler policy",
        "gc.freeze()": "gc.freeze",
        "gc.disable()": "gc.disable",
        "gc.set_threshold(5000, 10, 10)": "gc.set_threshold",
        "gc.collect()": "gc.collect",
        'getattr(os.environ, "_data")': "os.environ internals",
        "client._transport_for_url(url)": "httpx transport internals",
        "pool._network_backend = x": "httpcore pool internals",
        "if self._get_hook is not None:": "pykka future internals",
    }
    for line, what in samples.items():
        assert re.search(FORBIDDEN[what], line), line
    # An object's own attributes are its own business.
    for line in ("self._pool = ThreadPoolExecutor()", "self._transport = transport"):
        assert not any(re.search(pattern, line) for pattern in FORBIDDEN.values()), line
    assert re.search(FORBIDDEN["httpcore pool internals"], "transport._pool.close()")
