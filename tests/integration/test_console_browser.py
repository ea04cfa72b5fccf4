"""The console in a real Chromium against a real ``graphrun serve`` process.

alice registers a passkey from her invitation link (Chromium's virtual WebAuthn
authenticator), sees a waiting run appear in her inbox while a worker drives
other runs on PostgreSQL, approves it (her passkey signs the decision statement),
and watches the run page reach "completed" without reloading; ``graphrun audit
--verify`` then reports her decision verified by her passkey, and OpenSSH's
``ssh-keygen -Y verify`` agrees. bob, who is not an approver, does not see the
run in his inbox and cannot answer it (HTTP 403, nothing recorded). A model's
``<script>`` shows as text on every page.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import write_agent
from tests.support.console import (
    CHROMIUM,
    CHROMIUM_ARGS,
    ConsoleServer,
    passkey_page,
    register,
)
from tests.support.fake_llm import text
from tests.support.pg import pg_server, pg_url  # noqa: F401  (fixtures)

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "images"

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
    routes: {approve: done, reject: stop}
    on_other: stop
  done: {type: end, output: "published"}
  stop: {type: end, output: "stopped"}
"""

BUSY = """
name: busy
version: "1.0"
model: openai:gpt-4o-mini
start: think
nodes:
  think:
    type: llm
    prompt: "{{initial_prompt}}"
    next: done
  done: {type: end, output: "{{output}}"}
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (tests/support/setup-browser.sh installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def _screenshot(page: Any, name: str) -> None:
    """With ``GRAPHRUN_UPDATE_SCREENSHOTS=1``, write the README's picture of the console."""
    if os.environ.get("GRAPHRUN_UPDATE_SCREENSHOTS"):
        page.set_viewport_size({"width": 1100, "height": 760})
        page.screenshot(path=str(SCREENSHOTS / name))


def _cli(db: str, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, GRAPHRUN_DB=db, **env)
    return subprocess.run(
        [sys.executable, "-m", "graphrun.cli", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=cwd,
        timeout=90,
    )


def _events(db: str, cwd: Path, run_id: str) -> list[str]:
    done = _cli(db, cwd, "events", run_id, "--json")
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.timeout(240)
def test_alice_signs_an_approval_in_the_browser_while_a_worker_drives_runs(
    browser,
    pg_url,  # noqa: F811
    fake_llm,
    tmp_path,
):
    db = pg_url
    llm = {"OPENAI_BASE_URL": fake_llm.url_openai, "OPENAI_API_KEY": "sk-test"}
    fake_llm.default = lambda request: text("thought it over", delay=0.4)
    gate = write_agent(tmp_path / "gate", GATE)
    busy = write_agent(tmp_path / "busy", BUSY)
    worker = subprocess.Popen(
        [sys.executable, "-m", "graphrun.cli", "worker", "-c", "2"],
        env=dict(os.environ, GRAPHRUN_DB=db, **llm),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = ConsoleServer.start(
        db,
        tmp_path,
        "--invite",
        "alice",
        "--invite",
        "bob",
        env={"GRAPHRUN_AGENTS_DIR": str(gate.parent), **llm},
    )
    try:
        alice_ctx, alice, alice_problems = passkey_page(browser)
        register(alice, server.invites["alice"])
        assert alice.locator("article.wait").count() == 0

        # Other runs keep the worker busy; then one run comes to wait for alice.
        for n in range(4):
            assert _cli(db, tmp_path, "submit", str(busy), f"job {n}", **llm).returncode == 0
        # The gated run is started through the API, from alice's page (a write:
        # her session's CSRF token, the console's origin): queued for the worker.
        submitted = alice.evaluate(
            """async (url) => {
                const r = await fetch(url, {method: 'POST',
                    headers: {'Content-Type': 'application/json',
                              'X-CSRF-Token': document.body.dataset.csrf},
                    body: JSON.stringify({agent: 'gate', prompt: '2.0'})});
                return [r.status, await r.json()];
            }""",
            f"{server.url}/api/runs",
        )
        assert submitted[0] == 201 and submitted[1]["status"] == "queued", submitted
        run_id = submitted[1]["run_id"]

        # It appears in her inbox (the page notices; no reload by hand), with the
        # question as it will be recorded and its options.
        card = alice.locator(f"#wait-{run_id}")
        card.wait_for(timeout=60_000)
        assert "Publish release 2.0?" in card.locator("pre.question").text_content()
        assert card.locator("button.choice").all_text_contents()[:2] == ["approve", "reject"]
        _screenshot(alice, "console-inbox.png")

        # bob is no approver: the run is not in his inbox, and he cannot answer it.
        bob_ctx, bob, _ = passkey_page(browser)
        register(bob, server.invites["bob"])
        assert bob.locator(f"#wait-{run_id}").count() == 0
        before = _events(db, tmp_path, run_id)
        for path, body in (
            ("statement", {"node": "review", "visit": 1, "answer": "approve"}),
            ("answer", {"node": "review", "visit": 1, "answer": "approve"}),
        ):
            status = bob.evaluate(
                """async ([url, body]) => (await fetch(url, {method: 'POST',
                    headers: {'Content-Type': 'application/json',
                              'X-CSRF-Token': document.body.dataset.csrf},
                    body: JSON.stringify(body)})).status""",
                [f"{server.url}/api/runs/{run_id}/{path}", body],
            )
            assert status == 403, (path, status)
        assert _events(db, tmp_path, run_id) == before

        # alice opens the run and approves: her passkey signs the statement.
        alice.goto(f"{server.url}/runs/{run_id}")
        assert alice.locator("#run-status").text_content() == "waiting"
        alice.evaluate("window.__same_page = true")
        alice.click("#wait button.choice[data-answer=approve]")
        result = alice.locator("#wait .result")
        result.filter(has_text="Recorded").wait_for(timeout=30_000)
        assert "by alice (verified)" in result.text_content()
        # The worker continues it; the page follows over server-sent events.
        alice.locator("#run-status", has_text="completed").wait_for(timeout=60_000)
        assert alice.evaluate("window.__same_page") is True  # never reloaded
        _screenshot(alice, "console-run.png")
        assert alice_problems == []
        alice_ctx.close()
        bob_ctx.close()

        # The signers file lists her passkey; audit verifies the decision with it.
        exported = _cli(db, tmp_path, "serve", "--export-signers")
        assert exported.returncode == 0, exported.stderr
        lines = exported.stdout.splitlines()
        assert [line.split()[0] for line in lines] == ["alice", "bob"]
        signers = tmp_path / "allowed_signers"
        signers.write_text(lines[0] + "\n")
        audit = _cli(db, tmp_path, "audit", run_id, "--verify", "--signers", str(signers))
        assert audit.returncode == 0, audit.stdout + audit.stderr
        assert "verified" in audit.stdout and "alice" in audit.stdout
        from graphrun.runtime.decisions.webauthn import fingerprint

        key = " ".join(lines[0].split()[2:4])
        said = audit.stdout + audit.stderr
        assert f"'approve' by alice (key {fingerprint(key)})" in said, said
        # An export verifies on its own, with only the signers file.
        export = tmp_path / "run.jsonl"
        assert _cli(db, tmp_path, "export", run_id, "-o", str(export)).returncode == 0
        offline = _cli(
            str(tmp_path / "none.db"), tmp_path, "audit", str(export), "--verify",
            "--signers", str(signers),
        )  # fmt: skip
        assert offline.returncode == 0, offline.stdout + offline.stderr
        assert f"by alice (key {fingerprint(key)})" in offline.stdout + offline.stderr

        # OpenSSH agrees: the recorded signature is an SSHSIG it verifies.
        import json

        received = [
            json.loads(e) for e in _events(db, tmp_path, run_id) if "HumanInputReceived" in e
        ][-1]
        assert received["signature_kind"] == "webauthn" and received["identity"] == "verified"
        sig = tmp_path / "decision.sig"
        sig.write_text(received["signature"])
        ssh = subprocess.run(
            [
                "ssh-keygen",
                "-Y",
                "verify",
                "-f",
                str(signers),
                "-I",
                "alice",
                "-n",
                "graphrun-decision@v1",
                "-s",
                str(sig),
            ],
            input=received["statement"].encode(),
            capture_output=True,
            check=False,
        )
        assert ssh.returncode == 0, ssh.stderr
    finally:
        server.stop()
        worker.terminate()
        worker.wait(timeout=60)


ECHO = """
name: echo
version: "1.0"
model: openai:gpt-4o-mini
start: ask
nodes:
  ask:
    type: llm
    prompt: "{{initial_prompt}}"
    state_updates: {said: "{{output}}"}
    next: check
  check:
    type: approval
    question: "Keep this? {{said}}"
    options: [keep, drop]
    routes: {keep: done, drop: done}
    on_other: done
  done: {type: end, output: "{{said}}"}
"""

HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
#: What a terminal or a page would obey rather than show: an override that reverses
#: the text after it, an erase of the line, a hide.
REORDERING = " \u202edrop\x1b[2K\x1b[8m"


@pytest.mark.timeout(120)
def test_a_models_script_is_text_on_every_page(browser, fake_llm, tmp_path):
    db = str(tmp_path / "events.db")
    fake_llm.script(text(HOSTILE + REORDERING))
    root = write_agent(tmp_path / "echo", ECHO)
    started = _cli(
        db,
        tmp_path,
        "run",
        str(root),
        "<script>window.__pwned = 3</script>",
        OPENAI_BASE_URL=fake_llm.url_openai,
        OPENAI_API_KEY="sk-test",
    )
    assert started.returncode == 3, started.stderr
    run_id = _cli(db, tmp_path, "runs", "--json").stdout.split('"run_id": "')[1].split('"')[0]
    # On the command line too, the question is shown, not obeyed.
    shown = "\\u202edrop\\x1b[2K\\x1b[8m"
    for args, out in (
        ((), started.stderr),
        (("show", run_id), None),
        (("events", run_id), None),
        (("runs",), None),
    ):
        out = out if out is not None else _cli(db, tmp_path, *args).stdout
        assert "\u202e" not in out and "\x1b" not in out, args
    assert shown in started.stderr
    server = ConsoleServer.start(db, tmp_path, "--invite", "alice")
    try:
        context, page, problems = passkey_page(browser)
        register(page, server.invites["alice"])
        for path in ("/inbox", "/runs", f"/runs/{run_id}", f"/runs/{run_id}/report"):
            page.goto(server.url + path)
            page.wait_for_load_state("load")
            assert page.evaluate("window.__pwned") is None, path
            assert page.locator("img[src=x]").count() == 0, path
        page.goto(server.url + "/inbox")
        question = page.locator(f"#wait-{run_id} pre.question").text_content() or ""
        assert f"{HOSTILE} {shown}" in question
        assert "\u202e" not in question
        page.goto(f"{server.url}/runs/{run_id}")
        frame = page.frame_locator("#run-report")
        frame.locator("body").wait_for()
        assert "window.__pwned" in frame.locator("body").text_content()
        assert frame.locator("img[src=x]").count() == 0
        asked = frame.locator("#decisions pre").first.text_content() or ""
        assert shown in asked and "\u202e" not in asked  # the report's decisions too
        time.sleep(0.5)
        assert problems == []
        context.close()
    finally:
        server.stop()


ASK = """
name: ask
version: "1.0"
start: name
nodes:
  name:
    type: input
    question: "Which version ships?"
    validation: "len(input) >= 3"
    state_updates: {version: "{{input}}"}
    next: done
  done: {type: end, output: "shipping {{version}}"}
"""


@pytest.mark.timeout(120)
def test_an_input_answered_in_the_browser_continues_in_the_consoles_process(browser, tmp_path):
    db = str(tmp_path / "events.db")
    root = write_agent(tmp_path / "ask", ASK)
    assert _cli(db, tmp_path, "run", str(root)).returncode == 3
    run_id = _cli(db, tmp_path, "runs", "--json").stdout.split('"run_id": "')[1].split('"')[0]
    server = ConsoleServer.start(db, tmp_path, "--invite", "alice")
    try:
        context, page, problems = passkey_page(browser)
        register(page, server.invites["alice"])
        page.goto(f"{server.url}/runs/{run_id}")
        before = _events(db, tmp_path, run_id)
        page.fill("#wait input[name=text]", "v2")  # fails the node's validation
        page.click("#wait button.choice[data-input]")
        result = page.locator("#wait .result")
        result.filter(has_text="Not recorded").wait_for(timeout=15_000)
        assert "len(input) >= 3" in result.text_content()
        assert _events(db, tmp_path, run_id) == before
        problems.clear()  # the refusal's HTTP 400, expected
        page.fill("#wait input[name=text]", "v2.1")
        page.click("#wait button.choice[data-input]")
        result.filter(has_text="Recorded").wait_for(timeout=15_000)
        page.locator("#run-status", has_text="completed").wait_for(timeout=30_000)
        assert problems == []
        context.close()
        shown = _cli(db, tmp_path, "show", run_id, "--json")
        assert '"output": "shipping v2.1"' in shown.stdout
    finally:
        server.stop()


TWO_OF_THREE = """
name: two
version: "1.0"
start: publish
nodes:
  publish:
    type: approval
    question: "Publish?"
    options: [approve, reject]
    approvals: {required: 2, of: [alice, bob, carol]}
    routes: {approve: done, reject: done}
    on_other: done
  done: {type: end, output: "decided"}
"""


@pytest.mark.timeout(150)
def test_two_passkeys_sign_a_two_of_three_approval(browser, tmp_path):
    db = str(tmp_path / "events.db")
    root = write_agent(tmp_path / "two", TWO_OF_THREE)
    assert _cli(db, tmp_path, "run", str(root)).returncode == 3
    run_id = _cli(db, tmp_path, "runs", "--json").stdout.split('"run_id": "')[1].split('"')[0]
    server = ConsoleServer.start(db, tmp_path, "--invite", "alice", "--invite", "carol")
    try:
        people = {}
        for person in ("alice", "carol"):
            context, page, problems = passkey_page(browser)
            register(page, server.invites[person])
            people[person] = (context, page, problems)

        def approve(person: str) -> str:
            _context, page, _problems = people[person]
            page.goto(f"{server.url}/inbox")
            card = page.locator(f"#wait-{run_id}")
            card.locator("button.choice[data-answer=approve]").click()
            result = card.locator(".result")
            result.filter(has_text="ecorded").wait_for(timeout=15_000)
            return str(result.text_content())

        # Signed answers are required here and checked against the graph's
        # allowed_signers, which does not list her passkey yet: refused, nothing kept.
        before = _events(db, tmp_path, run_id)
        refused = approve("alice")
        assert "Not recorded" in refused and "does not list alice's passkey" in refused
        assert _events(db, tmp_path, run_id) == before
        people["alice"][2].clear()  # the refusal's HTTP 403, expected

        (root / "allowed_signers").write_text(
            _cli(db, tmp_path, "serve", "--export-signers").stdout
        )
        assert "waiting for more signatures" in approve("alice")
        people["alice"][1].goto(f"{server.url}/inbox")  # signed: it left her inbox
        assert people["alice"][1].locator(f"#wait-{run_id}").count() == 0
        assert "the run is continuing" in approve("carol")
        deadline = time.monotonic() + 30
        while "completed" not in _cli(db, tmp_path, "runs").stdout:
            assert time.monotonic() < deadline, "".join(server.stderr)
            time.sleep(0.3)
        for context, _page, problems in people.values():
            assert problems == []
            context.close()
        audit = _cli(db, tmp_path, "audit", run_id, "--verify")
        assert audit.returncode == 0, audit.stdout + audit.stderr
        said = audit.stdout + audit.stderr
        assert "by alice (co-signature) (key SHA256:" in said, said
        assert "by carol (key SHA256:" in said, said
    finally:
        server.stop()
