"""Console sessions expire (idle, absolute, with their token), one-time codes redeem once and
expire, and the token's claims label a session without being trusted."""

from __future__ import annotations

from uuid import uuid4

from contracts.common import Principal
from services.gateway.console.sessions import (
    ABSOLUTE_S,
    CODE_S,
    IDLE_S,
    MAX_ENTRIES,
    SessionStore,
    TokenClaims,
)
from shared.auth import TokenService


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _token(ttl: int = 24 * 3600) -> str:
    tokens = TokenService({"k1": "s" * 32}, "engram-test")
    return tokens.mint(
        org_id=uuid4(),
        principal=Principal(kind="end_user", id="alice"),
        permissions={"memory.read"},
        ttl_seconds=ttl,
    )


def _store() -> tuple[SessionStore, Clock]:
    clock = Clock()
    return SessionStore(clock=clock, wall=clock), clock


def test_claims_label_a_token_and_refuse_garbage() -> None:
    """An Engram token's claims name its principal and permissions; anything else is None."""
    claims = TokenClaims.read(_token())
    assert claims is not None
    assert (claims.principal, claims.permissions) == ("end_user:alice", ("memory.read",))
    assert TokenClaims.read("not-a-token") is None
    assert TokenClaims.read("a.b.c") is None


def test_a_session_ends_after_idling() -> None:
    """A session unused for IDLE_S is gone; each request pushes the idle deadline on."""
    store, clock = _store()
    token = _token()
    session = store.open(token, TokenClaims.read(token), str(uuid4()))  # type: ignore[arg-type]
    clock.now += IDLE_S - 1
    assert store.get(session.id) is session
    clock.now += IDLE_S - 1
    assert store.get(session.id) is session
    clock.now += IDLE_S
    assert store.get(session.id) is None
    assert store.get(session.id) is None


def test_a_session_ends_at_its_absolute_bound_or_its_tokens_expiry() -> None:
    """However busy, a session ends after ABSOLUTE_S — or sooner, when its token expires."""
    store, clock = _store()
    token = _token()
    busy = store.open(token, TokenClaims.read(token), "a")  # type: ignore[arg-type]
    while clock.now < 1000.0 + ABSOLUTE_S - IDLE_S:
        clock.now += IDLE_S / 2
        assert store.get(busy.id) is busy
    clock.now = 1000.0 + ABSOLUTE_S
    assert store.get(busy.id) is None

    store, clock = _store()
    clock.now = 0.0  # the token's iat/exp are real time; this store's wall clock starts at 0
    short = _token(ttl=60)
    claims = TokenClaims.read(short)
    assert claims is not None
    clock.now = claims.expires_at - 60
    session = store.open(short, claims, "a")
    clock.now += 59
    assert store.get(session.id) is session
    clock.now += 2
    assert store.get(session.id) is None


def test_a_code_redeems_once_and_expires() -> None:
    """A one-time code gives its token back once, and never after CODE_S."""
    store, clock = _store()
    code = store.issue_code("tok", "agent")
    assert store.redeem_code(code) == ("tok", "agent")
    assert store.redeem_code(code) is None
    late = store.issue_code("tok", None)
    clock.now += CODE_S
    assert store.redeem_code(late) is None
    assert store.redeem_code("guessed") is None


def test_sign_out_forgets_the_session() -> None:
    """A closed session is gone at once."""
    store, _ = _store()
    token = _token()
    session = store.open(token, TokenClaims.read(token), "a")  # type: ignore[arg-type]
    store.close(session.id)
    assert store.get(session.id) is None


def test_sign_in_attempts_cannot_grow_memory_without_bound() -> None:
    """Past the bound on live codes the least recently issued goes first; the newest still redeems."""
    store, _ = _store()
    codes = [store.issue_code(f"tok-{i}", None) for i in range(MAX_ENTRIES + 1)]
    assert store.redeem_code(codes[0]) is None
    assert store.redeem_code(codes[-1]) == (f"tok-{MAX_ENTRIES}", None)
