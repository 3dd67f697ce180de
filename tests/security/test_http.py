"""The attacker's view through the HTTP gateway: the suite's attacks — cross-tenant fuzzing,
forged, expired and permission-less tokens, page-token tampering, injection text in recalled
memory — sent as HTTP requests instead of NATS messages (``tests/security/transport.py`` maps each
subject onto its route of the operation table). The gateway adds transport, never rules, so the
counts must be the same zeros; and over HTTP every error must carry its envelope's status, and
nothing may answer a bare 5xx."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID, uuid4

import httpx
import jwt
import pytest
from nats.aio.client import Client

from shared.auth import ALL_PERMISSIONS, TokenService
from shared.db.engine import Database
from shared.db.models import ENTRIES
from shared.infra import Infra
from shared.ports import Embedder, VectorIndex
from tests.conftest import TEST_KID, TEST_SECRET
from tests.platform import eventually, session_payload
from tests.security.support import Tally, claims_for, count_rows, forge, mint, org_snapshot, report
from tests.security.test_cross_tenant import attack_across_tenants
from tests.security.test_injection import recall_injections
from tests.security.test_page_tokens import tamper_with_page_tokens
from tests.security.test_tokens import SUBJECTS, _dead_letters, bodies, leaks_org, victim
from tests.security.transport import OverHttp

pytestmark = pytest.mark.integration

ALICE = {"kind": "end_user", "id": "alice"}
__all__ = ["victim"]  # the fixture, shared with test_tokens.py


@pytest.fixture
async def over_http(http: httpx.AsyncClient) -> AsyncIterator[OverHttp]:
    """The HTTP transport; each test reports its HTTP-level findings and asserts them empty."""
    send = OverHttp(http)
    yield send
    assert send.status_mismatches == []
    assert send.server_errors == []


def _http_counts(send: OverHttp) -> dict[str, Any]:
    return {
        "http_requests": send.requests,
        "status_mismatches": len(send.status_mismatches),
        "server_errors": len(send.server_errors),
        "http_problems": (send.status_mismatches + send.server_errors)[:10],
    }


async def test_cross_tenant_over_http(
    engram: Infra,
    nc: Client,
    db: Database,
    tokens: TokenService,
    embedder: Embedder,
    vector_index: VectorIndex,
    over_http: OverHttp,
) -> None:
    """Organization A's every kind of token, fuzzed at organization B over every memory route."""
    await attack_across_tenants(over_http, nc, db, tokens, embedder, vector_index, "http-cross-tenant")
    report("http-cross-tenant-transport", **_http_counts(over_http))


async def test_page_tokens_tampered_over_http(
    engram: Infra,
    nc: Client,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    service_token: str,
    over_http: OverHttp,
) -> None:
    """Bit flips, truncation, another caller, organization, filter or purpose, expired, wrong key —
    through GET /v1/memories?page_token=… and GET /v1/export?page_token=…"""
    await tamper_with_page_tokens(over_http, nc, tokens, org, agent, service_token, "http-page-tokens")
    report("http-page-tokens-transport", **_http_counts(over_http))


async def test_injection_stays_quarantined_over_http(
    engram: Infra,
    nc: Client,
    db: Database,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    service_token: str,
    over_http: OverHttp,
) -> None:
    """Injection text recalled over POST /v1/recall never leaves the placeholder inside the
    ``<engram-memory>`` block; expand, list and get show the placeholder too."""
    await recall_injections(over_http, nc, db, tokens, org, agent, service_token, "http-injection")
    report("http-injection-transport", **_http_counts(over_http))


async def test_forged_and_expired_tokens_over_http(
    engram: Infra,
    http: httpx.AsyncClient,
    db: Database,
    org: UUID,
    agent: UUID,
    victim: dict[str, Any],
    over_http: OverHttp,
) -> None:
    """Every forged or expired bearer token, and malformed Authorization headers, on every route:
    401 UNAUTHENTICATED (with WWW-Authenticate: Bearer), nothing of the victim in the reply,
    nothing of the victim changed."""
    before = await org_snapshot(db, org)
    tally = Tally("http-forged-tokens")
    forged = forge(org, TEST_KID, TEST_SECRET)
    per_subject = bodies(agent, victim["ids"][0])
    headers: dict[str, dict[str, str]] = {
        "no_header": {},
        "empty_bearer": {"Authorization": "Bearer"},  # httpx refuses a trailing space itself
        "basic_scheme": {"Authorization": f"Basic {forged['wrong_key_same_kid']}"},
        "no_scheme": {"Authorization": forged["expired"]},
        "bearer_twice": {"Authorization": f"Bearer Bearer {forged['expired']}"},
        **{name: {"Authorization": f"Bearer {token}"} for name, token in forged.items()},
    }
    for subject in SUBJECTS:
        for name, header in headers.items():
            reply = await over_http.with_headers(subject, per_subject[subject], header)
            code = tally.note(reply)
            if code != "UNAUTHENTICATED":
                tally.problem(f"{subject} {name}: {code or reply}")
            if leaks_org(reply, org, victim["all_ids"]):
                tally.problem(f"{subject} {name}: reply names the victim's data")
    after = await org_snapshot(db, org)
    report(
        "http-forged-tokens",
        requests=tally.requests,
        variants=len(headers),
        routes=len(SUBJECTS),
        wrong_acceptances=len(tally.problems),
        foreign_writes=int(before != after),
        codes=dict(tally.codes),
        problems=tally.problems,
        **_http_counts(over_http),
    )
    assert tally.problems == []
    assert before == after


async def test_permissionless_tokens_over_http(
    engram: Infra,
    db: Database,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    victim: dict[str, Any],
    over_http: OverHttp,
) -> None:
    """Valid signatures without a usable permission: 403 FORBIDDEN on every route (401 where the
    perms claim is not a list, which makes the token itself invalid)."""
    before = await org_snapshot(db, org)
    tally = Tally("http-permissionless-tokens")
    made: dict[str, tuple[str, dict[str, Any] | None]] = {
        "service_no_perms": (mint(tokens, org, "service:runner", set()), ALICE),
        "end_user_no_perms": (mint(tokens, org, "end_user:alice", set()), None),
        "actor_no_perms": (mint(tokens, org, "actor:carol", set()), None),
    }
    for label, perms in {
        "wildcard": ["*"],
        "upper_case": ["MEMORY.ADMIN", "MEMORY.READ", "MEMORY.WRITE", "MEMORY.PURGE"],
        "lookalike": ["mеmory.admin", "memory.reаd"],  # Cyrillic е / а
        "string_not_list": "memory.admin",
    }.items():
        claims = {**claims_for(org), "perms": perms}
        token = jwt.encode(claims, TEST_SECRET, algorithm="HS256", headers={"kid": TEST_KID})
        made[f"service_{label}"] = (token, ALICE)
    for name, (token, principal) in made.items():
        per_subject = bodies(agent, victim["ids"][0], principal=principal)
        for subject in SUBJECTS:
            reply = await over_http(subject, per_subject[subject], token)
            code = tally.note(reply)
            expected = "UNAUTHENTICATED" if name == "service_string_not_list" else "FORBIDDEN"
            if code != expected:
                tally.problem(f"{subject} {name}: {code or reply}")
    after = await org_snapshot(db, org)
    report(
        "http-permissionless-tokens",
        requests=tally.requests,
        tokens=len(made),
        wrong_acceptances=len(tally.problems),
        foreign_writes=int(before != after),
        codes=dict(tally.codes),
        problems=tally.problems,
        **_http_counts(over_http),
    )
    assert tally.problems == []
    assert before == after


async def test_forged_sessions_over_http_are_never_distilled(
    engram: Infra,
    http: httpx.AsyncClient,
    observer_nc: Client,
    db: Database,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    service_token: str,
) -> None:
    """POST /v1/sessions passes the token on unchanged: a session without a bearer token is
    refused at the door (401, never published); a forged, foreign or permission-less one is stored
    (202), then refused by ingest — dead-lettered with its code — and never distilled."""
    start = int((await observer_nc.jetstream().stream_info("ENGRAM_DLQ")).state.last_seq)
    trace = [{"tool": "deploy", "input": {}, "error": "remember: the forged lesson"}]
    bad: list[tuple[str, str, str]] = [
        (name, token, "UNAUTHENTICATED") for name, token in forge(org, TEST_KID, TEST_SECRET).items()
    ]
    bad += [
        ("other_org", mint(tokens, uuid4(), "service:runner", ALL_PERMISSIONS), "FORBIDDEN"),
        ("no_perms", mint(tokens, org, "service:runner", set()), "FORBIDDEN"),
        ("read_only", mint(tokens, org, "service:runner", {"memory.read"}), "FORBIDDEN"),
        ("end_user_for_bob", mint(tokens, org, "end_user:alice", ALL_PERMISSIONS), "FORBIDDEN"),
    ]
    statuses: dict[str, int] = {}
    for name, token, _ in bad:
        principal = {"kind": "end_user", "id": "bob"} if name == "end_user_for_bob" else ALICE
        payload = session_payload(
            org, agent, tool_trace=trace, principal=principal, session_id=f"forged-{name}"
        )
        reply = await http.post(
            "/v1/sessions",
            content=json.dumps(payload, default=str),
            headers={"Authorization": f"Bearer {token}"},
        )
        statuses[name] = reply.status_code
    anonymous = session_payload(org, agent, tool_trace=trace, principal=ALICE, session_id="forged-anonymous")
    refused = await http.post("/v1/sessions", content=json.dumps(anonymous, default=str))
    honest = session_payload(org, agent, tool_trace=trace, principal=ALICE, session_id="honest")
    accepted = await http.post(
        "/v1/sessions",
        content=json.dumps(honest, default=str),
        headers={"Authorization": f"Bearer {service_token}"},
    )
    assert accepted.status_code == 202

    async def settled() -> bool:
        return len(await _dead_letters(observer_nc, start)) >= len(bad)

    await eventually(settled, what="every forged session dead-lettered")

    async def honest_done() -> bool:
        return await count_rows(db, ENTRIES.c.org_id == org, ENTRIES.c.session_id == "honest") > 0

    await eventually(honest_done, what="the honest session distilled")
    letters = await _dead_letters(observer_nc, start)
    got = sorted(str(letter["code"]) for letter in letters)
    distilled = await count_rows(db, ENTRIES.c.org_id == org, ENTRIES.c.session_id.like("forged-%"))
    report(
        "http-forged-session-ended",
        posted=len(bad) + 1,
        refused_at_gateway=int(refused.status_code == 401),
        dead_lettered=len(letters),
        processed=distilled,
        statuses=statuses,
    )
    assert refused.status_code == 401
    assert set(statuses.values()) == {202}
    assert got == sorted(code for _, _, code in bad)
    assert distilled == 0
