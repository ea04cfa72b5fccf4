"""What signing a decision statement rests on: the domain tag, the trust material a
signature is verified against, the protocol of a signature kind and its error.

The signature kinds (:mod:`~graphrun.runtime.decisions.sshsig`,
:mod:`~graphrun.runtime.decisions.webauthn`) build on this module; the package
(:mod:`graphrun.runtime.decisions`) registers them and re-exports these names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from graphrun.eventstore.errors import GraphrunError

#: The domain tag of every statement, and the SSHSIG namespace signatures use.
DOMAIN = "graphrun-decision@v1"


class SignatureInvalid(GraphrunError):
    """A signature does not verify; the message says which check failed."""


@dataclass(frozen=True)
class Trust:
    """What verification may consult: local files and data only.

    Attributes:
        signers: An OpenSSH ``allowed_signers`` file (``"sshsig"``).
        extra: Per signature kind, whatever that kind verifies against
            (e.g. ``extra["webauthn"]``: the registered passkeys).
    """

    signers: Path | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


class SignatureKind(Protocol):
    """One way of signing statement bytes."""

    name: str

    def verify(self, statement: bytes, signature: str, principal: str, trust: Trust) -> str:
        """The id of the key that signed ``statement`` as ``principal`` (e.g. an SSH
        key's ``SHA256:`` fingerprint, a credential id).

        Raises:
            SignatureInvalid: The signature does not verify, the key is not
                ``principal``'s, or the trust material is missing (the message says which).
        """
        ...


__all__ = ["DOMAIN", "SignatureInvalid", "SignatureKind", "Trust"]
