"""``engram.memory.list`` and ``engram.memory.get`` (SPEC 7.1): inspecting memory, audited.

Inspection is a disclosure like recall: every listed or fetched entry id goes on the record.
Quarantined text is shown only to ``memory.admin`` callers (who review it); others get the
placeholder recall uses, because a listing may well end up in a prompt.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import ColumnElement, and_, or_

from contracts.governance import EntryView, GetReply, GetRequest, ListRequest, Page
from services.governance_audit.paging import PageQuery, read_page
from services.governance_audit.views import entry_view, load_entry
from shared import audit
from shared.access import Caller, target_key
from shared.config_store import require_known_agent_config
from shared.db.engine import Database
from shared.db.models import ENTRIES
from shared.entries import EntryStore, in_scope
from shared.page_tokens import PageTokens
from shared.tenancy import SHARED_POOL

__all__ = ["get_entry", "list_entries"]


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
    if request.page_token is None:  # a page token was issued for a known one
        async with db.read() as session:
            await require_known_agent_config(session, caller.org_id, agent_config_id)
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
        "metadata": request.metadata,
        "page_size": request.page_size,
        "principal": caller.ref,
    }
    conditions: list[ColumnElement[bool]] = [
        in_scope(caller.org_id, agent_config_id, keys, session_id=session_id),
        ENTRIES.c.lifecycle.in_(request.lifecycle or ["active"]),
    ]
    if request.layer is not None:
        conditions.append(ENTRIES.c.layer == request.layer)
    if request.memory_types is not None:
        conditions.append(ENTRIES.c.memory_type.in_(request.memory_types))
    if request.min_importance is not None:
        conditions.append(ENTRIES.c.importance >= request.min_importance)
    if request.metadata is not None:
        # JSONB containment, served by the GIN index on metadata (migration 0008).
        conditions.append(ENTRIES.c.metadata.contains(request.metadata))
    return await read_page(
        db,
        pages,
        caller,
        PageQuery(
            purpose="list",
            filters=filters,
            conditions=conditions,
            order_by=(ENTRIES.c.importance.desc(), ENTRIES.c.created_at.desc(), ENTRIES.c.id),
            after=_after,
            position=lambda last: {
                "i": last.importance,
                "c": last.created_at.isoformat(),
                "id": str(last.id),
            },
            page_size=request.page_size,
            page_token=request.page_token,
            audit_kind="memory.listed",
            audit_details={"owners": list(keys)},
            agent_config_id=agent_config_id,
            session_id=session_id,
            show_quarantined=caller.is_admin,
        ),
    )


def _position(last: Any) -> dict[str, Any]:
    return {"i": last.importance, "c": last.created_at.isoformat(), "id": str(last.id)}


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
    caller.credential.require("memory.read")
    async with db.transaction() as session:
        entries = EntryStore(session)
        row = await load_entry(entries, caller, request.entry_id, request.agent_config_id)
        show = caller.is_admin
        history: list[EntryView] = []
        if request.history:
            previous = row.supersedes
            while previous is not None and len(history) < 100:
                # Versions share the entry's agent config; rescope moves them with it.
                older = await entries.get(caller.org_id, request.agent_config_id, previous)
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
