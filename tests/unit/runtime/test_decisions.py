"""The decision statement API and the built-in ``sshsig`` kind, with real OpenSSH keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphrun.runtime.decisions import (
    DOMAIN,
    DecisionStatement,
    SignatureInvalid,
    StatementError,
    Trust,
    build_statement,
    parse_statement,
    register_kind,
    signature_kind,
    statement_hash,
    verify_signature,
)
from graphrun.runtime.decisions.sshsig import sign
from tests.support.ssh import make_key, write_signers


def _statement(**over: object) -> DecisionStatement:
    fields: dict[str, object] = {
        "run_id": "R1",
        "node_id": "publish",
        "visit": 1,
        "kind": "approval",
        "question": "Publish?",
        "options": ["approve", "reject"],
        "answer": "approve",
        "asked_seq": 7,
        "asked_head": "sha256:" + "ab" * 32,
        "shown": "sha256:" + "cd" * 32,
        "principal": "alice",
        "signed_at": "2026-11-27T05:00:00Z",
    }
    fields.update(over)
    return DecisionStatement(**fields)  # type: ignore[arg-type]


def test_statement_bytes_are_canonical_and_round_trip() -> None:
    data = build_statement(_statement())
    assert data.startswith(b'{"answer":"approve","asked_head":')
    assert f'"domain":"{DOMAIN}"'.encode() in data
    assert parse_statement(data) == _statement()
    assert statement_hash(data) == statement_hash(data.decode())


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"not json", "is not a decision statement"),
        (b'{"answer":"x"}', "is not a decision statement"),
        (build_statement(_statement()).replace(b"{", b"{ ", 1), "not in canonical form"),
        (build_statement(_statement(domain="other@v1")), "domain is 'other@v1'"),
    ],
)
def test_parse_refuses_non_canonical(data: bytes, why: str) -> None:
    with pytest.raises(StatementError, match=why):
        parse_statement(data)


@pytest.mark.parametrize("kind", ["ed25519", "ecdsa", "rsa"])
def test_sshsig_signs_and_verifies_with_openssh(tmp_path: Path, kind: str) -> None:
    alice = make_key(tmp_path, "alice", kind)
    bob = make_key(tmp_path, "bob", "ed25519")
    trust = Trust(signers=write_signers(tmp_path / "allowed_signers", alice, bob))
    data = build_statement(_statement())
    sig = sign(data, alice.path)
    assert sig.startswith("-----BEGIN SSH SIGNATURE-----")
    fingerprint = verify_signature(data, sig, "sshsig", "alice", trust)
    assert fingerprint.startswith("SHA256:")
    with pytest.raises(SignatureInvalid, match="does not verify for 'bob'"):
        verify_signature(data, sig, "sshsig", "bob", trust)
    edited = build_statement(_statement(answer="reject"))
    with pytest.raises(SignatureInvalid, match="does not verify for 'alice'"):
        verify_signature(edited, sig, "sshsig", "alice", trust)
    with pytest.raises(SignatureInvalid, match="no allowed_signers file"):
        verify_signature(data, sig, "sshsig", "alice", Trust())


def test_other_kinds_register_beside_sshsig() -> None:
    class Echo:
        name = "echo-test"

        def verify(self, statement: bytes, signature: str, principal: str, trust: Trust) -> str:
            if signature != statement_hash(statement):
                raise SignatureInvalid("echo mismatch")
            return f"echo:{principal}"

    register_kind(Echo())
    data = build_statement(_statement())
    assert verify_signature(data, statement_hash(data), "echo-test", "alice", Trust()) == (
        "echo:alice"
    )
    assert signature_kind("sshsig").name == "sshsig"
    with pytest.raises(SignatureInvalid, match="unknown signature kind 'nope'"):
        signature_kind("nope")


def test_make_trust_gathers_what_each_kind_loads(tmp_path: Path) -> None:
    from graphrun.runtime.decisions import make_trust

    class Keyring:
        name = "keyring-test"

        def load_trust(self, signers: Path | None) -> str:
            return f"loaded beside {signers}"

        def verify(self, statement: bytes, signature: str, principal: str, trust: Trust) -> str:
            return str(trust.extra[self.name])

    register_kind(Keyring())
    trust = make_trust(tmp_path / "allowed_signers")
    assert trust.extra["keyring-test"] == f"loaded beside {tmp_path / 'allowed_signers'}"
    assert trust.signers == tmp_path / "allowed_signers"
