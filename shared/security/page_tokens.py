"""Opaque, signed page tokens for list and export (SPEC 7.2).

A token is ``base64url(body) "." base64url(HMAC-SHA256(key, body))``. The body binds the caller,
the organization, a digest of the request's filters, the position and an expiry; the MAC is
checked in constant time before anything in the body is believed. Every way a token can be wrong
— bit flips, truncation, another caller, another filter, expired, signed with an unknown key —
gives the same ``INVALID_REQUEST`` and no data, so a probe learns nothing about which it was.

The MAC key is derived from the token signing keys (one derivation per key id, so rotating the
signing keys rotates page tokens too).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from contracts.errors import InvalidRequest

__all__ = ["PageTokens", "filters_digest"]

_CONTEXT = b"engram/page-token/v1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text or len(text) > 4096 or not all(c.isalnum() or c in "-_" for c in text):
        raise ValueError("not base64url")
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    # Canonical spellings only: base64's spare bits would otherwise let one token have several.
    if _b64(raw) != text:
        raise ValueError("not canonical base64url")
    return raw


def filters_digest(filters: Mapping[str, Any]) -> str:
    """A stable digest of what a page sequence is about (sorted-key JSON)."""
    canonical = json.dumps(filters, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


class PageTokens:
    def __init__(self, signing_keys: Mapping[str, str], *, ttl_s: int = 3600) -> None:
        if not signing_keys:
            raise ValueError("page tokens need at least one signing key")
        # kid → derived MAC key; the first signs (as for bearer tokens).
        self._keys = {
            kid: hmac.new(secret.encode(), _CONTEXT, hashlib.sha256).digest()
            for kid, secret in signing_keys.items()
        }
        self._signing_kid = next(iter(self._keys))
        self._ttl = ttl_s

    def issue(
        self,
        *,
        purpose: str,
        org_id: UUID,
        caller: str,
        filters: Mapping[str, Any],
        position: Mapping[str, Any],
        now: float | None = None,
    ) -> str:
        body = {
            "p": purpose,
            "o": str(org_id),
            "c": caller,
            "f": filters_digest(filters),
            "pos": dict(position),
            "exp": int((now if now is not None else time.time()) + self._ttl),
            "k": self._signing_kid,
        }
        raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        mac = hmac.new(self._keys[self._signing_kid], raw, hashlib.sha256).digest()
        return f"{_b64(raw)}.{_b64(mac)}"

    def open(
        self,
        token: str,
        *,
        purpose: str,
        org_id: UUID,
        caller: str,
        filters: Mapping[str, Any],
        now: float | None = None,
    ) -> dict[str, Any]:
        """The position a valid token carries; ``InvalidRequest`` for any other token."""
        refused = InvalidRequest("invalid page token")
        try:
            body_part, _, mac_part = token.partition(".")
            raw, mac = _unb64(body_part), _unb64(mac_part)
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise refused from None
        if not isinstance(body, dict):
            raise refused
        key = self._keys.get(str(body.get("k")))
        expected = hmac.new(key or b"\0" * 32, raw, hashlib.sha256).digest()
        # compare_digest first and always: the time taken does not depend on where a forgery differs.
        if not hmac.compare_digest(expected, mac) or key is None:
            raise refused
        current = now if now is not None else time.time()
        position = body.get("pos")
        if (
            body.get("p") != purpose
            or body.get("o") != str(org_id)
            or body.get("c") != caller
            or body.get("f") != filters_digest(filters)
            or not isinstance(body.get("exp"), int)
            or body["exp"] < current
            or not isinstance(position, dict)
        ):
            raise refused
        return position
