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

from sqlalchemy.ext.asyncio import AsyncSession

from contracts.common import Principal
from contracts.errors import InvalidRequest, WritePolicyDenied
from contracts.governance import ManageReply, ManageRequest
from services.governance_audit.views import entry_view, load_entry
from shared.runtime.time import utcnow
from shared.security.access import Caller, target_key
from shared.storage import audit
from shared.storage.config_store import load_config
from shared.storage.entries import Entry, EntryStore
from shared.storage.erasure import decay_or_erase, lineage
from shared.text.policy import apply_write_policy, check_carried_fields, fingerprint

__all__ = ["manage_entry"]

_ENABLE_FROM = ("disabled", "suppressed", "stale")


async def manage_entry(session: AsyncSession, caller: Caller, request: ManageRequest) -> ManageReply:
    """Run the operation inside the caller's transaction (the router commits)."""
    entries = EntryStore(session)
    row = await load_entry(entries, caller, request.entry_id, request.agent_config_id, for_update=True)
    caller.require("write", row.owner_key)
    config, _ = await load_config(session, caller.org_id, request.agent_config_id)
    now = utcnow()
    affected: list[UUID] = [row.id]
    current: UUID | None = row.id
    details: dict[str, Any] = {"op": request.op, **caller.via}
    op = request.op
    if op in ("pin", "unpin"):
        await entries.update(row.id, pinned=op == "pin", updated_at=now)
    elif op == "disable":
        _not_superseded(row)
        await entries.update(row.id, lifecycle="disabled", updated_at=now)
    elif op == "enable":
        if row.lifecycle not in (*_ENABLE_FROM, "active"):
            raise InvalidRequest(f"an entry that is {row.lifecycle} cannot be enabled")
        await entries.update(row.id, lifecycle="active", updated_at=now)
    elif op == "change_retention":
        expires = request.expires_at
        if request.ttl_seconds is not None:
            expires = now + timedelta(seconds=request.ttl_seconds)
        await entries.update(row.id, expires_at=expires, updated_at=now)
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
        current = await _edit(entries, row, request, config, now)
        affected = sorted({row.id, current}, key=str)
    elif op == "merge":
        assert request.text is not None
        assert request.merge_with is not None
        current, affected = await _merge(entries, caller, row, request, config, now)
    elif op == "rescope":
        assert request.owner is not None
        affected = await _rescope(session, entries, caller, row, request.owner, now)
        details["owner"] = request.owner
    await _audit(session, caller, request, affected, details)
    assert current is not None
    now_stored = await entries.get(caller.org_id, request.agent_config_id, current)
    assert now_stored is not None  # written in this transaction
    shown = entry_view(now_stored, show_quarantined=caller.is_admin)
    return ManageReply(op=op, entry=shown, affected=affected)


def _not_superseded(row: Entry) -> None:
    if row.lifecycle == "superseded":
        raise InvalidRequest(
            "a superseded version cannot be changed; manage the current one",
            {"superseded_by": str(row.superseded_by)},
        )


def _policy_text(text: str, pii_handling: Any, row: Entry, metadata: dict[str, Any]) -> Any:
    """The write policy's decision on new text for ``row``, whose type and ``metadata`` the entry
    keeps: an attack in those quarantines the new entry as it did the old one."""
    decision = apply_write_policy(text, pii_handling)
    if decision.denied is not None:
        raise WritePolicyDenied("the new text is refused by the write policy", {"reason": decision.denied})
    return check_carried_fields(decision, row.memory_type, metadata)


async def _free(entries: EntryStore, row: Entry, owner_key: str, fp: str, *, ignore: set[UUID]) -> None:
    """Refuse a change that would give an owner two current entries with the same text."""
    clash = await entries.holding((row.org_id, row.agent_config_id, owner_key, fp))
    others = [c for c in clash if c not in ignore]
    if others:
        raise InvalidRequest("the owner already has an entry with this text", {"entry_id": str(others[0])})


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


async def _edit(entries: EntryStore, row: Entry, request: ManageRequest, config: Any, now: Any) -> UUID:
    assert request.text is not None
    decision = _policy_text(request.text, config.pii_handling, row, dict(row.metadata or {}))
    values = _text_values(decision, now)
    await _free(entries, row, row.owner_key, values["fingerprint"], ignore={row.id})
    importance = request.importance if request.importance is not None else row.importance
    if not config.type_policy(row.memory_type).version_on_edit:
        await entries.update(row.id, announce=True, **values, importance=importance, version=row.version + 1)
        entry_id: UUID = row.id
        return entry_id
    new_id = uuid4()
    # The old version steps out of the dedupe index first (superseded), then the new one goes in.
    await entries.update(row.id, lifecycle="superseded", superseded_by=new_id, updated_at=now)
    await entries.insert(
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
    return new_id


def _copy(row: Entry) -> dict[str, Any]:
    return row.values()


async def _merge(
    entries: EntryStore, caller: Caller, row: Entry, request: ManageRequest, config: Any, now: Any
) -> tuple[UUID, list[UUID]]:
    assert request.text is not None
    assert request.merge_with is not None
    ids = list(dict.fromkeys([row.id, *request.merge_with]))
    if len(ids) < 2:
        raise InvalidRequest("merge needs at least one other entry in merge_with")
    sources = [row]
    for other in ids[1:]:
        sources.append(await load_entry(entries, caller, other, request.agent_config_id, for_update=True))
    for s in sources:
        _not_superseded(s)
        if s.owner_key != row.owner_key:
            raise InvalidRequest("merged entries must have the same owner (rescope first)")
    metadata = {**dict(row.metadata or {}), "merged_from": [str(i) for i in ids]}
    decision = _policy_text(request.text, config.pii_handling, row, metadata)
    values = _text_values(decision, now)
    await _free(entries, row, row.owner_key, values["fingerprint"], ignore=set(ids))
    new_id = uuid4()
    for s in sources:
        await entries.update(s.id, lifecycle="superseded", superseded_by=new_id, updated_at=now)
    importance = request.importance if request.importance is not None else max(s.importance for s in sources)
    await entries.insert(
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
    return new_id, sorted([new_id, *ids], key=str)


async def _rescope(
    session: AsyncSession, entries: EntryStore, caller: Caller, row: Entry, owner: str, now: Any
) -> list[UUID]:
    key = target_key(owner)
    if key == row.owner_key:
        return [row.id]
    # Moving memory between owners is always cross-owner: admin only (SPEC 7.2).
    caller.require("write", key)
    caller.require_admin()
    family = [row.id, *(await lineage(session, row.org_id, {row.id}))]
    await _free(entries, row, key, row.fingerprint, ignore=set(family))
    principal = Principal.parse_ref(owner) if key else None
    for entry_id in family:
        await entries.update(
            entry_id,
            # Announced, so the embed service re-indexes it: the vector payload carries the owner
            # (recall filters on it).
            announce=True,
            owner_key=key,
            owner_kind=principal.kind if principal else None,
            owner_id=principal.id if principal else None,
            embedding_status="pending",
            updated_at=now,
        )
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
