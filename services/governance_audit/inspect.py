"""``engram.memory.list`` and ``engram.memory.get`` (SPEC 7.1): inspecting memory, audited.

Inspection is a disclosure like recall: every listed or fetched entry id goes on the record.
Quarantined text is shown only to ``memory.admin`` callers (who review it); others get the
placeholder recall uses, because a listing may well end up in a prompt.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import ColumnElement, and_, or_, select

from contracts.common import Principal
from contracts.governance import EntryView, GetReply, GetRequest, ListRequest, Page
from services.governance_audit.access import Caller, target_key
from services.recall.visibility import SHARED_POOL
from shared import audit
from shared.db.engine import Database
from shared.db.models import ENTRIES
from shared.page_tokens import PageTokens

__all__ = ["ENTRY_COLUMNS", "QUARANTINE_PLACEHOLDER", "entry_view", "get_entry", "list_entries"]

#: Every column but the derived full-text vector.
ENTRY_COLUMNS = tuple(c for c in ENTRIES.c if c.name != "search")
QUARANTINE_PLACEHOLDER = "[quarantined memory withheld]"


def entry_view(row: Any, *, show_quarantined: bool = True) -> EntryView:
    owner = Principal(kind=row.owner_kind, id=row.owner_id) if row.owner_kind else None
    text = row.text if (show_quarantined or not row.quarantined) else QUARANTINE_PLACEHOLDER
    return EntryView(
        id=row.id,
        org_id=row.org_id,
        agent_config_id=row.agent_config_id,
        owner=owner,
        session_id=row.session_id,
        text=text,
        fingerprint=row.fingerprint,
        importance=row.importance,
        reinforcement_count=row.reinforcement_count,
        memory_type=row.memory_type,
        layer=row.layer,
        source=row.source,
        source_agent=row.source_agent,
        confidence=row.confidence,
        reliability=row.reliability,
        lifecycle=row.lifecycle,
        pinned=row.pinned,
        category=row.category,
        confirmation=row.confirmation,
        sensitivity=row.sensitivity,
        consent=row.consent,
        redaction=list(row.redaction or []),
        quarantined=row.quarantined,
        expires_at=row.expires_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
        last_accessed_at=row.last_accessed_at,
        access_count=row.access_count,
        version=row.version,
        supersedes=row.supersedes,
        superseded_by=row.superseded_by,
        derived_from=[UUID(str(x)) for x in row.derived_from or []],
        embedding_status=row.embedding_status,
        metadata=dict(row.metadata or {}),
    )


def _readable_keys(caller: Caller, actor_ref: str | None) -> tuple[str, ...]:
    """The owner keys a list may read: the named owner (if allowed), or what the caller sees."""
    if actor_ref is not None:
        key = target_key(actor_ref)
        caller.require("read", key)
        return (key,)
    caller.credential.require("memory.read")
    if caller.principal.kind == "actor":
        return (caller.own_key, SHARED_POOL)
    return (caller.own_key,)


async def list_entries(db: Database, pages: PageTokens, caller: Caller, request: ListRequest) -> Page:
    agent_config_id = caller.agent_config(request.agent_config_id)
    assert agent_config_id is not None
    keys = _readable_keys(caller, request.actor_ref)
    session_id = request.session_id
    if caller.session_only is not None:
        caller.credential.require_session(session_id or caller.session_only)
        session_id = caller.session_only
    filters = {
        "agent_config_id": str(agent_config_id),
        "keys": list(keys),
        "lifecycle": request.lifecycle,
        "layer": request.layer,
        "memory_types": request.memory_types,
        "min_importance": request.min_importance,
        "session_id": session_id,
        "page_size": request.page_size,
        "principal": caller.ref,
    }
    conditions: list[ColumnElement[bool]] = [
        ENTRIES.c.org_id == caller.org_id,
        ENTRIES.c.agent_config_id == agent_config_id,
        ENTRIES.c.owner_key.in_(keys),
        ENTRIES.c.lifecycle.in_(request.lifecycle or ["active"]),
    ]
    if request.layer is not None:
        conditions.append(ENTRIES.c.layer == request.layer)
    if request.memory_types is not None:
        conditions.append(ENTRIES.c.memory_type.in_(request.memory_types))
    if request.min_importance is not None:
        conditions.append(ENTRIES.c.importance >= request.min_importance)
    if session_id is not None:
        conditions.append(ENTRIES.c.session_id == session_id)
    if request.page_token is not None:
        pos = pages.open(
            request.page_token, purpose="list", org_id=caller.org_id, caller=caller.ref, filters=filters
        )
        conditions.append(_after(pos))
    async with db.transaction() as session:
        rows = (
            await session.execute(
                select(*ENTRY_COLUMNS)
                .where(*conditions)
                .order_by(ENTRIES.c.importance.desc(), ENTRIES.c.created_at.desc(), ENTRIES.c.id)
                .limit(request.page_size + 1)
            )
        ).all()
        more = len(rows) > request.page_size
        rows = rows[: request.page_size]
        show = caller.is_admin
        entries = [entry_view(r, show_quarantined=show) for r in rows]
        await audit.append(
            session,
            caller.org_id,
            [
                audit.AuditEntry(
                    kind="memory.listed",
                    actor_ref=caller.ref,
                    agent_config_id=agent_config_id,
                    session_id=session_id,
                    entry_ids=[e.id for e in entries],
                    details={"owners": list(keys), "count": len(entries), **caller.via},
                )
            ],
        )
    token = None
    if more and rows:
        last = rows[-1]
        token = pages.issue(
            purpose="list",
            org_id=caller.org_id,
            caller=caller.ref,
            filters=filters,
            position={"i": last.importance, "c": last.created_at.isoformat(), "id": str(last.id)},
        )
    return Page(entries=entries, next_page_token=token)


def _after(pos: dict[str, Any]) -> ColumnElement[bool]:
    """Keyset continuation of ``importance DESC, created_at DESC, id``."""
    from contracts.errors import InvalidRequest

    try:
        importance = float(pos["i"])
        created = datetime.fromisoformat(str(pos["c"]))
        last_id = UUID(str(pos["id"]))
    except (KeyError, ValueError, TypeError):
        raise InvalidRequest("invalid page token") from None
    return or_(
        ENTRIES.c.importance < importance,
        and_(ENTRIES.c.importance == importance, ENTRIES.c.created_at < created),
        and_(ENTRIES.c.importance == importance, ENTRIES.c.created_at == created, ENTRIES.c.id > last_id),
    )


async def get_entry(db: Database, caller: Caller, request: GetRequest) -> GetReply:
    caller.agent_config(request.agent_config_id)
    async with db.transaction() as session:
        row = (
            await session.execute(
                select(*ENTRY_COLUMNS).where(
                    ENTRIES.c.id == request.entry_id,
                    ENTRIES.c.org_id == caller.org_id,
                    ENTRIES.c.agent_config_id == request.agent_config_id,
                )
            )
        ).first()
        caller.credential.require("memory.read")
        row = caller.require_sees(row)
        show = caller.is_admin
        history: list[EntryView] = []
        if request.history:
            previous = row.supersedes
            while previous is not None and len(history) < 100:
                older = (
                    await session.execute(
                        select(*ENTRY_COLUMNS).where(
                            ENTRIES.c.id == previous, ENTRIES.c.org_id == caller.org_id
                        )
                    )
                ).first()
                if older is None:
                    break
                history.append(entry_view(older, show_quarantined=show))
                previous = older.supersedes
        await audit.append(
            session,
            caller.org_id,
            [
                audit.AuditEntry(
                    kind="memory.inspected",
                    actor_ref=caller.ref,
                    agent_config_id=request.agent_config_id,
                    session_id=row.session_id,
                    entry_ids=[row.id, *(h.id for h in history)],
                    details=caller.via,
                )
            ],
        )
    return GetReply(entry=entry_view(row, show_quarantined=show), history=history)
