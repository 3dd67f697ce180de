"""Signatures on internal messages: what a service signs verifies; anything changed, moved,
unsigned or signed with another key does not."""

from __future__ import annotations

import secrets

from hypothesis import given
from hypothesis import strategies as st

from shared.security.provenance import SIGNATURE_HEADER, MessageSigner

KEY = secrets.token_urlsafe(40)
signer = MessageSigner({"k1": KEY})


def test_a_signed_message_verifies_and_keeps_its_headers() -> None:
    """sign() adds the signature next to the given headers; verify() accepts it."""
    headers = signer.sign("engram.memory.purged", b"{}", {"Nats-Msg-Id": "e1", "traceparent": "t"})
    assert headers["Nats-Msg-Id"] == "e1"
    assert headers["traceparent"] == "t"
    assert headers[SIGNATURE_HEADER].startswith("v1:k1:")
    assert signer.verify("engram.memory.purged", b"{}", headers)


@given(body=st.binary(max_size=256), other=st.binary(max_size=256), msg_id=st.text(max_size=40))
def test_any_change_breaks_the_signature(body: bytes, other: bytes, msg_id: str) -> None:
    """Another body, another subject or another Nats-Msg-Id fails verification."""
    headers = signer.sign("engram.session.validated", body, {"Nats-Msg-Id": msg_id})
    assert signer.verify("engram.session.validated", body, headers)
    if other != body:
        assert not signer.verify("engram.session.validated", other, headers)
    assert not signer.verify("engram.save.accepted", body, headers)
    assert not signer.verify("engram.session.validated", body, {**headers, "Nats-Msg-Id": msg_id + "x"})


def test_unsigned_foreign_and_malformed_signatures_fail() -> None:
    """No header, a key this deployment does not hold, a known kid with a wrong MAC, garbage."""
    body = b'{"org_id": "victim"}'
    assert not signer.verify("engram.session.validated", body, None)
    assert not signer.verify("engram.session.validated", body, {})
    foreign = MessageSigner({"k1": secrets.token_urlsafe(40)}).sign("engram.session.validated", body)
    assert not signer.verify("engram.session.validated", body, foreign)
    good = signer.sign("engram.session.validated", body)[SIGNATURE_HEADER]
    for value in ("", "v1", "v1:k1:", "v2" + good[2:], good[:-2], "v1:nokid:" + good.rsplit(":", 1)[1], "::"):
        assert not signer.verify("engram.session.validated", body, {SIGNATURE_HEADER: value})


def test_rotation_keeps_verifying_what_the_old_key_signed() -> None:
    """With a new signing key first and the old one kept, both old and new signatures verify;
    dropping the old key refuses what it signed."""
    old = signer.sign("engram.memory.written", b"x")
    rotated = MessageSigner({"k2": secrets.token_urlsafe(40), "k1": KEY})
    assert rotated.verify("engram.memory.written", b"x", old)
    assert rotated.sign("engram.memory.written", b"x")[SIGNATURE_HEADER].startswith("v1:k2:")
    assert not MessageSigner({"k2": "y" * 40}).verify("engram.memory.written", b"x", old)
