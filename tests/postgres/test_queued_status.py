"""A submitted run no worker has claimed yet shows as ``queued`` (not ``interrupted``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import write_agent
from tests.postgres.test_workers import cli, setup, worker  # noqa: F401
from tests.support.pg import PgServer, pg_server, pg_url  # noqa: F401  (fixtures)

pytest.importorskip("psycopg")

GRAPH = """\
name: queued
version: "1.0"
start: done
nodes:
  done:
    type: end
    output: "ok"
"""


@pytest.mark.timeout(120)
def test_a_submitted_run_is_queued_until_a_worker_takes_it(setup: dict[str, Any]) -> None:  # noqa: F811
    ctx = setup
    agent = write_agent(ctx["tmp"] / "queued", GRAPH)
    submitted = cli(ctx, "submit", str(agent), "x")
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    listed = cli(ctx, "runs")
    line = next(line for line in listed.stdout.splitlines() if line.startswith(run_id))
    assert " queued " in line
    assert " interrupted " not in line
    only = cli(ctx, "runs", "--status", "queued", "--json")
    assert run_id in only.stdout
    assert cli(ctx, "runs", "--status", "interrupted", "--json").stdout == ""
    proc = worker(ctx, "--once")
    assert proc.wait(90) == 0
    after = cli(ctx, "runs")
    line = next(line for line in after.stdout.splitlines() if line.startswith(run_id))
    assert " completed " in line
