"""A command that continues a run reads and verifies its log once and folds it once.

The counts come from the real CLI in a subprocess whose store methods and ``fold``
are wrapped with counters (``tests/support/count_reads.py``): ``approve``,
``answer``, ``resume`` and ``upgrade`` open the run once and hand it to the driver,
which neither reads, verifies nor folds it again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.test_human_nodes import APPROVAL, DRAFT, events, of_type

COUNTER = Path(__file__).parents[1] / "support" / "count_reads.py"
ONCE = {"read_verified": 1, "fold": 1}


def counted(graphrun: Any, *args: str) -> tuple[int, str, dict[str, int]]:
    """Run ``graphrun ARGS`` with the counters: exit code, stderr, the counts of
    reads and folds (appends left out)."""
    out = graphrun.tmp_path / "counts.json"
    proc = subprocess.run(
        [sys.executable, str(COUNTER), str(out), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=graphrun.env(),
        cwd=graphrun.tmp_path,
        stdin=subprocess.DEVNULL,
    )
    counts = json.loads(out.read_text(encoding="utf-8"))
    counts.pop("append", None)
    return proc.returncode, proc.stderr, counts


def _waiting(graphrun: Any, agent: Any) -> str:
    root = agent(APPROVAL, DRAFT)
    (root / "scripts" / "draft.sh").chmod(0o755)
    assert graphrun("run", str(root)).code == 3
    return graphrun.last_run()  # type: ignore[no-any-return]


def test_approve_and_answer_read_the_log_once_and_fold_it_once(graphrun: Any, agent: Any) -> None:
    run_id = _waiting(graphrun, agent)
    code, err, counts = counted(graphrun, "approve", run_id, "--other", "later", "--as", "alice")
    assert code == 3, err  # the free-form answer leads to the input node, which waits
    assert counts == ONCE
    code, err, counts = counted(graphrun, "answer", run_id, "ship it later", "--as", "alice")
    assert code == 0, err
    assert counts == ONCE
    evs = events(graphrun.db, run_id)
    assert evs[-1]["type"] == "RunCompleted"
    assert [e["answer"] for e in of_type(evs, "HumanInputReceived")] == ["later", "ship it later"]


def test_a_refused_answer_reads_once_and_leaves_the_log_as_it_was(
    graphrun: Any, agent: Any
) -> None:
    run_id = _waiting(graphrun, agent)
    before = events(graphrun.db, run_id)
    code, err, counts = counted(graphrun, "approve", run_id, "maybe", "--as", "alice")
    assert code == 2, err
    assert "maybe" in err
    assert counts == ONCE
    assert events(graphrun.db, run_id) == before


def test_resume_with_an_answer_reads_once(graphrun: Any, agent: Any) -> None:
    run_id = _waiting(graphrun, agent)
    code, err, counts = counted(graphrun, "resume", run_id, "--answer", "review=approve")
    assert code == 0, err
    assert counts == ONCE
    assert events(graphrun.db, run_id)[-1]["output"] == "shipped v2.1 (approve)"


def test_upgrade_reads_each_run_once(graphrun: Any, agent: Any) -> None:
    run_id = _waiting(graphrun, agent)
    root = agent(APPROVAL.replace('"Ship {{title}}?"', '"Ship {{title}}?"\n    description: gate'))
    (root / "scripts").mkdir()
    (root / "scripts" / "draft.sh").write_text(DRAFT["scripts/draft.sh"], encoding="utf-8")
    (root / "scripts" / "draft.sh").chmod(0o755)
    code, err, counts = counted(graphrun, "upgrade", run_id, "--graph", str(root))
    assert code == 0, err
    # The upgrade's check replays the history against the new graph (its own fold).
    assert counts["read_verified"] == 1 and "read" not in counts and "raw_rows" not in counts
    assert of_type(events(graphrun.db, run_id), "GraphUpgraded")
