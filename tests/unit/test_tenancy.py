"""Tenancy (SPEC 3): how owners are keyed, and the owner keys a recall may read, never widened."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from contracts.common import Principal, PrincipalKind
from contracts.errors import InvalidRequest, SessionRequired
from shared.security.tenancy import SHARED_POOL, ConfigScope, owner_key, visible_owner_keys

SCOPES: list[ConfigScope] = ["workload", "actor", "session"]
KINDS: list[PrincipalKind] = ["end_user", "actor"]

# Ids an attacker or a sloppy platform might send: wildcards, quotes, look-alikes, case variants.
TRICKY_IDS = [
    "alice",
    "Alice",
    "ALICE",
    "аlice",  # Cyrillic а
    "ａｌｉｃｅ",  # fullwidth
    "alice\u200b",  # zero-width space
    "*",
    "%",
    "_",
    "alice%",
    "al_ce",
    "'",
    '"',
    "alice'--",
    "' OR '1'='1",
    "\\",
    "[a-z]*",
    "end_user",
    "actor",
]


def _principal(kind: PrincipalKind, ident: str | None) -> Principal:
    """A principal built as validation allows, or bypassing it (what a bug upstream might hand us)."""
    try:
        return Principal(kind=kind, id=ident)
    except ValidationError:
        return Principal.model_construct(kind=kind, id=ident)


def test_one_owner_key_for_writers_and_readers() -> None:
    """The save path keys ``None`` (no owner) and ``none`` alike; readers key principals the same
    way, so what one writes the other finds."""
    assert owner_key(None) == owner_key(Principal(kind="none")) == SHARED_POOL
    assert owner_key(Principal(kind="end_user", id="alice")) == "end_user:alice"
    assert owner_key(Principal(kind="actor", id="Alice")) == "actor:Alice"


@pytest.mark.parametrize("ident", [None, "", "  "])
def test_an_owner_without_an_id_is_refused_not_pooled(ident: str | None) -> None:
    """A principal that skipped validation must not be keyed ``end_user:None`` (shared by every
    such bug) nor fall into the shared pool."""
    with pytest.raises(InvalidRequest):
        owner_key(Principal.model_construct(kind="end_user", id=ident))


@pytest.mark.parametrize(
    ("kind", "ident", "scope", "expected"),
    [
        ("none", None, "workload", ("",)),
        ("none", None, "actor", ("",)),
        ("none", None, "session", ("",)),
        ("end_user", "alice", "workload", ("end_user:alice",)),
        ("end_user", "alice", "actor", ("end_user:alice",)),
        ("end_user", "alice", "session", ("end_user:alice",)),
        ("actor", "carol", "workload", ("actor:carol", "")),
        ("actor", "carol", "actor", ("actor:carol",)),
        ("actor", "carol", "session", ("actor:carol",)),
    ],
)
def test_visibility_table(
    kind: PrincipalKind, ident: str | None, scope: ConfigScope, expected: tuple[str, ...]
) -> None:
    """Each principal kind and config scope sees exactly the owner keys SPEC 3 lists."""
    assert visible_owner_keys(_principal(kind, ident), scope, "s-1") == expected


@pytest.mark.parametrize("session_id", [None, "", "   "])
@pytest.mark.parametrize("kind", ["none", "end_user", "actor"])
def test_session_scope_without_session_id_is_refused(kind: PrincipalKind, session_id: str | None) -> None:
    """A session-scoped recall without a session id answers SESSION_REQUIRED, whoever asks."""
    caller = _principal(kind, None if kind == "none" else "alice")
    with pytest.raises(SessionRequired):
        visible_owner_keys(caller, "session", session_id)


@pytest.mark.parametrize("scope", ["workload", "actor"])
def test_missing_session_id_is_fine_outside_session_scope(scope: ConfigScope) -> None:
    """Only the session scope needs a session id."""
    assert visible_owner_keys(_principal("actor", "carol"), scope, None)


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize(
    "caller",
    [
        None,
        Principal.model_construct(kind="end_user", id=None),
        Principal.model_construct(kind="end_user", id=""),
        Principal.model_construct(kind="end_user", id="   "),
        Principal.model_construct(kind="end_user", id="\t\n"),
        Principal.model_construct(kind="actor", id=""),
    ],
)
def test_unresolved_identity_gets_no_memory(caller: Principal | None, scope: ConfigScope) -> None:
    """An identity that cannot be resolved sees nothing — not an error, and not the shared pool."""
    assert visible_owner_keys(caller, scope, "s-1") == ()


@pytest.mark.parametrize("scope", SCOPES)
def test_service_principal_never_reaches_visibility(scope: ConfigScope) -> None:
    """A service must be resolved to the principal it acts for before visibility is asked."""
    with pytest.raises(ValueError, match="service") as caught:
        visible_owner_keys(Principal(kind="service", id="runner"), scope, "s-1")
    assert isinstance(caught.value, InvalidRequest)


ids_strategy = st.one_of(st.sampled_from(TRICKY_IDS), st.text(min_size=0, max_size=30))


@given(ident=ids_strategy, scope=st.sampled_from(SCOPES))
def test_end_user_sees_only_its_own_exact_key(ident: str, scope: ConfigScope) -> None:
    """An end user gets nothing or exactly ``end_user:<id>`` — never the shared pool, never a rewrite."""
    keys = visible_owner_keys(_principal("end_user", ident), scope, "s-1")
    assert keys in {(), (f"end_user:{ident}",)}
    assert "" not in keys
    if ident.strip():
        assert keys == (f"end_user:{ident}",)


@given(ident=ids_strategy, scope=st.sampled_from(SCOPES))
def test_actor_sees_its_own_exact_key_and_at_most_the_shared_pool(ident: str, scope: ConfigScope) -> None:
    """An actor gets ``actor:<id>`` plus the shared pool under workload scope, only its own otherwise."""
    keys = visible_owner_keys(_principal("actor", ident), scope, "s-1")
    if not ident.strip():
        assert keys == ()
    elif scope == "workload":
        assert keys == (f"actor:{ident}", "")
    else:
        assert keys == (f"actor:{ident}",)


@given(scope=st.sampled_from(SCOPES), session_id=st.text(min_size=1).filter(str.strip))
def test_none_sees_only_the_shared_pool(scope: ConfigScope, session_id: str) -> None:
    """The shared principal sees the shared pool and nothing else, in every scope."""
    assert visible_owner_keys(Principal(kind="none"), scope, session_id) == ("",)


@given(
    first=ids_strategy,
    second=ids_strategy,
    kind=st.sampled_from(KINDS),
    scope=st.sampled_from(SCOPES),
)
def test_two_different_ids_never_share_a_private_key(
    first: str, second: str, kind: PrincipalKind, scope: ConfigScope
) -> None:
    """No normalization merges two users: distinct ids (look-alikes, case, wildcards) get disjoint keys."""
    a = set(visible_owner_keys(_principal(kind, first), scope, "s-1")) - {""}
    b = set(visible_owner_keys(_principal(kind, second), scope, "s-1")) - {""}
    if first != second:
        assert not a & b


@given(ident=ids_strategy, scope=st.sampled_from(SCOPES))
def test_end_user_and_actor_with_the_same_id_are_different_owners(ident: str, scope: ConfigScope) -> None:
    """Swapping the kind of a principal never reaches the other kind's entries."""
    user = set(visible_owner_keys(_principal("end_user", ident), scope, "s-1"))
    actor = set(visible_owner_keys(_principal("actor", ident), scope, "s-1")) - {""}
    assert not user & actor
