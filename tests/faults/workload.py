"""The fault tests' workload and ledger: sessions a platform would publish, the lessons they must
produce (from the built-in distiller's rules), and counts of what was lost or done twice."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import nats.errors
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy
from sqlalchemy import func, select, text

from contracts.events import SessionEnded
from contracts.subjects import MEMORY_WRITTEN
from shared.adapters.distillers.builtin import distill_session
from shared.storage import audit
from shared.storage.config_store import put_config
from shared.storage.db.engine import Database
from shared.storage.db.models import AuditRecord, MemoryEntry
from shared.text.policy import normalize
from tests.platform import publish_session, session_payload

__all__ = [
    "Ledger",
    "audit_count",
    "expected_lessons",
    "ledger",
    "outbox_size",
    "publish_all",
    "raise_cap",
    "saved_and_reinforced",
    "sessions",
    "written_events",
]

OWNERS = [
    {"kind": "end_user", "id": "alice"},
    {"kind": "end_user", "id": "bob"},
    {"kind": "actor", "id": "carol"},
    {"kind": "none"},
]


def sessions(org: UUID, agent: UUID, indexes: Iterable[int]) -> list[dict[str, Any]]:
    """One session per index; failures repeat across sessions so reinforcement happens, owners rotate."""
    out = []
    for i in indexes:
        trace = [
            {"tool": "search_kb", "input": {"q": f"topic {i}"}, "output": "3 hits"},
            {"tool": "deploy", "input": {"env": "staging"}, "error": f"quota exceeded in region r{i % 7}"},
        ]
        transcript = [{"role": "user", "content": f"Remember: ticket {i} must be closed by Friday."}]
        out.append(
            session_payload(
                org,
                agent,
                principal=OWNERS[i % len(OWNERS)],
                tool_trace=trace,
                transcript=transcript,
                task=f"Task {i}",
                session_id=f"s-{i}",
            )
        )
    return out


async def raise_cap(db: Database, org: UUID, agent: UUID) -> None:
    """Lift the agent config's max_entries (default 500) above what the workload stores, so that
    pruning — correct behaviour — is not mistaken for loss."""
    async with db.transaction() as s:
        await put_config(s, org, agent, {"retention": {"max_entries": 100_000}}, by="test")


def expected_lessons(payloads: Iterable[dict[str, Any]]) -> Counter[tuple[str, str]]:
    """(owner, normalized lesson) → how many sessions produce it."""
    expected: Counter[tuple[str, str]] = Counter()
    for payload in payloads:
        session = SessionEnded.model_validate(payload)
        owner = "" if session.principal.kind == "none" else session.principal.ref
        for lesson in distill_session(session):
            expected[(owner, normalize(lesson.text))] += 1
    return expected


async def publish_all(nc: Client, payloads: list[dict[str, Any]], token: str, *, attempts: int = 20) -> int:
    """Publish and retry until JetStream acknowledges each one, as a platform would across a NATS
    outage (a retry whose first attempt was stored after all is dropped by ingest's inbox).
    Returns how many attempts failed (the platform's failed requests)."""
    failed = 0

    async def one(payload: dict[str, Any]) -> None:
        nonlocal failed
        for attempt in range(attempts):
            try:
                await publish_session(nc, payload, token)
                return
            except (
                nats.errors.TimeoutError,
                nats.errors.NoRespondersError,
                nats.errors.ConnectionClosedError,
            ):
                failed += 1
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(0.5)

    await asyncio.gather(*(one(p) for p in payloads))
    return failed


async def audit_count(db: Database, org: UUID, kind: str) -> int:
    async with db.read() as s:
        query = (
            select(func.count())
            .select_from(AuditRecord)
            .where(
                AuditRecord.org_id == org,  # type: ignore[arg-type]
                AuditRecord.kind == kind,  # type: ignore[arg-type]
            )
        )
        return int((await s.execute(query)).scalar_one())


async def outbox_size(db: Database) -> int:
    async with db.read() as s:
        return int((await s.execute(text("SELECT count(*) FROM outbox"))).scalar_one())


async def written_events(nc: Client, org: UUID, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Every ``engram.memory.written`` event of ``org`` in ENGRAM_MEMORY, read from the start with an
    ephemeral pull consumer (duplicates included: that is what is being counted)."""
    js = nc.jetstream()
    sub = await js.pull_subscribe(
        MEMORY_WRITTEN,
        stream="ENGRAM_MEMORY",
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, inactive_threshold=30.0),
    )
    events: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while True:
            info = await sub.consumer_info()
            if info.num_pending == 0 and info.num_ack_pending == 0:
                return events
            if loop.time() > deadline:
                raise AssertionError(f"could not read ENGRAM_MEMORY to the end in {timeout}s")
            try:
                msgs = await sub.fetch(256, timeout=2.0)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            for msg in msgs:
                event = json.loads(msg.data)
                if event["org_id"] == str(org):
                    events.append(event)
                await msg.ack()
    finally:
        await sub.unsubscribe()


@dataclass
class Ledger:
    """What a run left behind, as counts of lost and duplicated effects (both must be zero)."""

    lost: list[tuple[str, str]] = field(default_factory=list)
    duplicated: list[tuple[str, str]] = field(default_factory=list)
    unexpected: list[tuple[str, str]] = field(default_factory=list)
    #: (owner, lesson, expected reinforcement, actual) for every lesson reinforced wrongly.
    miscounted: list[tuple[str, str, int, int]] = field(default_factory=list)
    completed: int = 0
    chain_ok: bool = False
    chain_reason: str | None = None

    def summary(self) -> str:
        return (
            f"lost={len(self.lost)} duplicated={len(self.duplicated)} unexpected={len(self.unexpected)} "
            f"miscounted={len(self.miscounted)} distill.completed={self.completed} "
            f"chain_ok={self.chain_ok} ({self.chain_reason})"
        )


async def ledger(db: Database, org: UUID, expected: Counter[tuple[str, str]]) -> Ledger:
    """Compare the org's stored lessons and audit chain with what the sessions must produce."""
    async with db.read() as s:
        rows = list((await s.execute(select(MemoryEntry).where(MemoryEntry.org_id == org))).scalars())  # type: ignore[arg-type]
        report = await audit.verify(s, org)
    got = Counter((r.owner_key, normalize(r.text)) for r in rows)
    out = Ledger(chain_ok=report.ok, chain_reason=report.reason)
    out.lost = sorted(set(expected) - set(got))
    out.unexpected = sorted(set(got) - set(expected))
    out.duplicated = sorted(key for key, n in got.items() if n > 1)
    for row in rows:
        key = (row.owner_key, normalize(row.text))
        if key in expected and row.reinforcement_count != expected[key] - 1:
            out.miscounted.append((*key, expected[key] - 1, row.reinforcement_count))
    out.completed = await audit_count(db, org, "distill.completed")
    return out


async def saved_and_reinforced(db: Database, org: UUID) -> int:
    """saved + reinforced over every ``memory.saved`` audit record of the org."""
    async with db.read() as s:
        details = (
            await s.execute(
                select(AuditRecord.details).where(
                    AuditRecord.org_id == org,
                    AuditRecord.kind == "memory.saved",
                )
            )
        ).scalars()
        return sum(int(d["saved"]) + int(d["reinforced"]) for d in details)
