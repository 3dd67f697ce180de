"""The one save path (SPEC 4.3): every writer — distill, elective saves, observations — ends here.

Per entry: importance floor → type policy → write policy (PII, size, injection flag) →
normalize + fingerprint → owner-scoped upsert (insert, or reinforce the existing row) →
``memory.written`` in the outbox. Then the ``max_entries`` prune, then one audit record for the
outcome. The caller owns the transaction, so rows, outbox, inbox and audit commit together.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from sqlalchemy import delete, func, literal_column, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.common import Principal
from contracts.config import MemoryConfig
from contracts.events import MemoryPurged, MemoryWritten
from contracts.subjects import MEMORY_PURGED, MEMORY_WRITTEN
from shared import audit
from shared.db.models import ENTRIES
from shared.outbox import enqueue
from shared.policy import PolicyDecision, apply_write_policy, fingerprint
from shared.time import utcnow

__all__ = ["MIN_IMPORTANCE", "Draft", "SaveContext", "SaveResult", "owner_key", "save_entries"]

_INSERT = pg_insert(ENTRIES)
#: Insert, or — same owner scope, same fingerprint — reinforce: keep the higher importance and
#: count. One statement, built once, so racing writers still produce one row.
_UPSERT = _INSERT.on_conflict_do_update(
    index_elements=["org_id", "agent_config_id", "owner_key", "fingerprint"],
    index_where=text("lifecycle <> 'superseded'"),
    set_={
        "importance": func.greatest(ENTRIES.c.importance, _INSERT.excluded.importance),
        "reinforcement_count": ENTRIES.c.reinforcement_count + 1,
        "updated_at": _INSERT.excluded.updated_at,
    },
).returning(ENTRIES.c.id, literal_column("(xmax = 0)"), ENTRIES.c.version, ENTRIES.c.importance)

#: Entries below this importance are not worth remembering (SPEC 4.3: 0.09 skipped, 0.1 kept).
MIN_IMPORTANCE = 0.1


@dataclass(frozen=True)
class Draft:
    """An entry some writer wants stored; the save path decides what actually happens."""

    text: str
    importance: float
    memory_type: str
    layer: str = "memory"
    metadata: dict[str, Any] = field(default_factory=dict)
    confidence: float = 1.0


@dataclass(frozen=True)
class SaveContext:
    org_id: UUID
    agent_config_id: UUID
    owner: Principal | None
    session_id: str | None
    source: str
    #: who caused the write, for the audit record (``actor_ref`` of the verified caller).
    requested_by: str
    source_agent: str | None = None
    #: where the text came from (event or request id), kept with quarantined entries for review.
    provenance: dict[str, Any] = field(default_factory=dict)


@dataclass
class SaveResult:
    saved: int = 0
    skipped: int = 0
    reinforced: int = 0
    ids: list[UUID] = field(default_factory=list)
    skip_reasons: Counter[str] = field(default_factory=Counter)
    redactions: Counter[str] = field(default_factory=Counter)
    quarantined: list[UUID] = field(default_factory=list)
    pruned: list[UUID] = field(default_factory=list)


def owner_key(owner: Principal | None) -> str:
    """The dedupe scope: ``""`` for the shared pool, ``"<kind>:<id>"`` for an owner."""
    return "" if owner is None or owner.kind == "none" else owner.ref


def _expires_at(config: MemoryConfig, draft: Draft, now: datetime) -> datetime | None:
    if draft.layer == "observation":
        return now + timedelta(days=config.observation_ttl_days)
    candidates = []
    if config.retention.ttl_seconds is not None:
        candidates.append(now + timedelta(seconds=config.retention.ttl_seconds))
    ttl_days = config.type_policy(draft.memory_type).ttl_days
    if ttl_days is not None:
        candidates.append(now + timedelta(days=ttl_days))
    return min(candidates) if candidates else None


async def save_entries(
    session: AsyncSession,
    ctx: SaveContext,
    drafts: list[Draft],
    config: MemoryConfig,
    *,
    also_audit: Sequence[audit.AuditEntry] = (),
) -> SaveResult:
    """Run every draft through the save path inside the caller's transaction.

    The outcome is audited as the last step, together with ``also_audit`` (the caller's own
    records), so the transaction takes the organization's chain lock once, just before commit.
    """
    result = SaveResult()
    # A fixed order of row locks across concurrent writers: no deadlock between two upserts.
    drafts = sorted(drafts, key=lambda d: fingerprint(d.text))
    allowed_types = config.policy.memory_types_allowed
    now = utcnow()
    for draft in drafts:
        if draft.importance < MIN_IMPORTANCE:
            result.skipped += 1
            result.skip_reasons["low_importance"] += 1
            continue
        if allowed_types is not None and draft.memory_type not in allowed_types:
            result.skipped += 1
            result.skip_reasons["type_not_allowed"] += 1
            continue
        decision = apply_write_policy(draft.text, config.pii_handling)
        if decision.denied is not None:
            result.skipped += 1
            result.skip_reasons[f"policy:{decision.denied}"] += 1
            continue
        result.redactions.update(decision.redactions)
        entry_id, inserted, version, importance = await _upsert(session, ctx, draft, decision, config, now)
        if inserted:
            result.saved += 1
        else:
            result.reinforced += 1
        result.ids.append(entry_id)
        if decision.quarantined:
            result.quarantined.append(entry_id)
        await enqueue(
            session,
            MEMORY_WRITTEN,
            event := MemoryWritten(
                org_id=ctx.org_id,
                agent_config_id=ctx.agent_config_id,
                entry_id=entry_id,
                outcome="saved" if inserted else "reinforced",
                owner=ctx.owner if owner_key(ctx.owner) else None,
                session_id=ctx.session_id,
                layer="observation" if draft.layer == "observation" else "memory",
                memory_type=draft.memory_type,
                source=ctx.source,
                importance=importance,
                version=version,
                quarantined=decision.quarantined,
            ),
            event.event_id,
        )
    if result.saved:
        result.pruned = await _prune_over_cap(session, ctx, config.retention.max_entries)
    await audit.append(session, ctx.org_id, [*_audit_entries(ctx, result), *also_audit])
    return result


async def _upsert(
    session: AsyncSession,
    ctx: SaveContext,
    draft: Draft,
    decision: PolicyDecision,
    config: MemoryConfig,
    now: datetime,
) -> tuple[UUID, bool, int, float]:
    """Insert the entry, or reinforce the one with the same fingerprint in the same owner scope.

    One statement, so two writers racing on the same text still produce one row.
    """
    owner = ctx.owner if owner_key(ctx.owner) else None
    params = {
        "id": uuid4(),
        "org_id": ctx.org_id,
        "agent_config_id": ctx.agent_config_id,
        "owner_key": owner_key(owner),
        "owner_kind": owner.kind if owner else None,
        "owner_id": owner.id if owner else None,
        "session_id": ctx.session_id,
        "text": decision.text,
        "fingerprint": fingerprint(decision.text),
        "importance": draft.importance,
        "reinforcement_count": 0,
        "memory_type": draft.memory_type,
        "layer": draft.layer,
        "source": ctx.source,
        "source_agent": ctx.source_agent,
        "confidence": draft.confidence,
        "reliability": 1.0,
        "lifecycle": "active",
        "pinned": False,
        "redaction": list(decision.redactions),
        "quarantined": decision.quarantined,
        "quarantine_reasons": list(decision.quarantine_reasons),
        "provenance": ctx.provenance if decision.quarantined else {},
        "expires_at": _expires_at(config, draft, now),
        "created_at": now,
        "updated_at": now,
        "last_accessed_at": None,
        "access_count": 0,
        "version": 1,
        "supersedes": None,
        "superseded_by": None,
        "embedding_status": "pending",
        "category": None,
        "confirmation": None,
        "sensitivity": None,
        "consent": None,
        "metadata": draft.metadata,
    }
    row = (await session.execute(_UPSERT, params)).one()
    return row[0], bool(row[1]), row[2], row[3]


async def _prune_over_cap(session: AsyncSession, ctx: SaveContext, max_entries: int) -> list[UUID]:
    """Drop lowest importance, then oldest, until the agent config is within its cap (pinned exempt)."""
    table = ENTRIES
    scope = (table.c.org_id == ctx.org_id) & (table.c.agent_config_id == ctx.agent_config_id)
    total = (await session.execute(select(func.count()).select_from(table).where(scope))).scalar_one()
    excess = total - max_entries
    if excess <= 0:
        return []
    victims = (
        (
            await session.execute(
                select(table.c.id)
                .where(scope, table.c.pinned.is_(False))
                .order_by(table.c.importance.asc(), table.c.created_at.asc())
                .limit(excess)
            )
        )
        .scalars()
        .all()
    )
    if not victims:
        return []
    await session.execute(delete(table).where(table.c.id.in_(victims)))
    purged = MemoryPurged(
        org_id=ctx.org_id,
        agent_config_id=ctx.agent_config_id,
        entry_ids=list(victims),
        actor_ref=None,
        session_id=None,
        count=len(victims),
        requested_by="engram:max_entries",
        reason="prune",
    )
    await enqueue(session, MEMORY_PURGED, purged, purged.event_id)
    return list(victims)


def _audit_entries(ctx: SaveContext, result: SaveResult) -> list[audit.AuditEntry]:
    def entry(kind: str, ids: list[UUID], details: dict[str, Any]) -> audit.AuditEntry:
        return audit.AuditEntry(
            kind=kind,
            actor_ref=ctx.requested_by,
            agent_config_id=ctx.agent_config_id,
            session_id=ctx.session_id,
            entry_ids=ids,
            details=details,
        )

    entries = [
        entry(
            "memory.saved",
            result.ids,
            {
                "source": ctx.source,
                "owner": owner_key(ctx.owner) or None,
                "saved": result.saved,
                "reinforced": result.reinforced,
                "skipped": result.skipped,
                "skip_reasons": dict(result.skip_reasons),
                "redactions": dict(result.redactions),
                "quarantined": [str(i) for i in result.quarantined],
            },
        )
    ]
    denials = {k: v for k, v in result.skip_reasons.items() if k.startswith("policy:")}
    if denials:
        entries.append(entry("policy.denied", [], {"reasons": denials}))
    if result.pruned:
        entries.append(
            entry("memory.pruned", result.pruned, {"count": len(result.pruned), "reason": "max_entries"})
        )
    return entries
