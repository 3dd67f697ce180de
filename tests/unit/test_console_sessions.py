"""Console sessions expire (idle, absolute, with their token), one-time codes redeem once and
expire, and a verified token's credential labels a session."""

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
from shared.security.auth import TokenService


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


TOKENS = TokenService({"k1": "s" * 32}, "engram-test")


def _claims(token: str) -> TokenClaims:
    """What the console's sign-in labels a session with: the verified credential."""
    return TokenClaims.of(*TOKENS.check(token))


def _token(ttl: int = 24 * 3600) -> str:
    return TOKENS.mint(
        org_id=uuid4(),
        principal=Principal(kind="end_user", id="alice"),
        permissions={"memory.read"},
        ttl_seconds=ttl,
    )


def _store() -> tuple[SessionStore, Clock]:
    clock = Clock()
    return SessionStore(clock=clock, wall=clock), clock


def test_claims_label_a_verified_token() -> None:
    """A verified token's credential names its principal, permissions and expiry."""
    token = _token(ttl=60)
    claims = _claims(token)
    assert (claims.principal, claims.permissions) == ("end_user:alice", ("memory.read",))
    assert claims.expires_at == TOKENS.check(token)[1]


def test_a_session_ends_after_idling() -> None:
    """A session unused for IDLE_S is gone; each request pushes the idle deadline on."""
    store, clock = _store()
    token = _token()
    session = store.open(token, _claims(token), str(uuid4()))
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
    busy = store.open(token, _claims(token), "a")
    while clock.now < 1000.0 + ABSOLUTE_S - IDLE_S:
        clock.now += IDLE_S / 2
        assert store.get(busy.id) is busy
    clock.now = 1000.0 + ABSOLUTE_S
    assert store.get(busy.id) is None

    store, clock = _store()
    clock.now = 0.0  # the token's iat/exp are real time; this store's wall clock starts at 0
    short = _token(ttl=60)
    claims = _claims(short)
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
    session = store.open(token, _claims(token), "a")
    store.close(session.id)
    assert store.get(session.id) is None


def test_sign_in_attempts_cannot_grow_memory_without_bound() -> None:
    """Past the bound on live codes the least recently issued goes first; the newest still redeems."""
    store, _ = _store()
    codes = [store.issue_code(f"tok-{i}", None) for i in range(MAX_ENTRIES + 1)]
    assert store.redeem_code(codes[0]) is None
    assert store.redeem_code(codes[-1]) == (f"tok-{MAX_ENTRIES}", None)
