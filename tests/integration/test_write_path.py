"""The write path as a platform sees it: raw nats-py publishes in, lessons in Postgres out."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from sqlalchemy import func, select

from services.cli.demo_data import demo_sessions
from services.distill.sessions import CONSUMER, handle_validated_sessions
from services.ingest import sessions as ingest
from shared.adapters.distillers.builtin import BuiltinDistiller
from shared.service.consumer import Batch, consume
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from shared.storage.db.models import INBOX, AuditRecord, MemoryEntry
from shared.text.policy import normalize
from tests.faults.workload import expected_lessons, sessions
from tests.platform import eventually, publish_session, request, session_payload
from tests.stored_text import artefacts, readme_http_trace

pytestmark = pytest.mark.integration

N_SESSIONS = 200


def _sessions(org: UUID, agent: UUID) -> list[dict[str, Any]]:
    """200 sessions; failures repeat across sessions so reinforcement happens, owners rotate."""
    return sessions(org, agent, range(N_SESSIONS))


async def _rows(db: Database, org: UUID) -> list[MemoryEntry]:
    async with db.read() as s:
        return list((await s.execute(select(MemoryEntry).where(MemoryEntry.org_id == org))).scalars())  # type: ignore[arg-type]


async def _audit_count(db: Database, org: UUID, kind: str) -> int:
    async with db.read() as s:
        return int(
            (
                await s.execute(
                    select(func.count())
                    .select_from(AuditRecord)
                    .where(AuditRecord.org_id == org, AuditRecord.kind == kind)
                )
            ).scalar_one()
        )  # type: ignore[arg-type]


async def test_200_sessions_give_each_expected_lesson_exactly_once(
    engram: Infra,
    nc: Client,
    observer_nc: Client,
    db: Database,
    org: UUID,
    agent: UUID,
    service_token: str,
) -> None:
    """200 published sessions produce every expected lesson once per owner, reinforced by repeats;
    publishing them all again — with and without a Nats-Msg-Id — changes nothing."""
    sessions = _sessions(org, agent)
    await asyncio.gather(*(publish_session(nc, s, service_token) for s in sessions))

    async def all_distilled() -> bool:
        return await _audit_count(db, org, "distill.completed") == N_SESSIONS

    await eventually(all_distilled, timeout=120, what="200 sessions distilled")
    expected = expected_lessons(sessions)
    rows = await _rows(db, org)
    got = Counter((r.owner_key, normalize(r.text)) for r in rows)
    assert set(got) == set(expected)
    assert all(count == 1 for count in got.values()), "a lesson was stored twice"
    for row in rows:
        assert row.reinforcement_count == expected[(row.owner_key, normalize(row.text))] - 1
    snapshot = sorted((r.id, r.reinforcement_count, r.importance) for r in rows)

    # Again, with a Nats-Msg-Id and without: ingest's inbox drops them either way (JetStream's
    # duplicate window on ENGRAM_SESSIONS is 100 ms, relied on by nothing).
    await asyncio.gather(*(publish_session(nc, s, service_token, msg_id=s["event_id"]) for s in sessions))
    await asyncio.gather(*(publish_session(nc, s, service_token) for s in sessions))
    info = await observer_nc.jetstream().consumer_info("ENGRAM_SESSIONS", "ingest")

    async def ingest_drained() -> bool:
        ci = await observer_nc.jetstream().consumer_info("ENGRAM_SESSIONS", "ingest")
        return ci.num_pending == 0 and ci.num_ack_pending == 0

    await eventually(ingest_drained, what="ingest consumed the duplicates")
    assert info.delivered.stream_seq >= N_SESSIONS
    await asyncio.sleep(0.5)
    after = sorted((r.id, r.reinforcement_count, r.importance) for r in await _rows(db, org))
    assert after == snapshot
    assert await _audit_count(db, org, "distill.completed") == N_SESSIONS


async def test_every_stored_entry_has_one_written_event(
    engram: Infra,
    nc: Client,
    observer_nc: Client,
    db: Database,
    org: UUID,
    agent: UUID,
    service_token: str,
) -> None:
    """Each stored or reinforced lesson is announced once on engram.memory.written, with no text."""
    sessions = _sessions(org, agent)[:12]
    events: list[dict[str, object]] = []

    async def collect(msg: Msg) -> None:
        event = json.loads(msg.data)
        if event["org_id"] == str(org):
            events.append(event)

    sub = await observer_nc.subscribe("engram.memory.written", cb=collect)
    await asyncio.gather(*(publish_session(nc, s, service_token) for s in sessions))
    expected_events = sum(expected_lessons(sessions).values())

    async def all_events() -> bool:
        return len(events) >= expected_events

    await eventually(all_events, what=f"{expected_events} memory.written events")
    await asyncio.sleep(0.3)
    await sub.unsubscribe()
    assert len(events) == expected_events
    assert len({e["event_id"] for e in events}) == expected_events
    assert all("text" not in e for e in events)
    texts = {r.text for r in await _rows(db, org)}
    assert not any(t in json.dumps(events) for t in texts)


async def test_gate_skips_are_audited_not_errors(
    engram: Infra, nc: Client, db: Database, org: UUID, agent: UUID, service_token: str
) -> None:
    """cancelled, timeout and one-step sessions are skipped with a reason in the audit log."""
    trace = [{"tool": "deploy", "input": {}, "error": "boom"}]
    skipped = [
        session_payload(org, agent, status="cancelled", tool_trace=trace),
        session_payload(org, agent, status="timeout", tool_trace=trace),
        session_payload(org, agent, steps=1, tool_trace=trace),
    ]
    await asyncio.gather(*(publish_session(nc, s, service_token) for s in skipped))

    async def all_skipped() -> bool:
        return await _audit_count(db, org, "distill.skipped") == 3

    await eventually(all_skipped, what="three skips")
    async with db.read() as s:
        reasons = sorted(
            r.details["reason"]
            for r in (
                await s.execute(
                    select(AuditRecord).where(
                        AuditRecord.org_id == org, AuditRecord.kind == "distill.skipped"
                    )
                )
            ).scalars()
        )  # type: ignore[arg-type]
    assert reasons == ["status_cancelled", "status_timeout", "too_few_steps"]
    assert await _rows(db, org) == []


async def test_secrets_in_traces_are_redacted_before_storage(
    engram: Infra, nc: Client, db: Database, org: UUID, agent: UUID, service_token: str
) -> None:
    """An e-mail and an API key in a failing call's error never reach Postgres unredacted."""
    trace = [
        {
            "tool": "send_email",
            "input": {},
            "error": "SMTP 550 for jane.doe@example.com key AKIAIOSFODNN7EXAMPLE",
        }
    ]
    await publish_session(nc, session_payload(org, agent, tool_trace=trace), service_token)

    async def stored() -> bool:
        return bool(await _rows(db, org))

    await eventually(stored, what="a lesson")
    for row in await _rows(db, org):
        assert "jane.doe@example.com" not in row.text
        assert "AKIAIOSFODNN7EXAMPLE" not in row.text
    assert any("[EMAIL]" in r.text for r in await _rows(db, org))


async def test_the_readme_and_demo_sessions_are_stored_without_artefacts(
    engram: Infra, nc: Client, db: Database, org: UUID, agent: UUID, service_token: str
) -> None:
    """The README's HTTP example session and the demo's sessions, with observations kept as the
    demo keeps them, leave no literal null and no lesson ending on a placeholder in Postgres."""
    config = {"agent_config_id": str(agent), "config": {"keep_observations": True}}
    assert "error" not in await request(nc, "engram.config.put", config, service_token)
    readme = session_payload(
        org, agent, session_id="run-43", status="failed", steps=2, tool_trace=readme_http_trace()
    )
    del readme["task"]  # as the README sends it
    demo = demo_sessions(org, agent, org, agent, now=datetime.now(UTC))
    # Fresh event ids: the demo's are fixed, and another test may have published them already.
    published = [readme, *({**s, "event_id": str(uuid4())} for s in demo)]
    await asyncio.gather(*(publish_session(nc, s, service_token) for s in published))

    async def all_distilled() -> bool:
        done = [await _audit_count(db, org, kind) for kind in ("distill.completed", "distill.skipped")]
        return sum(done) == len(published)

    await eventually(all_distilled, timeout=120, what=f"{len(published)} sessions distilled or skipped")
    rows = await _rows(db, org)
    assert "refund_payment() error: card declined" in {r.text for r in rows if r.session_id == "run-43"}
    assert any(r.redaction for r in rows)  # redaction still happens
    found = {r.text: artefacts(r.text, sentence=r.layer == "memory") for r in rows}
    assert {text: problems for text, problems in found.items() if problems} == {}


async def test_one_event_twice_in_a_batch_takes_effect_once(
    engram: Infra, observer_nc: Client, db: Database, org: UUID, agent: UUID
) -> None:
    """The same validated session delivered three times in ONE distill batch (as after a
    reconnect, or a re-forward after a crash) is saved once, not reinforced by itself, and every
    copy is acked."""
    payload = _sessions(org, agent)[0]
    body = json.dumps(payload).encode()
    js = observer_nc.jetstream()
    stream, subject = f"DUP_{uuid4().hex[:8]}", f"test.dup.{uuid4().hex[:8]}"
    await js.add_stream(name=stream, subjects=[subject])
    try:
        for _ in range(3):
            await js.publish(subject, body)
        sub = await js.pull_subscribe(subject, stream=stream)
        copies = await sub.fetch(3, timeout=5)
        assert len(copies) == 3
        # The distill handler itself, handed the batch exactly as its pull consumer would.
        batch = Batch(engram, copies, consumer=CONSUMER, source="distill")
        await consume(batch, lambda b: handle_validated_sessions(engram, BuiltinDistiller(), b))
        assert await _audit_count(db, org, "distill.completed") == 1
        rows = await _rows(db, org)
        assert rows
        assert all(r.reinforcement_count == 0 for r in rows)
        info = await js.consumer_info(stream, sub._consumer)
        assert info.num_ack_pending == 0
    finally:
        await js.delete_stream(stream)


async def test_one_session_twice_in_an_ingest_batch_is_forwarded_once(
    engram: Infra, observer_nc: Client, db: Database, org: UUID, agent: UUID, service_token: str
) -> None:
    """The same session three times in ONE ingest batch (a platform's retry next to its original:
    no Nats-Msg-Id makes JetStream drop it) is handed to distill once and claimed once; every copy
    is acked."""
    payload = _sessions(org, agent)[0]
    body = json.dumps(payload).encode()
    forwards: list[Msg] = []

    async def on_forward(msg: Msg) -> None:
        if json.loads(msg.data)["event_id"] == payload["event_id"]:
            forwards.append(msg)

    watch = await observer_nc.subscribe("engram.session.validated", cb=on_forward)
    js = observer_nc.jetstream()
    stream, subject = f"DUP_{uuid4().hex[:8]}", f"test.dup.{uuid4().hex[:8]}"
    await js.add_stream(name=stream, subjects=[subject])
    try:
        for _ in range(3):
            await js.publish(subject, body, headers={"Authorization": f"Bearer {service_token}"})
        sub = await js.pull_subscribe(subject, stream=stream)
        copies = await sub.fetch(3, timeout=5)
        assert len(copies) == 3
        # ingest's handler itself, handed the batch exactly as its pull consumer would.
        batch = Batch(engram, copies, consumer=ingest.CONSUMER, source="session")
        await consume(batch, lambda b: ingest.handle_sessions_ended(engram, b))
        await observer_nc.flush()

        async def distilled() -> bool:
            return bool(forwards) and await _audit_count(db, org, "distill.completed") == 1

        await eventually(distilled, what="the session seen forwarded, and distilled")
        assert len(forwards) == 1, f"forwarded {len(forwards)} times"
        async with db.read() as s:
            claims = await s.execute(
                select(func.count())
                .select_from(INBOX)
                .where(INBOX.c.event_id == f"{org}/{payload['event_id']}")
            )
        assert claims.scalar_one() == 2  # ingest's row and distill's
        info = await js.consumer_info(stream, sub._consumer)
        assert info.num_ack_pending == 0
    finally:
        await watch.unsubscribe()
        await js.delete_stream(stream)
