"""The NATS identity table, its rendering, and the data dir's registry (no server here: the
permissions are exercised on a real nats-server by tests/integration/test_nats_permissions.py,
and against ``engram up`` by tests/security/test_wire.py)."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from uuid import uuid4

import pytest

from contracts import subjects
from contracts.operations import JETSTREAMS as STREAMS
from shared.security.nats_auth.infra import INFRA_AUTH_FILE, render_infra
from shared.security.nats_auth.keys import new_user_seed, public_key_of
from shared.security.nats_auth.permissions import (
    ALL_IN_ONE,
    PUBLIC_REQUESTS,
    SERVICES,
    Grant,
    Permissions,
    all_in_one_permissions,
    audit_reader_permissions,
    platform_permissions,
    process_name,
    process_permissions,
    service_permissions,
)
from shared.security.nats_auth.render import NatsUser, render_authorization
from shared.security.nats_auth.store import DEV_CLIENT, NatsIdentities

#: Every subject only services may publish (SPEC 6 internal hand-offs and Engram's own events).
INTERNAL = {
    subjects.SESSION_VALIDATED,
    subjects.MEMORY_SAVE_ACCEPTED,
    f"{subjects.SAVE_RESULT_PREFIX}.*",
    subjects.MEMORY_WRITTEN,
    subjects.MEMORY_PURGED,
    f"{subjects.AUDIT}.*.*",
    f"{subjects.DEAD_LETTER_PREFIX}.>",
}


def test_infra_file_is_the_rendered_table() -> None:
    """infra/nats/engram-auth.conf is exactly what the permission table renders (run
    `python -m shared.security.nats_auth.infra` after changing the table)."""
    assert INFRA_AUTH_FILE.read_text() == render_infra()


def test_public_requests_are_every_request_subject_of_the_contract() -> None:
    """A request-reply subject added to the contract is a public request platforms may call."""
    constants = {v for k, v in vars(subjects).items() if k.isupper() and isinstance(v, str)}
    streamed = {s for d in STREAMS for s in d.subjects}
    prefixes = {
        subjects.AUDIT,
        subjects.DEAD_LETTER_PREFIX,
        subjects.SAVE_RESULT_PREFIX,
        subjects.HEALTH_PREFIX,
        # Internal core NATS, like liveness: the admin API's revocations to every process.
        subjects.ADMIN_REVOKED,
        subjects.FEED_PREFIX,
    }
    assert constants - streamed - prefixes == set(PUBLIC_REQUESTS)


def test_platform_client_reaches_only_public_subjects_and_its_inbox() -> None:
    """A platform client publishes session.ended and the public requests, subscribes only under its
    own inbox, and has no $JS API, no internal subject and no allow_responses."""
    perms = platform_permissions("_INBOX_acme")
    assert set(perms.publish_subjects()) == {subjects.SESSION_ENDED, *PUBLIC_REQUESTS}
    assert perms.subscribe_subjects() == ["_INBOX_acme.>"]
    assert not perms.allow_responses
    assert not any(x.startswith("$") for x in perms.publish_subjects())


def test_all_in_one_is_the_union_of_the_services_with_one_inbox() -> None:
    """engram up's identity may do what the five services may, and nothing else: their own inbox
    grants are replaced by _INBOX_engram, and no wildcard beyond theirs appears."""
    merged = all_in_one_permissions()
    services = [service_permissions(name) for name in SERVICES]
    assert set(merged.publish_subjects()) == {x for p in services for x in p.publish_subjects()}
    own = {f"_INBOX_engram-{name}.>" for name in SERVICES}
    expected_sub = {x for p in services for x in p.subscribe_subjects()} - own | {"_INBOX_engram.>"}
    assert set(merged.subscribe_subjects()) == expected_sub
    assert merged.allow_responses
    assert ">" not in merged.publish_subjects() + merged.subscribe_subjects()
    assert not any(".DELETE." in x or ".PURGE." in x for x in merged.publish_subjects())


def test_only_services_publish_internal_subjects() -> None:
    """Internal subjects appear in service identities only, never a client's."""
    clients = [platform_permissions("_INBOX_x"), audit_reader_permissions("_INBOX_y")]
    assert not INTERNAL & {x for p in clients for x in p.publish_subjects()}
    assert set(all_in_one_permissions().publish_subjects()) >= INTERNAL


def test_render_quotes_subjects_and_refuses_what_nats_would_misread() -> None:
    """Subjects are quoted, an empty allow list becomes deny-all (empty means no restriction to
    nats-server), and an empty user list or a non-user key is refused."""
    key = public_key_of(new_user_seed())
    text = render_authorization([NatsUser(key, Permissions(subscribe=(Grant("inbox", ("_INBOX_a.>",)),)))])
    assert f'nkey: "{key}"' in text
    assert '"_INBOX_a.>"' in text
    assert 'publish: { deny: [">"] }' in text
    with pytest.raises(ValueError, match="at least one user"):
        render_authorization([])
    with pytest.raises(ValueError, match="not a public user nkey"):
        render_authorization([NatsUser("SUAAAA", Permissions())])


def test_keys_are_user_nkeys() -> None:
    """Seeds are user seeds whose public keys start with U; garbage is refused."""
    seed = new_user_seed()
    assert seed.startswith("SU")
    assert public_key_of(seed).startswith("U")
    assert public_key_of(seed) != public_key_of(new_user_seed())
    with pytest.raises(ValueError, match="not an nkey seed"):
        public_key_of("not-a-seed")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_registry_keeps_public_keys_and_renders_only_active_clients(tmp_path: Path) -> None:
    """mint/rotate/revoke: the registry and the auth file hold public keys (never a seed), both
    0600; a revoked client and a rotated-away key leave the server's config; names are checked."""
    store = NatsIdentities(tmp_path)
    org = uuid4()
    acme = store.mint("acme", org)
    assert not store.auth_file.exists()  # no run yet: the next start renders it
    run = store.start_run()
    dev = store.dev_client()
    assert dev is not None
    text = store.auth_file.read_text()
    assert run.gateway.inbox_prefix == "_INBOX_engram-gateway"
    for identity in (run.services, run.gateway, dev, acme):
        assert identity.public_key in text
        assert identity.seed not in text
    assert acme.seed not in store.registry_file.read_text()
    assert _mode(store.auth_file) == _mode(store.registry_file) == _mode(store.dev_seed_file) == 0o600
    assert "_INBOX_acme.>" in text

    rotated, record = store.rotate("acme")
    assert record.org_id == str(org)
    assert rotated.inbox_prefix == acme.inbox_prefix
    text = store.auth_file.read_text()
    assert rotated.public_key in text
    assert acme.public_key not in text

    store.revoke("acme")
    assert rotated.public_key not in store.auth_file.read_text()
    assert [c.name for c in store.clients()] == []
    assert [c.name for c in store.clients(include_revoked=True)] == ["acme"]
    assert json.loads(store.registry_file.read_text())["clients"]["acme"]["revoked_at"]
    store.mint("acme", org)  # a revoked name can be issued again

    with pytest.raises(ValueError, match="exists"):
        store.mint("acme", org)
    for bad in (DEV_CLIENT, "engram", "engram-ingest", "Acme", "a.b", "a>", "", "x" * 64):
        with pytest.raises(ValueError, match=r"reserved|a client name is"):
            store.mint(bad, org)
    with pytest.raises(KeyError):
        store.revoke("nobody")

    store.end_run()
    assert store.dev_client() is None
    assert not store.running()


def test_a_process_is_named_and_permitted_by_what_it_runs() -> None:
    """One service keeps its own identity, all five are `engram`, a combination is the union of
    its services' rights under one inbox; unknown names are refused."""
    assert process_name(["recall"]) == "recall"
    assert process_name(reversed(SERVICES)) == ALL_IN_ONE
    assert process_name(["recall", "embed"]) == "embed+recall"
    pair = process_permissions(["recall", "embed"])
    assert pair.inbox_prefix == "_INBOX_engram-embed+recall"
    for name in ("embed", "recall"):
        own = service_permissions(name)
        assert set(own.publish_subjects()) <= set(pair.publish_subjects())
        inbox = f"{own.inbox_prefix}.>"
        assert set(own.subscribe_subjects()) - {inbox} <= set(pair.subscribe_subjects())
        assert inbox not in pair.subscribe_subjects()
    assert "engram.session.validated" not in pair.publish_subjects()
    with pytest.raises(ValueError, match="unknown services"):
        process_name(["recall", "gateway-of-doom"])
