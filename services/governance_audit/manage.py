"""``engram.memory.manage`` (SPEC 7.1, 7.2): one operation on one entry, audited.

New text (``edit``, ``merge``) goes through the same write policy and fingerprint as every save
(PII handling, injection quarantine), and a changed entry is announced on ``memory.written`` so
the embed service re-indexes it (``embedding_status`` goes back to ``pending``).

- ``edit``: with the type's ``version_on_edit`` a new version supersedes the old one (history
  kept, ``get(history=true)`` shows it); without, the text changes in place and ``version`` counts.
- ``merge``: one new entry; the sources become ``superseded`` and point to it; erasing any source
  later erases the merge too (``derived_from``).
- ``mark_incorrect``: suppressed, reliability decayed by the type's ``decay_on_failure``; below
  ``prune_below`` (and not pinned) the entry is deleted.
- ``rescope``: moves the entry and its versions to another owner — ``memory.admin`` only.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.common import Principal
from contracts.errors import InvalidRequest, WritePolicyDenied
from contracts.events import MemoryWritten
from contracts.governance import ManageReply, ManageRequest
from contracts.subjects import MEMORY_WRITTEN
from services.governance_audit.access import Caller, target_key
from services.governance_audit.views import ENTRY_COLUMNS, entry_view, load_entry
from shared import audit
from shared.config_store import load_config
from shared.db.models import ENTRIES
from shared.erasure import decay_or_erase, lineage
from shared.outbox import enqueue
from shared.policy import apply_write_policy, check_carried_fields, fingerprint
from shared.time import utcnow

__all__ = ["manage_entry"]

_ENABLE_FROM = ("disabled", "suppressed", "stale")


async def manage_entry(session: AsyncSession, caller: Caller, request: ManageRequest) -> ManageReply:
    """Run the operation inside the caller's transaction (the router commits)."""
    caller.agent_config(request.agent_config_id)
    caller.credential.require("memory.write")
    row = await load_entry(session, caller, request.entry_id, request.agent_config_id, for_update=True)
    caller.require("write", row.owner_key)
    config, _ = await load_config(session, caller.org_id, request.agent_config_id)
    now = utcnow()
    affected: list[UUID] = [row.id]
    current: UUID | None = row.id
    details: dict[str, Any] = {"op": request.op, **caller.via}
    op = request.op
    if op in ("pin", "unpin"):
        await _set(session, row.id, pinned=op == "pin", updated_at=now)
    elif op == "disable":
        _not_superseded(row)
        await _set(session, row.id, lifecycle="disabled", updated_at=now)
    elif op == "enable":
        if row.lifecycle not in (*_ENABLE_FROM, "active"):
            raise InvalidRequest(f"an entry that is {row.lifecycle} cannot be enabled")
        await _set(session, row.id, lifecycle="active", updated_at=now)
    elif op == "change_retention":
        expires = request.expires_at
        if request.ttl_seconds is not None:
            expires = now + timedelta(seconds=request.ttl_seconds)
        await _set(session, row.id, expires_at=expires, updated_at=now)
        details["expires_at"] = expires.isoformat() if expires else None
    elif op == "mark_incorrect":
        _not_superseded(row)
        details["reliability"], erased = await decay_or_erase(
            session,
            org_id=caller.org_id,
            agent_config_id=request.agent_config_id,
            entry=row,
            policy=config.type_policy(row.memory_type),
            requested_by=caller.ref,
            also_set={"lifecycle": "suppressed", "updated_at": now},
        )
        if erased is not None:
            details["deleted"] = True
            await _audit(session, caller, request, erased.ids, details, extra=erased.audit)
            return ManageReply(op=op, entry=None, affected=erased.ids)
    elif op == "edit":
        _not_superseded(row)
        assert request.text is not None
        current = await _edit(session, caller, row, request, config, now)
        affected = sorted({row.id, current}, key=str)
    elif op == "merge":
        assert request.text is not None
        assert request.merge_with is not None
        current, affected = await _merge(session, caller, row, request, config, now)
    elif op == "rescope":
        assert request.owner is not None
        affected = await _rescope(session, caller, row, request.owner, now)
        details["owner"] = request.owner
    await _audit(session, caller, request, affected, details)
    assert current is not None
    shown = entry_view(await _row(session, current), show_quarantined=caller.is_admin)
    return ManageReply(op=op, entry=shown, affected=affected)


async def _row(session: AsyncSession, entry_id: UUID) -> Any:
    return (await session.execute(select(*ENTRY_COLUMNS).where(ENTRIES.c.id == entry_id))).one()


async def _set(session: AsyncSession, entry_id: UUID, **values: Any) -> None:
    await session.execute(update(ENTRIES).where(ENTRIES.c.id == entry_id).values(**values))


def _not_superseded(row: Any) -> None:
    if row.lifecycle == "superseded":
        raise InvalidRequest(
            "a superseded version cannot be changed; manage the current one",
            {"superseded_by": str(row.superseded_by)},
        )


def _policy_text(text: str, pii_handling: Any, row: Any, metadata: dict[str, Any]) -> Any:
    """The write policy's decision on new text for ``row``, whose type and ``metadata`` the entry
    keeps: an attack in those quarantines the new entry as it did the old one."""
    decision = apply_write_policy(text, pii_handling)
    if decision.denied is not None:
        raise WritePolicyDenied("the new text is refused by the write policy", {"reason": decision.denied})
    return check_carried_fields(decision, row.memory_type, metadata)


async def _free(session: AsyncSession, row: Any, owner_key: str, fp: str, *, ignore: set[UUID]) -> None:
    """Refuse a change that would give an owner two current entries with the same text."""
    clash = (
        (
            await session.execute(
                select(ENTRIES.c.id).where(
                    ENTRIES.c.org_id == row.org_id,
                    ENTRIES.c.agent_config_id == row.agent_config_id,
                    ENTRIES.c.owner_key == owner_key,
                    ENTRIES.c.fingerprint == fp,
                    ENTRIES.c.lifecycle != "superseded",
                )
            )
        )
        .scalars()
        .all()
    )
    others = [c for c in clash if c not in ignore]
    if others:
        raise InvalidRequest("the owner already has an entry with this text", {"entry_id": str(others[0])})


async def _announce(
    session: AsyncSession, row: Any, entry_id: UUID, version: int, *, quarantined: bool
) -> None:
    owner = Principal(kind=row.owner_kind, id=row.owner_id) if row.owner_kind else None
    event = MemoryWritten(
        org_id=row.org_id,
        agent_config_id=row.agent_config_id,
        entry_id=entry_id,
        outcome="saved",
        owner=owner,
        session_id=row.session_id,
        layer="observation" if row.layer == "observation" else "memory",
        memory_type=row.memory_type,
        source=row.source,
        importance=row.importance,
        version=version,
        quarantined=quarantined,
    )
    await enqueue(session, MEMORY_WRITTEN, event, event.event_id)


def _text_values(decision: Any, now: Any) -> dict[str, Any]:
    return {
        "text": decision.text,
        "fingerprint": fingerprint(decision.text),
        "redaction": list(decision.redactions),
        "quarantined": decision.quarantined,
        "quarantine_reasons": list(decision.quarantine_reasons),
        "embedding_status": "pending",
        "updated_at": now,
    }


async def _edit(
    session: AsyncSession, caller: Caller, row: Any, request: ManageRequest, config: Any, now: Any
) -> UUID:
    assert request.text is not None
    decision = _policy_text(request.text, config.pii_handling, row, dict(row.metadata or {}))
    values = _text_values(decision, now)
    await _free(session, row, row.owner_key, values["fingerprint"], ignore={row.id})
    importance = request.importance if request.importance is not None else row.importance
    if not config.type_policy(row.memory_type).version_on_edit:
        await _set(session, row.id, **values, importance=importance, version=row.version + 1)
        await _announce(session, row, row.id, row.version + 1, quarantined=decision.quarantined)
        entry_id: UUID = row.id
        return entry_id
    new_id = uuid4()
    # The old version steps out of the dedupe index first (superseded), then the new one goes in.
    await _set(session, row.id, lifecycle="superseded", superseded_by=new_id, updated_at=now)
    await session.execute(
        ENTRIES.insert().values(
            {
                **_copy(row),
                **values,
                "id": new_id,
                "importance": importance,
                "version": row.version + 1,
                "supersedes": row.id,
                "superseded_by": None,
                "lifecycle": "active",
            }
        )
    )
    await _announce(session, row, new_id, row.version + 1, quarantined=decision.quarantined)
    return new_id


def _copy(row: Any) -> dict[str, Any]:
    return {c.name: getattr(row, c.name) for c in ENTRY_COLUMNS}


async def _merge(
    session: AsyncSession, caller: Caller, row: Any, request: ManageRequest, config: Any, now: Any
) -> tuple[UUID, list[UUID]]:
    assert request.text is not None
    assert request.merge_with is not None
    ids = list(dict.fromkeys([row.id, *request.merge_with]))
    if len(ids) < 2:
        raise InvalidRequest("merge needs at least one other entry in merge_with")
    sources = [row]
    for other in ids[1:]:
        sources.append(await load_entry(session, caller, other, request.agent_config_id, for_update=True))
    for s in sources:
        _not_superseded(s)
        if s.owner_key != row.owner_key:
            raise InvalidRequest("merged entries must have the same owner (rescope first)")
    metadata = {**dict(row.metadata or {}), "merged_from": [str(i) for i in ids]}
    decision = _policy_text(request.text, config.pii_handling, row, metadata)
    values = _text_values(decision, now)
    await _free(session, row, row.owner_key, values["fingerprint"], ignore=set(ids))
    new_id = uuid4()
    for s in sources:
        await _set(session, s.id, lifecycle="superseded", superseded_by=new_id, updated_at=now)
    importance = request.importance if request.importance is not None else max(s.importance for s in sources)
    await session.execute(
        ENTRIES.insert().values(
            {
                **_copy(row),
                **values,
                "id": new_id,
                "importance": importance,
                "reinforcement_count": sum(s.reinforcement_count for s in sources),
                "version": 1,
                "supersedes": None,
                "superseded_by": None,
                "derived_from": [str(i) for i in ids],
                "lifecycle": "active",
                "created_at": now,
                "access_count": 0,
                "last_accessed_at": None,
                "metadata": metadata,
            }
        )
    )
    await _announce(session, row, new_id, 1, quarantined=decision.quarantined)
    return new_id, sorted([new_id, *ids], key=str)


async def _rescope(session: AsyncSession, caller: Caller, row: Any, owner: str, now: Any) -> list[UUID]:
    key = target_key(owner)
    if key == row.owner_key:
        return [row.id]
    # Moving memory between owners is always cross-owner: admin only (SPEC 7.2).
    caller.require("write", key)
    caller.require_admin()
    family = [row.id, *(await lineage(session, row.org_id, {row.id}))]
    await _free(session, row, key, row.fingerprint, ignore=set(family))
    principal = Principal.parse_ref(owner) if key else None
    for entry_id in family:
        await _set(
            session,
            entry_id,
            owner_key=key,
            owner_kind=principal.kind if principal else None,
            owner_id=principal.id if principal else None,
            # Re-indexed so the vector payload carries the new owner (recall filters on it).
            embedding_status="pending",
            updated_at=now,
        )
        moved = await _row(session, entry_id)
        await _announce(session, moved, entry_id, moved.version, quarantined=moved.quarantined)
    return sorted(family, key=str)


async def _audit(
    session: AsyncSession,
    caller: Caller,
    request: ManageRequest,
    affected: list[UUID],
    details: dict[str, Any],
    *,
    extra: list[audit.AuditEntry] | None = None,
) -> None:
    record = audit.AuditEntry(
        kind="memory.managed",
        actor_ref=caller.ref,
        agent_config_id=request.agent_config_id,
        entry_ids=affected,
        details=details,
    )
    await audit.append(session, caller.org_id, [record, *(extra or [])])
