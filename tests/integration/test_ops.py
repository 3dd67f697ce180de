"""``engram.ops.dead_letters`` and ``engram.ops.lag`` against the real services: an organization's
operator sees its own dead letters (with reasons, never the kept payload), never another's nor the
system organization's; the deployment's operator sees every letter and the pipeline's lag, and the
two agree; end users and restricted tokens see neither."""

from __future__ import annotations

import hashlib
import json
import secrets
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from nats.aio.client import Client

from contracts.common import SYSTEM_ORG, Principal
from contracts.subjects import OPS_DEAD_LETTERS, OPS_LAG
from shared.embedded.stack import DevIdentity
from shared.security.auth import ALL_PERMISSIONS, OPERATOR, TokenService
from shared.service.infra import Infra
from tests.conftest import TEST_KID, TEST_SECRET
from tests.platform import eventually, publish_session, request, session_payload

pytestmark = pytest.mark.integration


async def _dlq_last_seq(nc: Client) -> int:
    return int((await nc.jetstream().stream_info("ENGRAM_DLQ")).state.last_seq)


def _operator(tokens: TokenService, **restrictions: Any) -> str:
    """The deployment's operator, as a token of an organization of its own."""
    return tokens.mint(
        org_id=uuid4(),
        principal=Principal(kind="service", id="ops"),
        permissions=ALL_PERMISSIONS | {OPERATOR},
        **restrictions,
    )


async def test_an_operator_sees_its_own_dead_letters_newest_first(
    engram: Infra,
    nc: Client,
    observer_nc: Client,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    service_token: str,
    http: httpx.AsyncClient,
) -> None:
    start = await _dlq_last_seq(observer_nc)
    not_json = b'{"<script>alert(1)</script>'
    missing = json.dumps({k: v for k, v in session_payload(org, agent).items() if k != "status"}).encode()
    # A forged token names no organization Engram can trust: its letter is the system org's.
    forged = TokenService({"k": secrets.token_urlsafe(48)}).mint(
        org_id=org, principal=Principal(kind="service", id="x"), permissions=ALL_PERMISSIONS
    )
    await publish_session(nc, not_json, service_token, msg_id=None)
    await publish_session(nc, session_payload(org, agent), forged, msg_id=None)
    await publish_session(nc, missing, service_token, msg_id=None)

    async def all_three() -> bool:
        return await _dlq_last_seq(observer_nc) >= start + 3

    await eventually(all_three, what="three dead letters")
    page = await request(nc, OPS_DEAD_LETTERS, {}, service_token)
    letters = page["letters"]
    assert [letter["original_sha256"] for letter in letters] == [
        hashlib.sha256(body).hexdigest() for body in (missing, not_json)
    ]  # newest first, and not the forged one
    assert all(
        letter["source_subject"] == "engram.session.ended" and letter["code"] == "INVALID_REQUEST"
        for letter in letters
    )
    assert all(letter["reason"] and letter["occurred_at"] for letter in letters)
    assert not any("original_b64" in letter or "details" in letter for letter in letters)
    assert page["next_before_seq"] is None

    first = await request(nc, OPS_DEAD_LETTERS, {"limit": 1}, service_token)
    assert [x["seq"] for x in first["letters"]] == [letters[0]["seq"]]
    older = await request(
        nc, OPS_DEAD_LETTERS, {"limit": 1, "before_seq": first["next_before_seq"]}, service_token
    )
    assert [x["seq"] for x in older["letters"]] == [letters[1]["seq"]]
    assert older["next_before_seq"] is None

    by_source = await request(nc, OPS_DEAD_LETTERS, {"source": "session"}, service_token)
    assert by_source["letters"] == letters
    assert (await request(nc, OPS_DEAD_LETTERS, {"source": "embed"}, service_token))["letters"] == []

    over_http = await http.get(
        "/v1/dead-letters",
        params={"source": "session", "limit": "5"},
        headers={"Authorization": f"Bearer {service_token}"},
    )
    assert over_http.status_code == 200, over_http.text
    assert over_http.json()["letters"] == letters

    other_operator = tokens.mint(
        org_id=uuid4(), principal=Principal(kind="service", id="ops"), permissions=ALL_PERMISSIONS
    )
    assert (await request(nc, OPS_DEAD_LETTERS, {}, other_operator))["letters"] == []


async def test_the_deployment_operator_sees_every_letter_as_the_stream_counts_them(
    engram: Infra,
    nc: Client,
    observer_nc: Client,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    service_token: str,
) -> None:
    """Two sessions refused for their content (the organization's letters) and two whose token did
    not verify (no token, garbage: the system organization's): the development identity — the
    deployment's operator — is shown every letter ENGRAM_DLQ holds, each with its organization, as
    many as the lag's stream count; the organization's own operator only its two; another
    organization's none; only the deployment's operator sees the lag."""
    start = await _dlq_last_seq(observer_nc)
    missing = json.dumps({k: v for k, v in session_payload(org, agent).items() if k != "status"}).encode()
    await publish_session(nc, missing, service_token)
    await publish_session(nc, b"[]", service_token)
    await publish_session(nc, session_payload(org, agent), None)
    await publish_session(nc, session_payload(org, agent), "garbage")

    async def all_four() -> bool:
        return await _dlq_last_seq(observer_nc) >= start + 4

    await eventually(all_four, what="four dead letters")
    dev = DevIdentity(org, agent, TEST_KID, TEST_SECRET).service_token()
    page = await request(nc, OPS_DEAD_LETTERS, {"limit": 500}, dev)
    lag = await request(nc, OPS_LAG, {}, dev)
    stream = {s["stream"]: s for s in lag["streams"]}["ENGRAM_DLQ"]
    assert len(page["letters"]) == stream["messages"], (len(page["letters"]), stream)
    newest = {letter["seq"]: letter["org_id"] for letter in page["letters"] if letter["seq"] > start}
    assert sorted(newest.values()) == sorted([str(org)] * 2 + [str(SYSTEM_ORG)] * 2), newest
    assert page["next_before_seq"] is None

    own = await request(nc, OPS_DEAD_LETTERS, {}, service_token)
    assert {letter["org_id"] for letter in own["letters"]} == {str(org)}
    assert len(own["letters"]) == 2
    foreign = tokens.mint(
        org_id=uuid4(), principal=Principal(kind="service", id="ops"), permissions=ALL_PERMISSIONS
    )
    assert (await request(nc, OPS_DEAD_LETTERS, {}, foreign))["letters"] == []
    assert (await request(nc, OPS_LAG, {}, service_token))["error"]["code"] == "FORBIDDEN"
    assert "messages" in (await request(nc, OPS_LAG, {}, _operator(tokens)))["streams"][0]


async def test_end_users_and_restricted_tokens_are_refused(
    engram: Infra, nc: Client, tokens: TokenService, org: UUID, agent: UUID
) -> None:
    """Neither is shown dead letters or lag, whatever permissions the token lists (the deployment's
    operator's included)."""
    end_user = tokens.mint(
        org_id=org, principal=Principal(kind="end_user", id="alice"), permissions=ALL_PERMISSIONS
    )
    reader = tokens.mint(
        org_id=org, principal=Principal(kind="service", id="ro"), permissions={"memory.read"}
    )
    one_agent = tokens.mint(
        org_id=org,
        principal=Principal(kind="service", id="a"),
        permissions=ALL_PERMISSIONS | {OPERATOR},
        agent_config_id=agent,
    )
    end_user_operator = tokens.mint(
        org_id=org, principal=Principal(kind="end_user", id="eve"), permissions=ALL_PERMISSIONS | {OPERATOR}
    )
    for subject in (OPS_DEAD_LETTERS, OPS_LAG):
        for token in (end_user, reader, one_agent, end_user_operator):
            reply = await request(nc, subject, {}, token)
            assert reply["error"]["code"] == "FORBIDDEN", (subject, reply)
    bad = await request(
        nc,
        OPS_DEAD_LETTERS,
        {"source": "a.>"},
        tokens.mint(org_id=org, principal=Principal(kind="service", id="x"), permissions=ALL_PERMISSIONS),
    )
    assert bad["error"]["code"] == "INVALID_REQUEST"


async def test_lag_counts_streams_and_durable_consumers(
    engram: Infra,
    nc: Client,
    observer_nc: Client,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    service_token: str,
) -> None:
    await publish_session(nc, session_payload(org, agent), service_token)
    operator = _operator(tokens)
    reply = await request(nc, OPS_LAG, {}, operator)
    streams = {s["stream"]: s for s in reply["streams"]}
    assert set(streams) == {"ENGRAM_SESSIONS", "ENGRAM_MEMORY", "ENGRAM_AUDIT", "ENGRAM_DLQ", "ENGRAM_FEED"}
    sessions = (await observer_nc.jetstream().stream_info("ENGRAM_SESSIONS")).state
    assert 0 < streams["ENGRAM_SESSIONS"]["last_seq"] <= sessions.last_seq

    async def ingest_caught_up() -> bool:
        lag = await request(nc, OPS_LAG, {}, operator)
        ingest = {(c["stream"], c["durable"]): c for c in lag["consumers"]}[("ENGRAM_SESSIONS", "ingest")]
        return bool(ingest["num_pending"] == ingest["num_ack_pending"] == 0)

    await eventually(ingest_caught_up, what="the ingest consumer's lag back to 0")
