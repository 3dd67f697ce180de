"""Bad input goes to the dead-letter stream with a reason and an audit record; the valid
sessions around it are processed as if nothing happened."""

from __future__ import annotations

import asyncio
import json
import secrets
from uuid import UUID, uuid4

import pytest
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy
from sqlalchemy import select

from contracts.common import Principal
from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.service.infra import Infra
from shared.storage import audit
from shared.storage.db.engine import Database
from shared.storage.db.models import AuditRecord
from tests.platform import eventually, publish_session, session_payload

pytestmark = pytest.mark.integration


async def _dead_letters(nc: Client, since_seq: int) -> list[dict[str, object]]:
    js = nc.jetstream()
    sub = await js.pull_subscribe(
        "engram.dlq.>",
        stream="ENGRAM_DLQ",
        config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=since_seq + 1),
    )
    letters: list[dict[str, object]] = []
    try:
        while True:
            try:
                msgs = await sub.fetch(100, timeout=0.5)
            except TimeoutError:
                break
            letters += [json.loads(m.data) for m in msgs]
    finally:
        await sub.unsubscribe()
    return letters


async def _dlq_last_seq(nc: Client) -> int:
    return int((await nc.jetstream().stream_info("ENGRAM_DLQ")).state.last_seq)


async def test_malformed_and_unauthorized_events_are_dead_lettered_with_reasons(
    engram: Infra,
    nc: Client,
    observer_nc: Client,
    db: Database,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    service_token: str,
) -> None:
    """Not-JSON, unknown schema_version, missing fields, oversize, missing/forged/expired/foreign
    tokens and acting for someone else each land in the DLQ with their code; valid ones pass."""
    start = await _dlq_last_seq(observer_nc)
    other_org = uuid4()
    forged = TokenService({"test-key": secrets.token_urlsafe(48)}).mint(
        org_id=org, principal=Principal(kind="service", id="x"), permissions=ALL_PERMISSIONS
    )
    expired = tokens.mint(
        org_id=org, principal=Principal(kind="service", id="x"), permissions=ALL_PERMISSIONS, ttl_seconds=-10
    )
    foreign = tokens.mint(
        org_id=other_org, principal=Principal(kind="service", id="x"), permissions=ALL_PERMISSIONS
    )
    alice = tokens.mint(
        org_id=org, principal=Principal(kind="end_user", id="alice"), permissions={"memory.write"}
    )
    read_only = tokens.mint(
        org_id=org, principal=Principal(kind="service", id="ro"), permissions={"memory.read"}
    )
    trace = [{"tool": "deploy", "input": {}, "error": "boom"}]

    def valid() -> dict[str, object]:
        return session_payload(org, agent, tool_trace=trace)

    bad: list[tuple[bytes | dict[str, object], str | None, str]] = [
        (b"{not json", service_token, "INVALID_REQUEST"),
        ({**valid(), "schema_version": 2}, service_token, "INVALID_REQUEST"),
        ({k: v for k, v in valid().items() if k != "status"}, service_token, "INVALID_REQUEST"),
        (
            {**valid(), "tool_trace": [{"tool": "x", "output": "y" * 600_000}]},
            service_token,
            "PAYLOAD_TOO_LARGE",
        ),
        (valid(), None, "UNAUTHENTICATED"),
        (valid(), "not-a-token", "UNAUTHENTICATED"),
        (valid(), forged, "UNAUTHENTICATED"),
        (valid(), expired, "UNAUTHENTICATED"),
        (valid(), foreign, "FORBIDDEN"),
        ({**valid(), "principal": {"kind": "end_user", "id": "bob"}}, alice, "FORBIDDEN"),
        (valid(), read_only, "FORBIDDEN"),
    ]
    good = [valid() for _ in range(10)]
    # Interleave: good, bad, good, bad, ...
    for i, (payload, token, _) in enumerate(bad):
        await publish_session(nc, good[i % len(good)], service_token)
        await publish_session(nc, payload, token, msg_id=None)
    for payload in good:
        await publish_session(nc, payload, service_token)

    async def settled() -> bool:
        return len(await _dead_letters(observer_nc, start)) >= len(bad)

    await eventually(settled, what="all bad events dead-lettered")

    async def distilled() -> bool:
        async with db.read() as s:
            rows = (
                (
                    await s.execute(
                        select(AuditRecord.details).where(
                            AuditRecord.org_id == org, AuditRecord.kind == "distill.completed"
                        )
                    )
                )
                .scalars()
                .all()
            )  # type: ignore[arg-type,call-overload]
        return {d["event_id"] for d in rows} == {g["event_id"] for g in good}

    await eventually(distilled, what="the 10 valid sessions distilled")
    letters = await _dead_letters(observer_nc, start)
    assert sorted(str(letter["code"]) for letter in letters) == sorted(code for _, _, code in bad)
    assert all(letter["reason"] and letter["original_b64"] for letter in letters)

    async with db.read() as s:
        rejected = (
            (await s.execute(select(AuditRecord).where(AuditRecord.kind == "session.rejected")))
            .scalars()
            .all()
        )
    mine = [r for r in rejected if r.org_id == org]
    system = [r for r in rejected if r.org_id == audit.SYSTEM_ORG]
    # Rejections with a verified token go to that org's chain; unverifiable ones to the system chain.
    assert len(mine) == 6
    assert len(system) >= 4
    assert not any(r.org_id == other_org for r in rejected if r.details.get("code") != "FORBIDDEN")


async def test_ingest_keeps_consuming_after_bad_input(
    engram: Infra, nc: Client, db: Database, org: UUID, agent: UUID, service_token: str
) -> None:
    """A burst of garbage does not stall the consumer: a valid session after it is distilled."""
    await asyncio.gather(
        *(publish_session(nc, bytes([i % 256]) * (i + 1), service_token, msg_id=None) for i in range(50))
    )
    payload = session_payload(org, agent, tool_trace=[{"tool": "t", "input": {}, "error": "e"}])
    await publish_session(nc, payload, service_token)

    async def done() -> bool:
        async with db.read() as s:
            rows = (
                (
                    await s.execute(
                        select(AuditRecord).where(
                            AuditRecord.org_id == org, AuditRecord.kind == "distill.completed"
                        )
                    )
                )
                .scalars()
                .all()
            )  # type: ignore[arg-type]
        return len(rows) == 1

    await eventually(done, what="the valid session after the garbage")


async def test_stream_retention_follows_settings(engram: Infra, observer_nc: Client) -> None:
    """ENGRAM_SESSIONS and ENGRAM_DLQ keep messages only as long as the settings say, and the
    sessions' duplicate window is the least nats-server allows (an id platforms choose decides
    nothing)."""
    sessions = await observer_nc.jetstream().stream_info("ENGRAM_SESSIONS")
    dlq = await observer_nc.jetstream().stream_info("ENGRAM_DLQ")
    assert sessions.config.max_age == engram.settings.session_retention_s
    assert dlq.config.max_age == engram.settings.dead_letter_retention_s
    assert sessions.config.duplicate_window == 0.1
