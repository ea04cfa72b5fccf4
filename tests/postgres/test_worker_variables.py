"""``submit --var``: the variables are resolved where the run is submitted, recorded
in its ``RunStarted``, and what a worker's scripts see, whatever its environment."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import write_agent
from tests.postgres.test_workers import cli, setup, store_of, worker  # noqa: F401
from tests.support.pg import PgServer, pg_server, pg_url  # noqa: F401  (fixtures)

pytest.importorskip("psycopg")

SHOW = """\
import json, os
print(json.dumps({"mode": os.environ.get("LLM_AGENT_VAR_MODE")}))
"""

GRAPH = """\
name: wvars
version: "1.0"
variables:
  - name: mode
    description: Run mode
start: show
nodes:
  show:
    type: script
    script: show.py
    next: done
  done:
    type: end
    output: "{{mode}}"
"""


@pytest.mark.timeout(120)
def test_submit_records_the_variables_a_worker_uses(setup: dict[str, Any]) -> None:  # noqa: F811
    ctx = setup
    agent = write_agent(ctx["tmp"] / "wvars", GRAPH, {"show.py": SHOW})

    missing = cli(ctx, "submit", str(agent), "x")
    assert missing.returncode == 2
    assert missing.stderr.startswith(
        "error: the following agent variables are required: mode (Run mode)"
    )
    submitted = cli(ctx, "submit", str(agent), "x", "--var", "mode=submitted")
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    # The worker's environment says otherwise: the run keeps what it was submitted with.
    ctx["env"]["WVARS_VARIABLES"] = json.dumps({"mode": "worker-env"})
    proc = worker(ctx, "--once")
    assert proc.wait(90) == 0
    with store_of(ctx) as store:
        assert [r.run_id for r in store.runs()] == [run_id]
        events = store.read(run_id)
    assert events[0].config == {"variables": {"mode": "submitted"}}  # type: ignore[attr-defined]
    assert events[-1].output == "submitted"  # type: ignore[attr-defined]
