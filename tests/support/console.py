"""A real ``graphrun serve`` process and Chromium pages with a virtual passkey.

:class:`ConsoleServer` starts the console as a subprocess on a free port (its
invitation links and URL read from what it prints); :func:`passkey_page` opens a
browser context with Chromium's WebAuthn testing API (a virtual CTAP2 authenticator
with resident keys and user verification), so ``navigator.credentials`` works
headless; :func:`register` follows an invitation link and makes a passkey.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@dataclass
class ConsoleServer:
    """``graphrun serve`` in a subprocess."""

    proc: subprocess.Popen[str]
    url: str
    invites: dict[str, str]
    stderr: list[str] = field(default_factory=list)

    @classmethod
    def start(
        cls, db: str, cwd: Path, *args: str, env: dict[str, str] | None = None
    ) -> ConsoleServer:
        full = dict(os.environ)
        full["GRAPHRUN_DB"] = db
        full.update(env or {})
        proc = subprocess.Popen(
            [sys.executable, "-m", "graphrun.cli", "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=full,
            cwd=cwd,
        )
        invites: dict[str, str] = {}
        url = ""
        deadline = time.monotonic() + 30
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                err = proc.stderr.read() if proc.stderr else ""
                proc.wait()
                for stream in (proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()
                raise RuntimeError(f"graphrun serve exited: {err}")
            found = re.match(r"invitation for (\S+): (\S+)", line)
            if found:
                invites[found.group(1)] = found.group(2)
            found = re.match(r"graphrun console: (\S+)/ ", line)
            if found:
                url = found.group(1)
                break
        server = cls(proc, url, invites)
        threading.Thread(target=server._drain, daemon=True).start()
        return server

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        try:
            for line in self.proc.stderr:
                self.stderr.append(line)
        except ValueError:  # closed by stop()
            pass

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def passkey_page(browser: Any) -> tuple[Any, Any, list[str]]:
    """(context, page, problems): a fresh context whose page has a virtual passkey
    authenticator; ``problems`` collects console errors, page errors and dialogs."""
    context = browser.new_context()
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"pageerror: {exc}"))
    page.on(
        "console",
        lambda msg: problems.append(f"console: {msg.text}") if msg.type == "error" else None,
    )
    page.on(
        "response",
        lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None,
    )
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    cdp = context.new_cdp_session(page)
    cdp.send("WebAuthn.enable")
    cdp.send(
        "WebAuthn.addVirtualAuthenticator",
        {
            "options": {
                "protocol": "ctap2",
                "transport": "internal",
                "hasResidentKey": True,
                "hasUserVerification": True,
                "isUserVerified": True,
                "automaticPresenceSimulation": True,
            }
        },
    )
    page.cdp = cdp  # keep the session (and its authenticator) alive with the page
    return context, page, problems


def register(page: Any, invite: str) -> None:
    """Follow an invitation link and create the passkey; ends on the inbox."""
    page.goto(invite)
    page.click("#register")
    page.wait_for_url(re.compile(r".*/inbox$"), timeout=15_000)
