"""``engram.ops.dead_letters`` and ``engram.ops.lag`` against the real services: an operator sees
their organization's dead letters (with reasons, never the kept payload) and the pipeline's lag;
another organization and end users do not."""

from __future__ import annotations

import hashlib
import json
import secrets
from uuid import UUID, uuid4

import httpx
import pytest
from nats.aio.client import Client

from contracts.common import Principal
from contracts.subjects import OPS_DEAD_LETTERS, OPS_LAG
from shared.auth import ALL_PERMISSIONS, TokenService
from shared.infra import Infra
from tests.platform import eventually, publish_session, request, session_payload

pytestmark = pytest.mark.integration


async def _dlq_last_seq(nc: Client) -> int:
    return int((await nc.jetstream().stream_info("ENGRAM_DLQ")).state.last_seq)


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


async def test_end_users_and_restricted_tokens_are_refused(
    engram: Infra, nc: Client, tokens: TokenService, org: UUID, agent: UUID
) -> None:
    end_user = tokens.mint(
        org_id=org, principal=Principal(kind="end_user", id="alice"), permissions=ALL_PERMISSIONS
    )
    reader = tokens.mint(
        org_id=org, principal=Principal(kind="service", id="ro"), permissions={"memory.read"}
    )
    one_agent = tokens.mint(
        org_id=org,
        principal=Principal(kind="service", id="a"),
        permissions=ALL_PERMISSIONS,
        agent_config_id=agent,
    )
    for subject in (OPS_DEAD_LETTERS, OPS_LAG):
        for token in (end_user, reader, one_agent):
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
    engram: Infra, nc: Client, observer_nc: Client, org: UUID, agent: UUID, service_token: str
) -> None:
    await publish_session(nc, session_payload(org, agent), service_token)
    reply = await request(nc, OPS_LAG, {}, service_token)
    streams = {s["stream"]: s for s in reply["streams"]}
    assert set(streams) == {"ENGRAM_SESSIONS", "ENGRAM_MEMORY", "ENGRAM_AUDIT", "ENGRAM_DLQ"}
    sessions = (await observer_nc.jetstream().stream_info("ENGRAM_SESSIONS")).state
    assert 0 < streams["ENGRAM_SESSIONS"]["last_seq"] <= sessions.last_seq

    async def ingest_caught_up() -> bool:
        lag = await request(nc, OPS_LAG, {}, service_token)
        ingest = {(c["stream"], c["durable"]): c for c in lag["consumers"]}[("ENGRAM_SESSIONS", "ingest")]
        return bool(ingest["num_pending"] == ingest["num_ack_pending"] == 0)

    await eventually(ingest_caught_up, what="the ingest consumer's lag back to 0")
