"""Real OpenSSH keys, allowed_signers files and a real ssh-agent for signing tests."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Key:
    """A key pair made by ssh-keygen: ``path`` (private) and ``pub`` (public)."""

    principal: str
    path: Path
    kind: str

    @property
    def pub(self) -> Path:
        return self.path.with_name(self.path.name + ".pub")

    def signers_line(self) -> str:
        keytype, blob = self.pub.read_text().split()[:2]
        return f"{self.principal} {keytype} {blob}"


def make_key(folder: Path, principal: str, kind: str = "ed25519") -> Key:
    """A fresh passphrase-less key of ``kind`` (ed25519, ecdsa, rsa)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{principal}_{kind}"
    extra = ["-b", "2048"] if kind == "rsa" else []
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, *extra, "-N", "", "-C", principal, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return Key(principal, path, kind)


def write_signers(path: Path, *keys: Key) -> Path:
    path.write_text("".join(k.signers_line() + "\n" for k in keys), encoding="utf-8")
    return path


@dataclass
class Agent:
    """A running ssh-agent: ``sock`` for SSH_AUTH_SOCK."""

    sock: str
    pid: int

    def add(self, key: Key) -> None:
        subprocess.run(
            ["ssh-add", "-q", str(key.path)],
            check=True,
            capture_output=True,
            env={**os.environ, "SSH_AUTH_SOCK": self.sock},
        )


@pytest.fixture
def ssh_agent(tmp_path: Path) -> Iterator[Agent]:
    """A real ssh-agent on a socket in tmp_path, killed after the test."""
    sock = str(tmp_path / "agent.sock")
    proc = subprocess.run(
        ["ssh-agent", "-s", "-a", sock], check=True, capture_output=True, text=True
    )
    pid = int(proc.stdout.split("SSH_AGENT_PID=")[1].split(";")[0])
    try:
        yield Agent(sock, pid)
    finally:
        os.kill(pid, signal.SIGTERM)
