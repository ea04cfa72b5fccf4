"""The console's JSON API and its guards, over HTTP against a real ``graphrun serve``.

API tokens answer as token-authenticated identities and continue the run in
the console's process (SQLite); a signature made with a real SSH key goes
through the same endpoint as verified; a trusted proxy's identity header is
recorded as proxy-asserted and still needs the console's origin and CSRF token;
every refused answer (not an approver, not an option, unsigned where a signature
is required, no longer waiting) says why and records nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import write_agent
from tests.support.console import ConsoleServer
from tests.support.ssh import make_key, write_signers

GATE = """
name: gate
version: "1.0"
start: review
nodes:
  review:
    type: approval
    question: "Publish release {{initial_prompt}}?"
    options: [approve, reject]
    approvers: [alice]
    routes: {approve: done, reject: done}
    on_other: done
  done: {type: end, output: "published"}
"""


def _cli(db: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graphrun.cli", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, GRAPHRUN_DB=str(db)),
        cwd=cwd,
        timeout=60,
    )


def _waiting_run(db: Path, cwd: Path, agent: Path, prompt: str = "1.0") -> str:
    done = _cli(db, cwd, "run", str(agent), prompt)
    assert done.returncode == 3, done.stderr
    return re.search(r"run (\w+) waits", done.stderr).group(1)  # type: ignore[union-attr]


def _token(db: Path, cwd: Path, name: str) -> str:
    done = _cli(db, cwd, "serve", "--no-serve", "--port", "0", "--token", name)
    assert done.returncode == 0, done.stderr
    return done.stdout.rsplit(": ", 1)[1].strip()


def _events(db: Path, cwd: Path, run_id: str) -> list[dict[str, Any]]:
    done = _cli(db, cwd, "events", run_id, "--json")
    return [json.loads(line) for line in done.stdout.splitlines()]


def _until(check: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError("timed out")


@pytest.fixture
def http() -> Iterator[Callable[..., httpx.Client]]:
    made: list[httpx.Client] = []

    def make(**kwargs: Any) -> httpx.Client:
        made.append(httpx.Client(timeout=30, **kwargs))
        return made[-1]

    yield make
    for client in made:
        client.close()


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    return write_agent(tmp_path / "gate", GATE)


@pytest.mark.timeout(120)
def test_tokens_answer_and_refusals_record_nothing(gate, http, tmp_path):
    db = tmp_path / "events.db"
    run_id = _waiting_run(db, tmp_path, gate)
    alice, bob = _token(db, tmp_path, "alice"), _token(db, tmp_path, "bob")
    server = ConsoleServer.start(str(db), tmp_path)
    try:
        api = http(base_url=server.url)
        # Nothing without a sign-in or a token.
        assert api.get("/api/runs").status_code == 401
        assert api.get("/runs").status_code == 303
        assert api.post("/api/runs/x/answer", json={}).status_code == 401
        assert api.get("/api/runs", headers={"Authorization": "Bearer nope"}).status_code == 401

        as_alice = {"Authorization": f"Bearer {alice}"}
        as_bob = {"Authorization": f"Bearer {bob}"}
        listed = api.get("/api/runs", headers=as_alice).json()["runs"]
        assert listed[0]["waiting"]["approvers"] == ["alice"]
        waits = api.get("/api/waits", headers=as_alice).json()["waits"]
        assert [w["run_id"] for w in waits] == [run_id]
        assert waits[0]["shown"] == "Publish release 1.0?\n  1. approve\n  2. reject\n"
        assert api.get("/api/waits", headers=as_bob).json()["waits"] == []

        before = _events(db, tmp_path, run_id)
        answer = {"node": "review", "visit": 1, "answer": "approve"}
        refused = api.post(f"/api/runs/{run_id}/answer", json=answer, headers=as_bob)
        assert refused.status_code == 403
        assert refused.json()["error"] == "'bob' may not answer approval node 'review'"
        wrong = {**answer, "answer": "maybe"}
        refused = api.post(f"/api/runs/{run_id}/answer", json=wrong, headers=as_alice)
        assert refused.status_code == 400, refused.text
        stale = {**answer, "visit": 2}
        refused = api.post(f"/api/runs/{run_id}/answer", json=stale, headers=as_alice)
        assert refused.status_code == 409
        assert "no longer waits at 'review' (visit 2)" in refused.json()["error"]
        assert _events(db, tmp_path, run_id) == before

        done = api.post(f"/api/runs/{run_id}/answer", json=answer, headers=as_alice)
        assert done.status_code == 200, done.text
        assert done.json()["identity"] == "token" and done.json()["run"] == "continuing"
        # Continued in the console's process, as `graphrun approve` would.
        _until(
            lambda: api.get(f"/api/runs/{run_id}", headers=as_alice).json()["status"] == "completed"
        )
        received = [e for e in _events(db, tmp_path, run_id) if e["type"] == "HumanInputReceived"]
        assert [(e["by"], e["identity"], e["channel"]) for e in received] == [
            ("alice", "token", "console")
        ]
        again = api.post(f"/api/runs/{run_id}/answer", json=answer, headers=as_alice)
        assert again.status_code == 409
        audit = _cli(db, tmp_path, "audit", run_id)
        assert "token" in audit.stdout and "alice" in audit.stdout

        events = api.get(f"/api/runs/{run_id}/events", headers=as_alice).json()["events"]
        assert [e["type"] for e in events][-1] == "RunCompleted"
        spec = api.get("/api/openapi.json").json()
        assert spec["openapi"].startswith("3.")
        assert {"/api/runs", "/api/waits", "/api/runs/{run_id}/answer"} <= set(spec["paths"])
    finally:
        server.stop()


@pytest.mark.timeout(120)
def test_a_signed_decision_is_required_and_an_ssh_signature_is_verified(http, tmp_path):
    db = tmp_path / "events.db"
    agent = write_agent(
        tmp_path / "signed",
        GATE.replace('version: "1.0"', 'version: "1.0"\nsettings: {signed_decisions: required}'),
    )
    key = make_key(tmp_path / "keys", "alice")
    signers = write_signers(agent / "allowed_signers", key)
    run_id = _waiting_run(db, tmp_path, agent)
    alice = _token(db, tmp_path, "alice")
    server = ConsoleServer.start(str(db), tmp_path, "--signers", str(signers))
    try:
        api = http(base_url=server.url)
        auth = {"Authorization": f"Bearer {alice}"}
        answer = {"node": "review", "visit": 1, "answer": "approve"}
        before = _events(db, tmp_path, run_id)
        refused = api.post(f"/api/runs/{run_id}/answer", json=answer, headers=auth)
        assert refused.status_code == 403
        assert "requires a signed answer; nothing was recorded" in refused.json()["error"]
        assert _events(db, tmp_path, run_id) == before

        from graphrun.runtime.decisions.sshsig import sign

        prepared = api.post(f"/api/runs/{run_id}/statement", json=answer, headers=auth).json()
        statement = prepared["statement"].encode()
        bad = {"pending": prepared["pending"], "signature": sign(b"other", key.path)}
        refused = api.post(f"/api/runs/{run_id}/answer", json=bad, headers=auth)
        assert refused.status_code == 403 and "does not verify" in refused.json()["error"]
        assert _events(db, tmp_path, run_id) == before

        prepared = api.post(f"/api/runs/{run_id}/statement", json=answer, headers=auth).json()
        statement = prepared["statement"].encode()
        signed = {"pending": prepared["pending"], "signature": sign(statement, key.path)}
        done = api.post(f"/api/runs/{run_id}/answer", json=signed, headers=auth)
        assert done.status_code == 200, done.text
        assert done.json()["identity"] == "verified"
        _until(lambda: api.get(f"/api/runs/{run_id}", headers=auth).json()["status"] == "completed")
        audit = _cli(db, tmp_path, "audit", run_id, "--verify")
        assert audit.returncode == 0, audit.stdout + audit.stderr
        assert "verified" in audit.stdout
    finally:
        server.stop()


@pytest.mark.timeout(120)
def test_proxy_identity_needs_the_origin_and_the_csrf_token(gate, http, tmp_path):
    db = tmp_path / "events.db"
    run_id = _waiting_run(db, tmp_path, gate)
    server = ConsoleServer.start(
        str(db), tmp_path, "--proxy-header", "X-Remote-User", "--base-path", "/console"
    )
    try:
        assert server.url.endswith("/console")  # the URL it prints has the base path
        origin_url = server.url.removesuffix("/console")
        api = http(base_url=server.url)
        who = {"X-Remote-User": "alice"}
        page = api.get("/inbox", headers=who)
        assert page.status_code == 200 and f'id="wait-{run_id}"' in page.text
        assert 'alice <span class="muted">(proxy)</span>' in page.text
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        assert api.get("/static/console.js").status_code == 200
        csrf = re.search(r'data-csrf="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
        url = f"/api/runs/{run_id}/answer"
        answer = {"node": "review", "visit": 1, "answer": "approve"}
        before = _events(db, tmp_path, run_id)
        no_origin = api.post(url, json=answer, headers={**who, "X-CSRF-Token": csrf})
        assert no_origin.status_code == 403 and "origin" in no_origin.json()["error"]
        origin = {**who, "Origin": origin_url}
        no_csrf = api.post(url, json=answer, headers=origin)
        assert no_csrf.status_code == 403 and "CSRF" in no_csrf.json()["error"]
        assert _events(db, tmp_path, run_id) == before
        done = api.post(url, json=answer, headers={**origin, "X-CSRF-Token": csrf})
        assert done.status_code == 200, done.text
        assert done.json()["identity"] == "proxy"
        # Sign-in is refused from elsewhere, and rate-limited.
        assert api.post("/auth/signin/options").status_code == 403
        codes = [
            api.post("/auth/signin/options", headers={"Origin": origin_url}).status_code
            for _ in range(11)
        ]
        assert codes[:10] == [200] * 10 and codes[10] == 429
    finally:
        server.stop()


@pytest.mark.timeout(120)
def test_the_runs_list_pages_filters_and_searches(gate, http, tmp_path):
    db = tmp_path / "events.db"
    ids = [_waiting_run(db, tmp_path, gate, str(n)) for n in range(3)]
    token = _token(db, tmp_path, "alice")
    server = ConsoleServer.start(str(db), tmp_path)
    try:
        api = http(base_url=server.url, headers={"Authorization": f"Bearer {token}"})
        first = api.get("/api/runs", params={"limit": 2}).json()
        assert [r["run_id"] for r in first["runs"]] == ids[::-1][:2]
        rest = api.get("/api/runs", params={"limit": 2, "after": first["next"]}).json()
        assert [r["run_id"] for r in rest["runs"]] == [ids[0]] and rest["next"] is None
        assert api.get("/api/runs", params={"status": "completed"}).json()["runs"] == []
        assert api.get("/api/runs", params={"status": "bogus"}).status_code == 400
        found = api.get("/api/runs", params={"q": ids[1][:14]}).json()["runs"]
        assert [r["run_id"] for r in found] == [ids[1]]
        page = api.get("/runs", params={"agent": "gate"})
        assert all(run_id in page.text for run_id in ids)
        assert "approval: alice" in page.text
        assert api.get("/runs/nope").status_code == 404
    finally:
        server.stop()


@pytest.mark.timeout(120)
def test_a_run_started_through_the_api(gate, http, tmp_path):
    db = tmp_path / "events.db"
    token = _token(db, tmp_path, "carol")
    server = ConsoleServer.start(str(db), tmp_path, env={"GRAPHRUN_AGENTS_DIR": str(gate.parent)})
    try:
        api = http(base_url=server.url, headers={"Authorization": f"Bearer {token}"})
        refused = api.post("/api/runs", json={"agent": "../gate"})
        assert refused.status_code == 400
        assert "name an agent of the agents directory" in refused.json()["error"]
        assert api.post("/api/runs", json={"agent": "nope"}).status_code == 400
        started = api.post("/api/runs", json={"agent": "gate", "prompt": "3.0"})
        assert started.status_code == 201, started.text
        run_id = started.json()["run_id"]
        row = _until(
            lambda: (r := api.get(f"/api/runs/{run_id}").json())["status"] == "waiting" and r
        )
        assert row["started_by"] == "carol"
        assert row["waiting"]["question"] == "Publish release 3.0?"
    finally:
        server.stop()


def test_the_printed_address_answers_at_once(tmp_path: Path) -> None:
    """`serve` listens before it prints its address: a client that connects the
    moment the line appears is answered, never refused."""
    for attempt in range(4):
        server = ConsoleServer.start(str(tmp_path / f"events-{attempt}.db"), tmp_path)
        try:
            response = httpx.get(server.url + "/", timeout=30, follow_redirects=False)
            assert response.status_code < 500, response.text
        finally:
            server.stop()
