"""The ``"sshsig"`` signature kind: OpenSSH's SSHSIG, made and checked by ``ssh-keygen``.

OpenSSH itself signs and verifies (``ssh-keygen -Y sign`` / ``-Y verify``): it
reads every key type people have (ed25519, ecdsa, rsa, the ``sk-`` hardware keys),
signs through ``ssh-agent`` when given a public key, and checks an
``allowed_signers`` file exactly as git does (principals, ``namespaces=``,
``valid-after``/``valid-before``). Verification runs ``ssh-keygen`` with no agent
socket in its environment and touches no network. The namespace is
:data:`~graphrun.runtime.decisions.signing.DOMAIN`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from graphrun.runtime.decisions.signing import DOMAIN, SignatureInvalid, Trust

__all__ = [
    "SSHSIG",
    "SigningError",
    "SshSig",
    "find_signers",
    "principals_of",
    "public_key",
    "sign",
]

#: The name of the allowed-signers file looked for next to a graph and in the config dir.
SIGNERS_FILE = "allowed_signers"
_GOOD = re.compile(r'^Good "[^"]*" signature for (.+) with (\S+) key (\S+)\s*$', re.MULTILINE)


class SigningError(SignatureInvalid):
    """A statement could not be signed (no key, wrong passphrase, no agent, …)."""


def _ssh_keygen() -> str:
    found = shutil.which("ssh-keygen")
    if found is None:
        raise SignatureInvalid(
            "ssh-keygen (OpenSSH) is not installed: SSH signatures cannot be made or checked",
            hint="install OpenSSH's client tools",
        )
    return found


def sign(statement: bytes, key: str | Path) -> str:
    """Sign ``statement`` with ``key``: a private key file, or a public key file
    whose private half is in the agent (``SSH_AUTH_SOCK``). Returns the armored
    ``-----BEGIN SSH SIGNATURE-----`` text.

    Raises:
        SigningError: ssh-keygen refused (its last line says why).
    """
    path = Path(key).expanduser()
    if not path.is_file():
        raise SigningError(f"--sign {key}: no such key file")
    done = subprocess.run(
        [_ssh_keygen(), "-q", "-Y", "sign", "-n", DOMAIN, "-f", str(path)],
        input=statement,
        capture_output=True,
        check=False,
        timeout=120,  # a hardware key waits for a touch
    )
    text = done.stdout.decode("ascii", "replace")
    if done.returncode != 0 or "BEGIN SSH SIGNATURE" not in text:
        why = _last_line(done.stderr) or f"ssh-keygen exited with {done.returncode}"
        raise SigningError(f"--sign {key}: could not sign: {why}")
    return text


def _last_line(data: bytes) -> str:
    lines = [
        line.strip()
        for line in data.decode("utf-8", "replace").splitlines()
        if line.strip() and not line.startswith("Signing data")
    ]
    return lines[-1] if lines else ""


class SshSig:
    """OpenSSH's SSHSIG over the statement bytes, checked against ``allowed_signers``."""

    name = "sshsig"

    def verify(self, statement: bytes, signature: str, principal: str, trust: Trust) -> str:
        """The ``SHA256:`` fingerprint of the key that signed ``statement`` as ``principal``.

        Raises:
            SignatureInvalid: No signers file, a malformed signature, a key not
                allowed for ``principal`` (or this namespace), or bytes that differ.
        """
        if trust.signers is None:
            raise SignatureInvalid("no allowed_signers file to check SSH signatures against")
        if not Path(trust.signers).is_file():
            raise SignatureInvalid(f"allowed_signers file {trust.signers} does not exist")
        if "\n" in principal or not principal:
            raise SignatureInvalid(f"principal {principal!r} cannot be checked")
        if "BEGIN SSH SIGNATURE" not in signature:
            raise SignatureInvalid("the signature is not an armored SSH signature")
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        with tempfile.TemporaryDirectory(prefix="graphrun-sig-") as tmp:
            sig = Path(tmp, "statement.sig")
            sig.write_text(signature, encoding="ascii", errors="replace")
            done = subprocess.run(
                [
                    _ssh_keygen(),
                    "-Y",
                    "verify",
                    "-f",
                    str(trust.signers),
                    "-I",
                    principal,
                    "-n",
                    DOMAIN,
                    "-s",
                    str(sig),
                ],
                input=statement,
                capture_output=True,
                check=False,
                env=env,
                timeout=60,
            )
        found = _GOOD.search(done.stdout.decode("utf-8", "replace"))
        if done.returncode != 0 or found is None or found.group(1) != principal:
            why = _last_line(done.stderr) or _last_line(done.stdout) or "ssh-keygen refused it"
            raise SignatureInvalid(f"the SSH signature does not verify for {principal!r}: {why}")
        return found.group(3)


SSHSIG = SshSig()


def find_signers(
    given: str | Path | None, *, graph_dir: str | Path | None, config_dir: str | Path | None
) -> Path | None:
    """The allowed_signers file: ``given`` (``--signers``), else ``allowed_signers``
    next to the graph, else in the config directory, else None.

    Raises:
        SignatureInvalid: ``given`` names no file.
    """
    if given is not None:
        path = Path(given).expanduser()
        if not path.is_file():
            raise SignatureInvalid(f"--signers {given}: no such file")
        return path
    for folder in (graph_dir, config_dir):
        if folder:
            candidate = Path(folder, SIGNERS_FILE)
            if candidate.is_file():
                return candidate
    return None


def public_key(key: str | Path) -> tuple[str, str]:
    """``(type, base64 blob)`` of ``key``: a public key file, the ``.pub`` beside a
    private key, or what ``ssh-keygen -y`` derives from the private key.

    Raises:
        SigningError: None of these can be read.
    """
    path = Path(key).expanduser()
    candidates = [path, path.with_name(path.name + ".pub")]
    for candidate in candidates:
        try:
            words = candidate.read_text(encoding="utf-8", errors="replace").split()
        except OSError:
            continue
        if len(words) >= 2 and (words[0].startswith(("ssh-", "ecdsa-", "sk-"))):
            return words[0], words[1]
    done = subprocess.run(
        [_ssh_keygen(), "-y", "-P", "", "-f", str(path)],
        capture_output=True,
        check=False,
        stdin=subprocess.DEVNULL,
        timeout=30,
    )
    words = done.stdout.decode("ascii", "replace").split()
    if done.returncode != 0 or len(words) < 2:
        raise SigningError(
            f"--sign {key}: cannot read its public key",
            hint=f"put {path.name}.pub beside it, or pass the public key file (with ssh-agent)",
        )
    return words[0], words[1]


def principals_of(key: str | Path, signers: Path) -> list[str]:
    """The principals ``signers`` lists for ``key`` (exact names, in file order)."""
    import shlex

    keytype, blob = public_key(key)
    found: list[str] = []
    for line in signers.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            words = shlex.split(line, posix=True)
        except ValueError:
            continue
        for i in range(1, len(words) - 1):
            if words[i] == keytype and words[i + 1] == blob:
                found += [p for p in words[0].split(",") if p and p not in found]
                break
    return found
