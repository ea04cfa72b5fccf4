"""The ``"webauthn"`` signature kind: a decision signed by a person's passkey.

A decision is signed by asking the passkey for an assertion whose challenge is
OpenSSH's SSHSIG "signed data" for the statement (``SSHSIG``, the namespace, the
hash algorithm and SHA-512 of the statement bytes). The assertion is then, byte for
byte, what OpenSSH calls a ``webauthn-sk-ecdsa-sha2-nistp256@openssh.com``
signature, and the passkey's public key is an ``sk-ecdsa-sha2-nistp256@openssh.com``
key whose application is the console's relying-party id: the same
``allowed_signers`` file that holds people's SSH keys holds their passkeys, and
``ssh-keygen -Y verify`` can check a passkey decision as well as graphrun does
(the stored signature is that armored SSHSIG). The console registers passkeys as
ES256 (ECDSA P-256) keys for that reason: it is the one passkey algorithm
OpenSSH's signature format carries.

:func:`verify_assertion` checks an assertion with ``cryptography`` alone: no
network, no browser, no ``webauthn`` library state; what it checks is named in
its docstring.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphrun.runtime.decisions.signing import DOMAIN, SignatureInvalid, Trust

SK_KEY_TYPE = "sk-ecdsa-sha2-nistp256@openssh.com"
WEBAUTHN_SIG_TYPE = "webauthn-sk-ecdsa-sha2-nistp256@openssh.com"
_FLAG_UP = 0x01


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def ssh_string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _mpint(value: int) -> bytes:
    raw = value.to_bytes((value.bit_length() + 8) // 8, "big") if value else b""
    return ssh_string(raw)


def sshsig_signed_data(statement: bytes, namespace: str) -> bytes:
    """What an SSHSIG signature signs for ``statement`` (OpenSSH PROTOCOL.sshsig)."""
    return (
        b"SSHSIG"
        + ssh_string(namespace.encode("utf-8"))
        + ssh_string(b"")
        + ssh_string(b"sha512")
        + ssh_string(hashlib.sha512(statement).digest())
    )


def challenge_for(statement: bytes, namespace: str) -> bytes:
    """The WebAuthn challenge that binds an assertion to ``statement``."""
    return sshsig_signed_data(statement, namespace)


def parse_ssh_public_key(line: str) -> tuple[bytes, str]:
    """(P-256 point, application) of an ``sk-ecdsa-sha2-nistp256@openssh.com`` key."""
    fields = line.split()
    if len(fields) < 2 or fields[0] != SK_KEY_TYPE:
        raise ValueError(f"not an {SK_KEY_TYPE} key")
    blob = base64.b64decode(fields[1])
    parts: list[bytes] = []
    at = 0
    while at < len(blob):
        (size,) = struct.unpack(">I", blob[at : at + 4])
        parts.append(blob[at + 4 : at + 4 + size])
        at += 4 + size
    if len(parts) != 4 or parts[0] != SK_KEY_TYPE.encode() or parts[1] != b"nistp256":
        raise ValueError(f"malformed {SK_KEY_TYPE} key")
    return parts[2], parts[3].decode("utf-8")


# -- decision assertions ---------------------------------------------------------------


@dataclass(frozen=True)
class Assertion:
    """What a passkey returned for a decision: the parts its signature covers."""

    credential_id: str
    authenticator_data: bytes
    client_data_json: bytes
    signature: bytes  # DER-encoded ECDSA, as WebAuthn gives it

    def as_dict(self) -> dict[str, str]:
        return {
            "credential_id": self.credential_id,
            "authenticator_data": b64url(self.authenticator_data),
            "client_data_json": b64url(self.client_data_json),
            "signature": b64url(self.signature),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Assertion:
        try:
            return cls(
                credential_id=str(data["credential_id"]),
                authenticator_data=unb64url(str(data["authenticator_data"])),
                client_data_json=unb64url(str(data["client_data_json"])),
                signature=unb64url(str(data["signature"])),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"malformed passkey assertion ({exc})") from None

    @classmethod
    def from_browser(cls, credential: dict[str, Any]) -> Assertion:
        """From the JSON the console's page posts (PublicKeyCredential, base64url)."""
        try:
            response = credential["response"]
            return cls(
                credential_id=str(credential["id"]),
                authenticator_data=unb64url(str(response["authenticatorData"])),
                client_data_json=unb64url(str(response["clientDataJSON"])),
                signature=unb64url(str(response["signature"])),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"malformed passkey assertion ({exc})") from None

    def origin(self) -> str:
        try:
            return str(json.loads(self.client_data_json).get("origin", ""))
        except ValueError:
            return ""


def verify_assertion(
    assertion: Assertion, statement: bytes, public_key: str, namespace: str
) -> str | None:
    """``None`` when ``assertion`` is a valid passkey signature of ``statement`` by
    ``public_key`` (an ``sk-ecdsa-sha2-nistp256@openssh.com`` key); else which check
    failed.

    Checks, in order: the client data says ``webauthn.get`` and its challenge is
    :func:`challenge_for` the statement bytes; the authenticator data is for the
    key's application (relying-party id hash) with the user-present flag; the ECDSA
    P-256 signature over authenticator data ‖ SHA-256(client data) verifies.
    """
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        point, application = parse_ssh_public_key(public_key)
    except ValueError as exc:
        return str(exc)
    try:
        client = json.loads(assertion.client_data_json)
    except ValueError:
        return "the client data is not JSON"
    if not isinstance(client, dict) or client.get("type") != "webauthn.get":
        return "the client data is not a WebAuthn assertion"
    if client.get("challenge") != b64url(challenge_for(statement, namespace)):
        return "the passkey signed another statement"
    data = assertion.authenticator_data
    if len(data) < 37:
        return "the authenticator data is truncated"
    if data[:32] != hashlib.sha256(application.encode("utf-8")).digest():
        return f"the passkey signed for another site than {application}"
    if not data[32] & _FLAG_UP:
        return "the authenticator did not see the person (user-presence flag unset)"
    try:
        key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)
        signed = data + hashlib.sha256(assertion.client_data_json).digest()
        key.verify(assertion.signature, signed, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return "the passkey signature does not verify"
    except ValueError as exc:
        return f"the passkey key or signature is malformed ({exc})"
    return None


def sshsig_armored(assertion: Assertion, public_key: str, namespace: str) -> str:
    """The assertion as an armored SSHSIG (``-----BEGIN SSH SIGNATURE-----``) that
    ``ssh-keygen -Y verify -n NAMESPACE`` checks against the statement bytes."""
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    r, s = decode_dss_signature(assertion.signature)
    data = assertion.authenticator_data
    flags, counter, extensions = data[32], data[33:37], data[37:]
    key_blob = base64.b64decode(public_key.split()[1])
    sig = (
        ssh_string(WEBAUTHN_SIG_TYPE.encode())
        + ssh_string(_mpint(r) + _mpint(s))
        + bytes([flags])
        + counter
        + ssh_string(assertion.origin().encode("utf-8"))
        + ssh_string(assertion.client_data_json)
        + ssh_string(extensions)
    )
    blob = (
        b"SSHSIG"
        + struct.pack(">I", 1)
        + ssh_string(key_blob)
        + ssh_string(namespace.encode("utf-8"))
        + ssh_string(b"")
        + ssh_string(b"sha512")
        + ssh_string(sig)
    )
    text = base64.b64encode(blob).decode("ascii")
    lines = [text[i : i + 70] for i in range(0, len(text), 70)]
    return "-----BEGIN SSH SIGNATURE-----\n" + "\n".join(lines) + "\n-----END SSH SIGNATURE-----\n"


# -- the signature kind --------------------------------------------------------------


def fingerprint(public_key: str) -> str:
    """OpenSSH's ``SHA256:…`` fingerprint of a public key line."""
    blob = base64.b64decode(public_key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _principal_matches(patterns: str, principal: str) -> bool:
    import fnmatch

    for pattern in patterns.split(","):
        negated = pattern.startswith("!")
        if fnmatch.fnmatchcase(principal, pattern.lstrip("!")):
            return not negated
    return False


def principal_keys(signers: Path, principal: str) -> list[str]:
    """The principal's passkey keys in an ``allowed_signers`` file (lines for this
    namespace; OpenSSH's format: principals, options, key type, key)."""
    import shlex

    keys: list[str] = []
    for raw in signers.read_text(encoding="utf-8", errors="replace").splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or SK_KEY_TYPE not in line:
            continue
        try:
            fields = shlex.split(line)
        except ValueError:
            continue
        if len(fields) < 3 or not _principal_matches(fields[0], principal):
            continue
        at = fields.index(SK_KEY_TYPE) if SK_KEY_TYPE in fields else -1
        if at < 1 or at + 1 >= len(fields):
            continue
        options = ",".join(fields[1:at])
        namespaces = [o for o in options.split(",") if o.startswith("namespaces=")]
        if namespaces and DOMAIN not in namespaces[0].removeprefix("namespaces=").split(","):
            continue
        keys.append(f"{SK_KEY_TYPE} {fields[at + 1]}")
    return keys


def _read_sshsig(armored: str) -> tuple[str, Assertion]:
    """(public key line, assertion) from an armored webauthn SSHSIG."""
    text = "".join(
        line.strip() for line in armored.strip().splitlines() if not line.startswith("-----")
    )
    try:
        blob = base64.b64decode(text, validate=True)
    except ValueError:
        raise SignatureInvalid("the passkey signature is not base64") from None

    def take(data: bytes, at: int) -> tuple[bytes, int]:
        if at + 4 > len(data):
            raise SignatureInvalid("the passkey signature is truncated")
        (size,) = struct.unpack(">I", data[at : at + 4])
        if at + 4 + size > len(data):
            raise SignatureInvalid("the passkey signature is truncated")
        return data[at + 4 : at + 4 + size], at + 4 + size

    if blob[:6] != b"SSHSIG" or blob[6:10] != struct.pack(">I", 1):
        raise SignatureInvalid("the passkey signature is not an SSHSIG")
    key_blob, at = take(blob, 10)
    namespace, at = take(blob, at)
    _reserved, at = take(blob, at)
    hash_alg, at = take(blob, at)
    sig, at = take(blob, at)
    if namespace.decode("utf-8", "replace") != DOMAIN or hash_alg != b"sha512":
        raise SignatureInvalid(f"the passkey signature is not for namespace {DOMAIN}")
    sig_type, s_at = take(sig, 0)
    if sig_type != WEBAUTHN_SIG_TYPE.encode():
        raise SignatureInvalid("the signature is not a passkey (webauthn) signature")
    ecdsa, s_at = take(sig, s_at)
    if s_at + 5 > len(sig):
        raise SignatureInvalid("the passkey signature is truncated")
    flags, counter = sig[s_at], sig[s_at + 1 : s_at + 5]
    _origin, s_at = take(sig, s_at + 5)
    client_data, s_at = take(sig, s_at)
    extensions, s_at = take(sig, s_at)
    r_bytes, e_at = take(ecdsa, 0)
    s_bytes, _ = take(ecdsa, e_at)
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    der = encode_dss_signature(int.from_bytes(r_bytes, "big"), int.from_bytes(s_bytes, "big"))
    key_type, _ = take(key_blob, 0)
    app_at = 0
    parts = []
    while app_at < len(key_blob):
        part, app_at = take(key_blob, app_at)
        parts.append(part)
    if key_type != SK_KEY_TYPE.encode() or len(parts) != 4:
        raise SignatureInvalid("the passkey signature's key is not a passkey key")
    auth_data = hashlib.sha256(parts[3]).digest() + bytes([flags]) + counter + extensions
    key_line = f"{SK_KEY_TYPE} {base64.b64encode(key_blob).decode('ascii')}"
    return key_line, Assertion("", auth_data, client_data, der)


class WebAuthnKind:
    """A passkey's assertion over the statement, as an OpenSSH webauthn SSHSIG."""

    name = "webauthn"

    def verify(self, statement: bytes, signature: str, principal: str, trust: Trust) -> str:
        """The fingerprint of the passkey that signed ``statement`` as ``principal``.

        Raises:
            SignatureInvalid: No key of ``principal`` is known, the signature is by
                another key, or a check of :func:`verify_assertion` fails.
        """
        key_line, assertion = _read_sshsig(signature)
        allowed = list(_known_keys(principal, trust))
        if not allowed:
            where = f" in {trust.signers}" if trust.signers else ""
            raise SignatureInvalid(f"no passkey of {principal!r} is listed{where}")
        if key_line.split()[1] not in {k.split()[1] for k in allowed}:
            raise SignatureInvalid(
                f"the passkey that signed ({fingerprint(key_line)}) is not {principal!r}'s"
            )
        problem = verify_assertion(assertion, statement, key_line, DOMAIN)
        if problem is not None:
            raise SignatureInvalid(f"the passkey signature of {principal!r} is broken: {problem}")
        return fingerprint(key_line)


def _known_keys(principal: str, trust: Trust) -> Iterable[str]:
    extra = trust.extra.get("webauthn") or {}
    yield from extra.get(principal, [])
    if trust.signers is not None and Path(trust.signers).is_file():
        yield from principal_keys(Path(trust.signers), principal)


WEBAUTHN = WebAuthnKind()


__all__ = [
    "WEBAUTHN",
    "Assertion",
    "WebAuthnKind",
    "b64url",
    "challenge_for",
    "fingerprint",
    "principal_keys",
    "sshsig_armored",
    "sshsig_signed_data",
    "unb64url",
    "verify_assertion",
]
