"""Text that no store can keep (U+0000, lone surrogates) and JSON nested too deep, through the
real services: refused at the edge with INVALID_REQUEST or dead-lettered on first delivery; and a
message that fails on its own inside a consumer — such text already in a stream from before this
rule — ends in the dead-letter stream after ``max_deliver`` deliveries instead of being
redelivered forever. Nothing stays pending."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID, uuid4

import pytest
from nats.aio.client import Client
from sqlalchemy import func, select

from contracts.subjects import MEMORY_SAVE_ACCEPTED
from shared.service.infra import Infra
from shared.storage import audit
from shared.storage.db.engine import Database
from shared.storage.db.models import ENTRIES, AuditRecord
from tests.platform import eventually, publish_session, request, session_payload

pytestmark = pytest.mark.integration

ALICE = {"kind": "end_user", "id": "alice"}


async def _entries(db: Database, org: UUID) -> int:
    async with db.read() as s:
        return int((await s.execute(select(func.count()).where(ENTRIES.c.org_id == org))).scalar_one())


async def _audited(db: Database, org: UUID, kind: str) -> list[dict[str, Any]]:
    async with db.read() as s:
        rows = await s.execute(
            select(AuditRecord.details).where(AuditRecord.org_id == org, AuditRecord.kind == kind)
        )
        return [dict(d) for d in rows.scalars()]


async def _drained(observer_nc: Client, durable: str) -> None:
    """Wait until ``durable`` on ENGRAM_SESSIONS holds nothing undelivered or unacknowledged."""
    js = observer_nc.jetstream()
    seen: list[tuple[int, int]] = []

    async def empty() -> bool:
        info = await js.consumer_info("ENGRAM_SESSIONS", durable)
        seen.append((info.num_pending, info.num_ack_pending))
        return seen[-1] == (0, 0)

    await eventually(
        empty, timeout=60, what=f"{durable}: nothing pending (last pending, unacked: {seen[-1:]})"
    )


@pytest.mark.parametrize(
    "entry",
    [
        {"text": "a \x00 b"},
        {"text": "lone \ud800 surrogate"},
        {"text": "fine", "metadata": {"key\x00": "v"}},
        {"text": "fine", "metadata": {"k": ["x", {"v": "\x00"}]}},
        {"text": "fine", "memory_type": "pref\x00"},
    ],
)
async def test_a_save_with_unstorable_text_is_an_invalid_request(
    engram: Infra, nc: Client, db: Database, org: UUID, agent: UUID, service_token: str, entry: dict[str, Any]
) -> None:
    """memory.save with NUL or a lone surrogate in any field (metadata keys and values too) is
    refused at once, naming where, and saves nothing — not a 503 after 10 s and a stuck consumer."""
    payload = {"agent_config_id": str(agent), "principal": ALICE, "wait": True, "entries": [entry]}
    reply = await request(nc, "engram.memory.save", payload, service_token)
    assert reply["error"]["code"] == "INVALID_REQUEST", reply
    assert reply["error"]["details"]["loc"].startswith("entries.0."), reply
    assert await _entries(db, org) == 0


async def test_json_nested_5000_levels_is_an_invalid_request(
    engram: Infra, nc: Client, agent: UUID, service_token: str
) -> None:
    """A body of 5,000 nested objects answers a typed INVALID_REQUEST over NATS."""
    deep = b'{"a":' * 5000 + b"{}" + b"}" * 5000
    for subject in ("engram.memory.save", "engram.recall", "engram.config.put"):
        reply = await request(nc, subject, deep, service_token)
        assert reply["error"]["code"] == "INVALID_REQUEST", (subject, reply)


async def test_sessions_with_unstorable_text_are_dead_lettered_and_nothing_stays_pending(
    engram: Infra, nc: Client, observer_nc: Client, db: Database, org: UUID, agent: UUID, service_token: str
) -> None:
    """Sessions with NUL or a lone surrogate in task, tool_trace or transcript are dead-lettered
    on their first delivery with INVALID_REQUEST and an audit record; a valid session published
    between them is distilled; ingest and distill are left with nothing pending."""
    hostile = [
        {"task": "deploy \x00 now"},
        {"tool_trace": [{"tool": "deploy", "input": {"k": "\x00"}, "error": "boom"}]},
        {"tool_trace": [{"tool": "deploy", "output": "\ud800", "error": "boom"}]},
        {"tool_trace": [{"tool": "de\x00ploy", "error": "boom"}]},
        {"transcript": [{"role": "user", "content": "hi \x00"}]},
        {"transcript": [{"role": "user", "content": "\udc00"}]},
    ]
    good = session_payload(org, agent, tool_trace=[{"tool": "deploy", "error": "quota exceeded"}])
    for i, overrides in enumerate(hostile):
        await publish_session(nc, session_payload(org, agent, **overrides), service_token)
        if i == len(hostile) // 2:
            await publish_session(nc, good, service_token)

    async def all_rejected() -> bool:
        return len(await _audited(db, org, "session.rejected")) >= len(hostile)

    await eventually(all_rejected, timeout=60, what=f"{len(hostile)} session.rejected records")
    rejected = await _audited(db, org, "session.rejected")
    assert {r["code"] for r in rejected} == {"INVALID_REQUEST"}
    assert all(r["deliveries"] == 1 for r in rejected), rejected

    async def distilled() -> bool:
        return any(
            r.get("event_id") == good["event_id"] for r in await _audited(db, org, "distill.completed")
        )

    await eventually(distilled, timeout=60, what="the valid session distilled")
    await _drained(observer_nc, "ingest")
    await _drained(observer_nc, "distill")


async def test_a_save_that_fails_in_postgres_is_dead_lettered_after_max_deliver(
    engram: Infra, nc: Client, observer_nc: Client, db: Database, org: UUID, agent: UUID, service_token: str
) -> None:
    """An accepted save holding a NUL — as one already in the stream before the edge refused them —
    fails in Postgres on every delivery: after ``max_deliver`` deliveries it is dead-lettered
    (INTERNAL, the failure's kind, an audit record) and acknowledged, instead of being redelivered
    forever; saves beside it are stored."""
    request_id = uuid4()
    poisoned = {
        "request_id": str(request_id),
        "org_id": str(org),
        "agent_config_id": str(agent),
        "owner": ALICE,
        "entries": [{"text": "a \x00 b"}],
        "requested_by": "service:runner",
    }
    body = json.dumps(poisoned).encode()
    # Published and signed as ingest would have, before the edge refused such text.
    stored = await engram.js.publish(
        MEMORY_SAVE_ACCEPTED, body, headers=engram.signer.sign(MEMORY_SAVE_ACCEPTED, body)
    )
    fine = {"agent_config_id": str(agent), "principal": ALICE, "wait": True, "content": "Alice likes tea."}
    assert (await request(nc, "engram.memory.save", fine, service_token))["saved"] == 1

    letters: list[dict[str, Any]] = []

    async def rejected() -> bool:
        letters[:] = [
            r
            for r in await _audited(db, audit.SYSTEM_ORG, "save.rejected")
            if r["delivery"].startswith(f"ENGRAM_SESSIONS:{stored.seq}:")
        ]
        return bool(letters)

    await eventually(rejected, timeout=60, what="the poisoned save dead-lettered")
    [letter] = letters
    assert letter["code"] == "INTERNAL"
    assert letter["deliveries"] == engram.settings.max_deliver

    await _drained(observer_nc, "distill-saves")
    assert await _entries(db, org) == 1
