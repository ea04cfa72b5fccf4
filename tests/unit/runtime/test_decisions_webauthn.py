"""The "webauthn" signature kind: a passkey's assertion over a decision statement.

An authenticator is played by a real P-256 key (``cryptography``) producing the
exact bytes a WebAuthn authenticator and browser produce (authenticator data,
client data JSON, a DER ECDSA signature over authData ‖ SHA-256(clientData)).
The signature is checked by graphrun's kind and by OpenSSH's own
``ssh-keygen -Y verify`` against an ``allowed_signers`` line.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from graphrun.runtime.decisions import (
    DOMAIN,
    DecisionStatement,
    SignatureInvalid,
    Trust,
    build_statement,
    verify_signature,
)
from graphrun.runtime.decisions.webauthn import (
    SK_KEY_TYPE,
    Assertion,
    b64url,
    challenge_for,
    fingerprint,
    principal_keys,
    ssh_string,
    sshsig_armored,
)

RP = "localhost"
ORIGIN = "http://localhost:8765"


def _statement(answer: str = "approve", run_id: str = "01run") -> bytes:
    return build_statement(
        DecisionStatement(
            run_id=run_id,
            node_id="publish",
            visit=1,
            kind="approval",
            question="Publish?",
            options=["approve", "reject"],
            answer=answer,
            asked_seq=3,
            asked_head="sha256:" + "ab" * 32,
            shown="sha256:" + "cd" * 32,
            principal="alice",
            signed_at="2026-11-27T05:00:00.000000Z",
        )
    )


class Authenticator:
    """A passkey: a P-256 key bound to a relying party, signing as WebAuthn does."""

    def __init__(self, rp_id: str = RP) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.rp_id = rp_id
        self.counter = 0

    def public_line(self) -> str:
        point = self.key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        blob = (
            ssh_string(SK_KEY_TYPE.encode())
            + ssh_string(b"nistp256")
            + ssh_string(point)
            + ssh_string(self.rp_id.encode())
        )
        import base64

        return f"{SK_KEY_TYPE} {base64.b64encode(blob).decode()}"

    def sign(self, statement: bytes, *, flags: int = 0x05, rp_id: str | None = None) -> str:
        self.counter += 1
        client = json.dumps(
            {
                "type": "webauthn.get",
                "challenge": b64url(challenge_for(statement, DOMAIN)),
                "origin": ORIGIN,
                "crossOrigin": False,
            },
            separators=(",", ":"),
        ).encode()
        auth = (
            hashlib.sha256((rp_id or self.rp_id).encode()).digest()
            + bytes([flags])
            + self.counter.to_bytes(4, "big")
        )
        der = self.key.sign(auth + hashlib.sha256(client).digest(), ec.ECDSA(hashes.SHA256()))
        return sshsig_armored(Assertion("cred", auth, client, der), self.public_line(), DOMAIN)


@pytest.fixture
def alice(tmp_path: Path) -> tuple[Authenticator, Path]:
    passkey = Authenticator()
    signers = tmp_path / "allowed_signers"
    signers.write_text(f'alice namespaces="{DOMAIN}" {passkey.public_line()}\n')
    return passkey, signers


def test_a_passkey_signature_verifies_from_the_signers_file(alice):
    passkey, signers = alice
    statement = _statement()
    signature = passkey.sign(statement)
    key = verify_signature(statement, signature, "webauthn", "alice", Trust(signers=signers))
    assert key == fingerprint(passkey.public_line())
    assert principal_keys(signers, "alice") == [passkey.public_line()]


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="OpenSSH is not installed")
def test_openssh_itself_verifies_the_passkey_signature(alice, tmp_path):
    passkey, signers = alice
    statement = _statement()
    sig = tmp_path / "decision.sig"
    sig.write_text(passkey.sign(statement))
    done = subprocess.run(
        [
            "ssh-keygen",
            "-Y",
            "verify",
            "-f",
            str(signers),
            "-I",
            "alice",
            "-n",
            DOMAIN,
            "-s",
            str(sig),
        ],
        input=statement,
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f'Good "{DOMAIN}" signature for alice with ECDSA-SK key' in done.stdout.decode()
    # ...and refuses the same signature over other bytes.
    other = subprocess.run(
        [
            "ssh-keygen",
            "-Y",
            "verify",
            "-f",
            str(signers),
            "-I",
            "alice",
            "-n",
            DOMAIN,
            "-s",
            str(sig),
        ],
        input=_statement("reject"),
        capture_output=True,
        check=False,
    )
    assert other.returncode != 0


def test_every_broken_passkey_signature_is_named(alice, tmp_path):
    passkey, signers = alice
    trust = Trust(signers=signers)
    statement = _statement()

    def refused(signature: str, data: bytes = statement, principal: str = "alice") -> str:
        with pytest.raises(SignatureInvalid) as caught:
            verify_signature(data, signature, "webauthn", principal, trust)
        return str(caught.value)

    signed = passkey.sign(statement)
    assert "signed another statement" in refused(signed, _statement("reject"))
    assert "signed another statement" in refused(signed, _statement(run_id="01other"))
    assert "no passkey of 'bob' is listed" in refused(signed, principal="bob")
    assert "is not 'alice''s" in refused(Authenticator().sign(statement))
    # Signed for another site: the signed bytes hold that site's hash, the key this one's.
    assert "does not verify" in refused(passkey.sign(statement, rp_id="evil.example"))
    assert "user-presence" in refused(passkey.sign(statement, flags=0x04))
    assert "not an SSHSIG" in refused(
        "-----BEGIN SSH SIGNATURE-----\nAAAA\n-----END SSH SIGNATURE-----\n"
    )
    # A key outside this namespace is not alice's for decisions.
    signers.write_text(f'alice namespaces="git" {passkey.public_line()}\n')
    assert "no passkey of 'alice' is listed" in refused(signed)


def test_the_console_registry_of_passkeys_is_trusted_too():
    passkey = Authenticator()
    statement = _statement()
    trust = Trust(extra={"webauthn": {"alice": [passkey.public_line()]}})
    assert verify_signature(statement, passkey.sign(statement), "webauthn", "alice", trust)
