"""The audit log (SPEC 7.4): append-only, hash-chained per organization.

Each record carries the previous record's hash; the hash covers every field, so altering,
deleting or reordering a row breaks the chain at that row. ``audit_heads`` holds each chain's
newest link and is locked while appending, which serializes appends per organization. So that
this serialization costs little, :func:`append` is the *last* thing a writer does before it
commits: the chain lock is held only for the audit rows and the commit, and since a holder never
waits for any other lock, it cannot be part of a deadlock.
Records are also published on ``engram.audit.<kind>`` through the outbox.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import col

from contracts.common import SYSTEM_ORG
from contracts.events import AuditEvent
from contracts.subjects import audit_subject
from shared.observability.metrics import AUDIT_RECORDS, AUDIT_VERIFICATIONS, on_commit
from shared.runtime.time import utcnow
from shared.storage.db.models import AUDIT_HEADS, AUDIT_LOG, AuditHead, AuditRecord
from shared.storage.outbox import enqueue_many

__all__ = [
    "GENESIS",
    "SYSTEM_ORG",
    "AuditEntry",
    "ChainReport",
    "append",
    "lock_chain",
    "record_hash",
    "verify",
]

GENESIS = "0" * 64
# Records about input whose organization cannot be trusted (no valid token) go to the chain of
# SYSTEM_ORG, so an attacker cannot write into a real organization's trail by naming it.


# Built once: every writer's transaction ends with these.
_RECORD_INSERT = insert(AUDIT_LOG)
_LOCK = pg_insert(AUDIT_HEADS)
_HEAD_LOCK = _LOCK.on_conflict_do_update(
    index_elements=["org_id"], set_={"org_id": _LOCK.excluded.org_id}
).returning(AUDIT_HEADS.c.seq, AUDIT_HEADS.c.hash)
_HEAD_UPDATE = (
    update(AUDIT_HEADS)
    .where(AUDIT_HEADS.c.org_id == bindparam("org"))
    .values(seq=bindparam("seq"), hash=bindparam("hash"))
)


@dataclass(frozen=True)
class AuditEntry:
    kind: str
    actor_ref: str | None = None
    agent_config_id: UUID | None = None
    session_id: str | None = None
    entry_ids: Sequence[UUID | str] = ()
    details: dict[str, Any] | None = None


def _canonical_time(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def record_hash(record: AuditRecord) -> str:
    """sha256 over the canonical JSON of every field but the hash itself."""
    body = {
        "org_id": str(record.org_id),
        "seq": record.seq,
        "id": str(record.id),
        "kind": record.kind,
        "occurred_at": _canonical_time(record.occurred_at),
        "actor_ref": record.actor_ref,
        "agent_config_id": str(record.agent_config_id) if record.agent_config_id else None,
        "session_id": record.session_id,
        "entry_ids": list(record.entry_ids),
        "details": record.details,
        "prev_hash": record.prev_hash,
    }
    encoded = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


async def lock_chain(session: AsyncSession, org_id: UUID) -> tuple[int, str]:
    """Take (creating if needed) the organization's chain head, locked until commit; returns
    its ``(seq, hash)``. One statement: the no-op update takes the row lock and returns it."""
    row = (await session.execute(_HEAD_LOCK, {"org_id": org_id, "seq": 0, "hash": GENESIS})).one()
    return int(row[0]), str(row[1])


async def append(session: AsyncSession, org_id: UUID, entries: Sequence[AuditEntry]) -> list[AuditRecord]:
    """Append records to the organization's chain and queue them for ``engram.audit.<kind>``."""
    if not entries:
        return []
    seq, prev_hash = await lock_chain(session, org_id)
    out: list[AuditRecord] = []
    for entry in entries:
        seq += 1
        record = AuditRecord(
            org_id=org_id,
            seq=seq,
            id=uuid4(),
            kind=entry.kind,
            occurred_at=utcnow(),
            actor_ref=entry.actor_ref,
            agent_config_id=entry.agent_config_id,
            session_id=entry.session_id,
            entry_ids=[str(i) for i in entry.entry_ids],
            details=dict(entry.details or {}),
            prev_hash=prev_hash,
            hash="",
        )
        record.hash = prev_hash = record_hash(record)
        out.append(record)
    await session.execute(_RECORD_INSERT, [r.model_dump() for r in out])
    # One statement for the batch (recall's side effects append a few hundred at a time).
    await enqueue_many(session, [(audit_subject(r.kind), to_event(r), r.id, None) for r in out])
    await session.execute(_HEAD_UPDATE, {"org": org_id, "seq": seq, "hash": prev_hash})
    on_commit(session, lambda: AUDIT_RECORDS.inc(len(out)))
    return out


def to_event(record: AuditRecord) -> AuditEvent:
    return AuditEvent(
        event_id=record.id,
        occurred_at=record.occurred_at,
        org_id=record.org_id,
        seq=record.seq,
        kind=record.kind,
        actor_ref=record.actor_ref,
        agent_config_id=record.agent_config_id,
        session_id=record.session_id,
        entry_ids=[UUID(i) for i in record.entry_ids],
        details=record.details,
        prev_hash=record.prev_hash,
        hash=record.hash,
    )


@dataclass(frozen=True)
class ChainReport:
    ok: bool
    checked: int
    broken_seq: int | None = None
    broken_id: UUID | None = None
    reason: str | None = None


#: Walks of newly appended records before a check under constant appends settles for what it saw.
_VERIFY_PASSES = 20


@dataclass
class _Walk:
    """How far a verification got: the next expected link."""

    prev: str = GENESIS
    last_seq: int = 0
    checked: int = 0

    async def on(self, session: AsyncSession, org_id: UUID, chunk: int) -> ChainReport | None:
        """Check every record after ``last_seq``; a report when one is broken, else None."""
        while True:
            query = select(AuditRecord).where(
                col(AuditRecord.org_id) == org_id, col(AuditRecord.seq) > self.last_seq
            )
            rows = (await session.execute(query.order_by(col(AuditRecord.seq)).limit(chunk))).scalars().all()
            for row in rows:
                self.checked += 1
                expected = self.last_seq + 1
                if row.seq != expected:
                    return ChainReport(False, self.checked, expected, None, f"record {expected} is missing")
                if row.prev_hash != self.prev:
                    return self._broken(row, "does not link to the previous record")
                if record_hash(row) != row.hash:
                    return self._broken(row, "content does not match its hash")
                self.prev, self.last_seq = row.hash, row.seq
            if len(rows) < chunk:
                return None

    def _broken(self, row: AuditRecord, reason: str) -> ChainReport:
        return ChainReport(False, self.checked, row.seq, row.id, reason)


async def verify(session: AsyncSession, org_id: UUID, *, chunk: int = 1000) -> ChainReport:
    """Walk the chain in order and report the first record that does not link or hash (counted
    in ``engram_audit_verifications_total`` by result: a failure is what an operator alerts on)."""
    report = await _verify(session, org_id, chunk)
    AUDIT_VERIFICATIONS.labels("ok" if report.ok else "failed").inc()
    return report


async def _verify(session: AsyncSession, org_id: UUID, chunk: int) -> ChainReport:
    """The walk behind :func:`verify`.

    Appends go on while the walk runs (read committed). A record and the head that counts it
    commit together, so a head read after the walk that is *ahead* of it means newer records:
    walk on to them. A head *behind* the walk means records nobody appended through the chain."""
    walk = _Walk()
    for _ in range(_VERIFY_PASSES):
        broken = await walk.on(session, org_id, chunk)
        if broken is not None:
            return broken
        head = await session.get(AuditHead, org_id, populate_existing=True)
        if head is None or (head.seq == walk.last_seq and head.hash == walk.prev):
            return ChainReport(True, walk.checked)
        if head.seq < walk.last_seq:
            return ChainReport(False, walk.checked, head.seq + 1, None, "records beyond the chain's head")
        if head.seq == walk.last_seq:
            return ChainReport(False, walk.checked, head.seq, None, "the last record does not match the head")
        # The head is ahead: appended during the walk (walk on), or removed from the end.
        newer = await session.execute(
            select(func.count())
            .select_from(AuditRecord)
            .where(col(AuditRecord.org_id) == org_id, col(AuditRecord.seq) > walk.last_seq)
        )
        if newer.scalar_one() == 0:
            return ChainReport(
                False, walk.checked, walk.last_seq + 1, None, "records after this one were removed"
            )
    return ChainReport(True, walk.checked)
