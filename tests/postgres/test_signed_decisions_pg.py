"""Signed decisions on a real PostgreSQL server: a signed approval continued by a
worker (which signs the head it leaves), and ``migrate`` both ways keeping every
signature verifiable, never re-signing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import write_agent
from tests.support.pg import pg_server, pg_url  # noqa: F401  (fixtures)
from tests.support.ssh import make_key, write_signers

pytest.importorskip("psycopg")

QUORUM = """
    name: quorum
    version: "1.0"
    start: publish
    settings:
      signed_decisions: required
    nodes:
      publish:
        type: approval
        question: "Publish {{initial_prompt}}?"
        options: [approve, reject]
        routes: {approve: done, reject: done}
        on_other: done
        approvals: {required: 2, of: [alice, bob, carol]}
        state_updates:
          choice: "{{choice}}"
      done:
        type: end
        output: "{{choice}} {{initial_prompt}}"
"""


def cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graphrun.cli", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        cwd=cwd,
    )


@pytest.fixture
def signed(tmp_path: Path, pg_url: str) -> dict[str, Any]:  # noqa: F811
    keys = {
        name: make_key(tmp_path / "keys", name, kind)
        for name, kind in (
            ("alice", "ed25519"),
            ("bob", "ecdsa"),
            ("carol", "rsa"),
            ("worker", "ed25519"),
        )
    }
    folder = write_agent(tmp_path / "quorum", QUORUM)
    write_signers(folder / "allowed_signers", *keys.values())
    env = dict(os.environ)
    env.update(
        GRAPHRUN_DB=pg_url,
        GRAPHRUN_HEAD_KEY=str(keys["worker"].path),
        GRAPHRUN_HEAD_PRINCIPAL="worker",
    )
    return {"tmp": tmp_path, "keys": keys, "agent": folder, "env": env, "url": pg_url}


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def status(ctx: dict[str, Any], run_id: str, db: str | None = None) -> str:
    env = dict(ctx["env"], GRAPHRUN_DB=db or ctx["url"])
    rows = [json.loads(x) for x in cli(env, ctx["tmp"], "runs", "--json").stdout.splitlines()]
    return next(r["status"] for r in rows if r["run_id"] == run_id)


@pytest.mark.timeout(300)
def test_a_worker_continues_a_signed_two_of_three_approval(signed: dict[str, Any]) -> None:
    ctx = signed
    env, tmp, keys = ctx["env"], ctx["tmp"], ctx["keys"]
    sub = cli(env, tmp, "submit", str(ctx["agent"]), "v1")
    assert sub.returncode == 0, sub.stderr
    run_id = sub.stdout.strip()
    log = open(tmp / "worker.log", "w")  # noqa: SIM115
    worker = subprocess.Popen(
        [sys.executable, "-m", "graphrun.cli", "worker", "--concurrency", "1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=tmp,
    )
    try:
        wait_for(lambda: status(ctx, run_id) == "waiting", 60, "the approval")
        unsigned = cli(env, tmp, "approve", run_id, "approve", "--as", "alice")
        assert unsigned.returncode == 2 and "requires a signed answer" in unsigned.stderr
        first = cli(env, tmp, "approve", run_id, "approve", "--sign", str(keys["alice"].path))
        assert first.returncode == 0, first.stderr
        assert "waits for more signatures" in first.stderr
        again = cli(env, tmp, "approve", run_id, "approve", "--sign", str(keys["alice"].path))
        assert again.returncode == 2 and "counts once" in again.stderr
        second = cli(env, tmp, "approve", run_id, "approve", "--sign", str(keys["bob"].path))
        assert second.returncode == 0, second.stderr
        assert f"run {run_id} is queued for a worker" in second.stderr
        wait_for(lambda: status(ctx, run_id) == "completed", 60, "the approved run")
        audit = cli(env, tmp, "audit", run_id, "--verify")
        assert audit.returncode == 0, audit.stderr
        assert audit.stderr.count("verified: ") == 2
        assert "signed head(s) (key SHA256:" in audit.stderr
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
        log.close()


@pytest.mark.timeout(300)
def test_migrate_both_ways_keeps_signatures_verifiable(signed: dict[str, Any]) -> None:
    ctx = signed
    tmp, keys = ctx["tmp"], ctx["keys"]
    laptop = tmp / "laptop.db"
    local = dict(ctx["env"], GRAPHRUN_DB=str(laptop))
    ran = cli(local, tmp, "run", str(ctx["agent"]), "m1")
    assert ran.returncode == 3, ran.stderr
    run_id = json.loads(cli(local, tmp, "runs", "--json").stdout.splitlines()[0])["run_id"]
    first = cli(local, tmp, "approve", run_id, "approve", "--sign", str(keys["carol"].path))
    assert first.returncode == 0, first.stderr
    up = cli(ctx["env"], tmp, "migrate", "--from", str(laptop), "--to", ctx["url"])
    assert up.returncode == 0, up.stderr
    on_pg = cli(ctx["env"], tmp, "audit", run_id, "--verify")
    assert on_pg.returncode == 0, on_pg.stderr
    assert "(co-signature) (key SHA256:" in on_pg.stderr
    second = cli(ctx["env"], tmp, "approve", run_id, "approve", "--sign", str(keys["bob"].path))
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "approve m1"
    back = tmp / "back.db"
    down = cli(ctx["env"], tmp, "migrate", "--from", ctx["url"], "--to", str(back))
    assert down.returncode == 0, down.stderr
    home = dict(ctx["env"], GRAPHRUN_DB=str(back))
    audit = cli(home, tmp, "audit", run_id, "--verify", "--json")
    assert audit.returncode == 0, audit.stderr
    report = json.loads(audit.stdout)
    assert report["signatures"]["counts"] == {"verified": 2}
    assert all(h["ok"] for h in report["signatures"]["heads"])
    # The same statement bytes and signatures as signed on the laptop: never re-signed.
    from graphrun.eventstore.store import SqliteStore

    with SqliteStore(laptop) as a, SqliteStore(back) as b:
        signed_a = [e for e in a.read(run_id) if getattr(e, "signature", "")]
        signed_b = [e for e in b.read(run_id) if getattr(e, "signature", "")]
        assert signed_a[0] in signed_b
