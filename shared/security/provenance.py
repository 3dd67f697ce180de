"""Internal messages prove their producer (defense in depth behind NATS permissions).

Every message a service publishes for another service — the hand-offs ``engram.session.validated``
and ``engram.save.accepted``, the outcomes on ``engram.save.result.<id>``, and whatever the outbox
relay sends (``engram.memory.written``/``purged``, ``engram.audit.*.*``, ``engram.dlq.*``) — carries
``Engram-Signature: v1:<kid>:<HMAC-SHA256>`` over the subject, the ``Nats-Msg-Id`` and the body.
The consumers check it before anything else (``shared.storage.deadletter.refuse_forged``, which every signed
stream consumer runs through ``shared.service.consumer``); a message without a valid signature is
dead-lettered with an audit record in the system chain and has no effect. So a NATS permission opened by
mistake lets a client reach an internal subject, but not write into a tenant or delete vectors.

The MAC key is derived from the token signing keys, one derivation per key id (as page tokens
do): every Engram service already holds them, nobody else does, and rotating the signing keys
rotates this too. The subject is inside the MAC, so a signature cannot be moved to another
subject; a signed message replayed as it is has the effect of a redelivery, which every consumer
absorbs (inbox rows, idempotent vector deletes).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

__all__ = ["FORGED_SOURCE", "SIGNATURE_HEADER", "MessageSigner"]

SIGNATURE_HEADER = "Engram-Signature"
_CONTEXT = b"engram/internal-message/v1"
_VERSION = "v1"
#: Source of the dead letters and audit records of refused messages: ``internal.rejected``.
FORGED_SOURCE = "internal"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class MessageSigner:
    """Signs what this process publishes for other services, and checks what it consumes."""

    def __init__(self, signing_keys: Mapping[str, str]) -> None:
        if not signing_keys:
            raise ValueError("internal message signatures need at least one token signing key")
        self._keys = {
            kid: hmac.new(secret.encode(), _CONTEXT, hashlib.sha256).digest()
            for kid, secret in signing_keys.items()
        }
        self._signing_kid = next(iter(self._keys))

    @staticmethod
    def _mac(key: bytes, subject: str, msg_id: str, body: bytes) -> bytes:
        mac = hmac.new(key, subject.encode(), hashlib.sha256)
        mac.update(b"\n" + msg_id.encode() + b"\n")
        mac.update(body)
        return mac.digest()

    def sign(self, subject: str, body: bytes, headers: Mapping[str, str] | None = None) -> dict[str, str]:
        """``headers`` plus the signature (over their ``Nats-Msg-Id``, if any)."""
        out = dict(headers or {})
        mac = self._mac(self._keys[self._signing_kid], subject, out.get("Nats-Msg-Id", ""), body)
        out[SIGNATURE_HEADER] = f"{_VERSION}:{self._signing_kid}:{_b64(mac)}"
        return out

    def verify(self, subject: str, body: bytes, headers: Mapping[str, str] | None) -> bool:
        """Whether the message carries a valid signature by a key this deployment holds."""
        value = (headers or {}).get(SIGNATURE_HEADER, "")
        version, _, rest = value.partition(":")
        kid, _, given = rest.rpartition(":")
        key = self._keys.get(kid)
        if version != _VERSION or key is None:
            return False
        expected = _b64(self._mac(key, subject, (headers or {}).get("Nats-Msg-Id", ""), body))
        return hmac.compare_digest(expected, given)
