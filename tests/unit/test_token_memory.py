"""``TokenService.verify`` remembers a verified token until it expires (shared/security/auth.py): the
remembered answer is the one a fresh check would give, and nothing that failed is remembered."""

from __future__ import annotations

import time
from uuid import uuid4

import jwt
import pytest

from contracts.common import Principal
from contracts.errors import Unauthenticated
from shared.security.auth import ALL_PERMISSIONS, TokenService

RUNNER = Principal(kind="service", id="runner")


def test_a_verified_token_is_remembered_with_its_claims() -> None:
    tokens = TokenService({"k": "s" * 48})
    token = tokens.mint(org_id=uuid4(), principal=RUNNER, permissions={"memory.read"}, session_id="s-1")
    first = tokens.verify(token)
    assert tokens.verify(token) is first
    assert (first.principal, first.permissions, first.session_id) == (
        RUNNER,
        frozenset({"memory.read"}),
        "s-1",
    )


def test_a_remembered_token_expires_when_its_claim_says() -> None:
    """Once the clock reaches a remembered token's ``exp`` it is refused as expired, as a fresh
    check would refuse it."""
    now = [time.time()]
    tokens = TokenService({"k": "s" * 48}, clock=lambda: now[0])
    token = tokens.mint(org_id=uuid4(), principal=RUNNER, permissions=ALL_PERMISSIONS, ttl_seconds=60)
    tokens.verify(token)
    now[0] = float(jwt.decode(token, options={"verify_signature": False})["exp"])
    for _ in range(2):  # and stays refused: an expired token is not remembered again
        with pytest.raises(Unauthenticated, match="expired"):
            tokens.verify(token)


def test_failures_are_never_remembered() -> None:
    """A token of another key fails every time, and a token fails on a service without its key
    even after another service (with the key) verified it."""
    mine, theirs = TokenService({"k": "s" * 48}), TokenService({"k": "t" * 48})
    token = theirs.mint(org_id=uuid4(), principal=RUNNER, permissions=ALL_PERMISSIONS)
    theirs.verify(token)
    for _ in range(2):
        with pytest.raises(Unauthenticated, match="invalid token"):
            mine.verify(token)
    tampered = token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]
    with pytest.raises(Unauthenticated):
        theirs.verify(tampered)


def test_memory_is_bounded() -> None:
    """A full memory forgets the least recently used token; a forgotten one is checked again."""
    tokens = TokenService({"k": "s" * 48}, remember=3)
    minted = [tokens.mint(org_id=uuid4(), principal=RUNNER, permissions=ALL_PERMISSIONS) for _ in range(4)]
    first = [tokens.verify(token) for token in minted[:3]]
    assert tokens.verify(minted[0]) is first[0]  # used again: the most recent now
    tokens.verify(minted[3])
    assert len(tokens._verified) == 3
    assert tokens.verify(minted[0]) is first[0]  # still remembered
    assert tokens.verify(minted[1]) is not first[1]  # forgotten, so verified afresh
    assert tokens.verify(minted[1]).org_id == first[1].org_id
