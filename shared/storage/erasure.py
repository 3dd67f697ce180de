"""The one erase path (SPEC 7.2): purge, delete, prune, expiry and reliability pruning all end here.

Inside the caller's transaction it deletes the rows *and everything derived from them* — the
other versions of an edited entry and any merge that folded one in — deletes the owner's recall
history when asked, writes a tombstone so that nothing derived from older input is ever saved
again, announces the ids on ``memory.purged`` (the embed service deletes their vectors, caches
drop them) and appends the audit record. Events and audit records carry ids and counts, never text.

Tombstones are the version guard of "a purged memory never comes back": the save path refuses a
draft whose input (a session, an elective save) was produced before an erasure covering it, so a
replayed or late event cannot re-create what was erased. New input after the erasure is new memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from sqlalchemy import ColumnElement, delete, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.config import TypePolicy
from contracts.events import MemoryPurged
from contracts.subjects import MEMORY_PURGED
from shared.runtime.time import utcnow
from shared.storage import audit
from shared.storage.db.models import ERASURES, RECALLS
from shared.storage.entries.store import Entry, EntryRef, EntryStore, with_ids
from shared.storage.outbox import enqueue

__all__ = [
    "EVENT_CHUNK",
    "Erased",
    "Tombstone",
    "decay_or_erase",
    "erase",
    "erased_before",
    "lineage",
    "prune_over_cap",
]

#: Ids per ``memory.purged`` event and per audit record: keeps each message far below the
#: stream's 1 MiB limit however much one purge erases.
EVENT_CHUNK = 2_000
#: Lineage is shallow (edits and merges of one memory); this bounds a pathological chain.
_MAX_LINEAGE_ROUNDS = 32


@dataclass(frozen=True)
class Tombstone:
    """What an erasure covers for the save path's guard: an owner's memory in one agent config
    (None: all of them), optionally one session, optionally only some texts (by fingerprint)."""

    owner_key: str
    agent_config_id: UUID | None = None
    session_id: str | None = None
    fingerprints: tuple[str, ...] | None = None
    #: Given when an erasure is applied again from the purge ledger (``shared.storage.purge_ledger``):
    #: the original's id and time, so the restored tombstone is the one that was lost.
    id: UUID | None = None
    erased_at: datetime | None = None


@dataclass
class Erased:
    ids: list[UUID] = field(default_factory=list)
    #: of ``ids``: how many were observations, and how many came in as derived versions/merges.
    observations: int = 0
    derived: int = 0
    recall_records: int = 0
    agent_config_ids: list[UUID] = field(default_factory=list)
    #: the audit records of this erasure (already appended unless ``append_audit=False``).
    audit: list[audit.AuditEntry] = field(default_factory=list)
    #: the tombstones written, as rows (what the purge ledger keeps outside the database).
    tombstones: list[dict[str, Any]] = field(default_factory=list)


async def erase(
    session: AsyncSession,
    *,
    org_id: UUID,
    where: ColumnElement[bool],
    reason: str,
    requested_by: str,
    actor_ref: str | None = None,
    session_id: str | None = None,
    tombstones: Sequence[Tombstone] = (),
    recall_history_of: str | None = None,
    audit_kind: str = "memory.purged",
    audit_details: dict[str, Any] | None = None,
    agent_config_id: UUID | None = None,
    append_audit: bool = True,
) -> Erased:
    """Erase the organization's entries matching ``where`` (``shared.storage.entries``: ``in_scope``,
    ``with_ids``) and all their lineage.

    ``recall_history_of`` (an ``actor_ref``) also deletes that caller's recall records (of
    ``session_id`` when given): they say what the owner asked about and was shown.
    The audit record is appended last (the chain lock is taken just before the caller commits);
    a caller with more work in the transaction passes ``append_audit=False`` and appends
    ``Erased.audit`` itself at its end, so the chain lock stays the last lock it takes.
    """
    now = utcnow()
    entries = EntryStore(session)
    found = {r.id: r for r in await entries.lock(org_id, where)}
    derived = await lineage(session, org_id, set(found))
    found.update(derived)
    out = Erased(
        ids=sorted(found, key=str),
        observations=sum(1 for r in found.values() if r.layer == "observation"),
        derived=len(derived),
        agent_config_ids=sorted({r.agent_config_id for r in found.values()}, key=str),
    )
    for chunk in _chunks(out.ids):
        await entries.delete(chunk)
    if recall_history_of is not None:
        conditions = [RECALLS.c.org_id == org_id, RECALLS.c.caller_ref == recall_history_of]
        if agent_config_id is not None:
            conditions.append(RECALLS.c.agent_config_id == agent_config_id)
        if session_id is not None:
            conditions.append(RECALLS.c.session_id == session_id)
        result = await session.execute(delete(RECALLS).where(*conditions))
        out.recall_records = int(result.rowcount or 0)  # type: ignore[attr-defined]
    if tombstones:
        out.tombstones = [
            {
                "id": t.id or uuid4(),
                "org_id": org_id,
                "agent_config_id": t.agent_config_id,
                "owner_key": t.owner_key,
                "session_id": t.session_id,
                "fingerprints": list(t.fingerprints) if t.fingerprints is not None else None,
                "erased_at": t.erased_at or now,
                "reason": reason,
            }
            for t in tombstones
        ]
        await session.execute(insert(ERASURES), out.tombstones)
    by_config: dict[UUID, list[UUID]] = {}
    for entry_id in out.ids:
        by_config.setdefault(found[entry_id].agent_config_id, []).append(entry_id)
    for config_id, ids in sorted(by_config.items(), key=lambda kv: str(kv[0])):
        for chunk in _chunks(ids):
            event = MemoryPurged(
                org_id=org_id,
                agent_config_id=config_id,
                entry_ids=chunk,
                actor_ref=actor_ref,
                session_id=session_id,
                count=len(chunk),
                requested_by=requested_by,
                reason=reason,
            )
            await enqueue(session, MEMORY_PURGED, event, event.event_id)
    details = {
        "reason": reason,
        "count": len(out.ids),
        "observations": out.observations,
        "derived": out.derived,
        "recall_records": out.recall_records,
        "actor_scope": actor_ref,
        "session_scope": session_id,
        **(audit_details or {}),
    }
    out.audit = [
        audit.AuditEntry(
            kind=audit_kind,
            actor_ref=requested_by,
            agent_config_id=agent_config_id,
            session_id=session_id,
            entry_ids=chunk,
            details={**details, "part": n + 1} if len(out.ids) > EVENT_CHUNK else details,
        )
        for n, chunk in enumerate(_chunks(out.ids) or [[]])
    ]
    if append_audit:
        await audit.append(session, org_id, out.audit)
    return out


async def lineage(session: AsyncSession, org_id: UUID, seeds: set[UUID]) -> dict[UUID, EntryRef]:
    """Entries linked to ``seeds`` by edit versions (``supersedes``/``superseded_by``) or merges
    (``derived_from``), transitively, locked for the delete."""
    found: dict[UUID, EntryRef] = {}
    entries = EntryStore(session)
    frontier = set(seeds)
    known = set(seeds)
    for _ in range(_MAX_LINEAGE_ROUNDS):
        if not frontier:
            break
        rows = await entries.linked(org_id, list(frontier))
        frontier = {r.id for r in rows} - known
        known |= frontier
        found.update({r.id: r for r in rows if r.id in frontier})
    return found


def _chunks(ids: Sequence[UUID]) -> list[list[UUID]]:
    return [list(ids[i : i + EVENT_CHUNK]) for i in range(0, len(ids), EVENT_CHUNK)]


async def erased_before(
    session: AsyncSession, org_id: UUID, owner_keys: Iterable[str], since: datetime
) -> list[Any]:
    """The tombstones of these owners written at or after ``since`` (the save path's guard)."""
    keys = sorted(set(owner_keys))
    if not keys:
        return []
    return list(
        (
            await session.execute(
                select(
                    ERASURES.c.agent_config_id,
                    ERASURES.c.owner_key,
                    ERASURES.c.session_id,
                    ERASURES.c.fingerprints,
                    ERASURES.c.erased_at,
                ).where(
                    ERASURES.c.org_id == org_id,
                    ERASURES.c.owner_key.in_(keys),
                    ERASURES.c.erased_at >= since,
                )
            )
        ).all()
    )


async def prune_over_cap(
    session: AsyncSession,
    *,
    org_id: UUID,
    agent_config_id: UUID,
    max_entries: int,
    requested_by: str,
    audit_kind: str = "memory.pruned",
    append_audit: bool = True,
    audit_details: dict[str, Any] | None = None,
) -> tuple[Erased, int]:
    """Drop lowest importance, then oldest, until the agent config holds at most ``max_entries``
    (pinned entries exempt and never counted out). Returns what was erased and what remains."""
    entries = EntryStore(session)
    total = await entries.count(org_id, agent_config_id)
    excess = total - max_entries
    if excess <= 0:
        return Erased(), total
    victims = await entries.least_important(org_id, agent_config_id, excess)
    if not victims:
        return Erased(), total
    erased = await erase(
        session,
        org_id=org_id,
        where=with_ids(victims),
        reason="prune",
        requested_by=requested_by,
        audit_kind=audit_kind,
        audit_details={"max_entries": max_entries, **(audit_details or {})},
        agent_config_id=agent_config_id,
        append_audit=append_audit,
    )
    return erased, total - len(erased.ids)


async def decay_or_erase(
    session: AsyncSession,
    *,
    org_id: UUID,
    agent_config_id: UUID,
    entry: Entry,
    policy: TypePolicy,
    requested_by: str,
    also_set: dict[str, Any] | None = None,
) -> tuple[float, Erased | None]:
    """A memory that turned out wrong (SPEC 5.6, 7.2): its reliability times the type's
    ``decay_on_failure``; below ``prune_below`` (pinned entries excepted) it is erased — Engram's
    own judgement, so no tombstone — else the new reliability is stored with ``also_set``.
    The erasure's audit records are left
    in ``Erased.audit`` for the caller to append last."""
    reliability = entry.reliability * policy.decay_on_failure
    if reliability < policy.prune_below and not entry.pinned:
        erased = await erase(
            session,
            org_id=org_id,
            where=with_ids([entry.id]),
            reason="reliability",
            requested_by=requested_by,
            audit_kind="memory.pruned",
            agent_config_id=agent_config_id,
            append_audit=False,
        )
        return reliability, erased
    await EntryStore(session).update(entry.id, reliability=reliability, **(also_set or {}))
    return reliability, None
