"""Passkeys as OpenSSH keys: what the console stores (a COSE key from the
browser) as the ``sk-ecdsa-sha2-nistp256@openssh.com`` public key an
``allowed_signers`` file lists for the person.

Registration and sign-in themselves go through the ``webauthn`` library (see
:mod:`graphrun.cli.console.app`); a decision's passkey signature is checked by the
``"webauthn"`` signature kind (:mod:`graphrun.runtime.decisions.webauthn`).
"""

from __future__ import annotations

import base64

from graphrun.runtime.decisions.webauthn import SK_KEY_TYPE, ssh_string


def cose_to_point(cose_key: bytes) -> bytes:
    """The uncompressed P-256 point (0x04 ‖ x ‖ y) of an ES256 COSE key."""
    from webauthn.helpers import decode_credential_public_key
    from webauthn.helpers.decode_credential_public_key import DecodedEC2PublicKey

    decoded = decode_credential_public_key(cose_key)
    if not isinstance(decoded, DecodedEC2PublicKey) or len(decoded.x) != 32:
        raise ValueError("not an ECDSA P-256 passkey")
    return b"\x04" + decoded.x + decoded.y


def ssh_public_key(cose_key: bytes, rp_id: str) -> str:
    """The passkey as an OpenSSH public key: ``sk-ecdsa-sha2-nistp256@openssh.com AAAA…``."""
    blob = (
        ssh_string(SK_KEY_TYPE.encode())
        + ssh_string(b"nistp256")
        + ssh_string(cose_to_point(cose_key))
        + ssh_string(rp_id.encode("utf-8"))
    )
    return f"{SK_KEY_TYPE} {base64.b64encode(blob).decode('ascii')}"


def allowed_signers_line(principal: str, cose_key: bytes, rp_id: str, namespace: str) -> str:
    """One ``allowed_signers`` line for a person's passkey."""
    return f'{principal} namespaces="{namespace}" {ssh_public_key(cose_key, rp_id)}'


__all__ = ["allowed_signers_line", "cose_to_point", "ssh_public_key"]
