"""``engram.memory.list`` and ``engram.memory.get`` (SPEC 7.1): inspecting memory, audited.

Inspection is a disclosure like recall: every listed or fetched entry id goes on the record.
Quarantined text is shown only to ``memory.admin`` callers (who review it); others get the
placeholder recall uses, because a listing may well end up in a prompt.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncSession

from contracts.errors import InvalidRequest
from contracts.governance import EntryView, GetReply, GetRequest, ListRequest, Page
from services.governance_audit.paging import PageQuery, read_page
from services.governance_audit.views import entry_view, load_entry
from shared.security.access import Caller, target_key
from shared.security.page_tokens import PageTokens
from shared.security.tenancy import SHARED_POOL
from shared.storage import audit
from shared.storage.db.engine import Database
from shared.storage.entries import Entry, EntryStore, listing

__all__ = ["get_entry", "list_entries"]


def _readable_keys(caller: Caller, actor_ref: str | None) -> tuple[str, ...]:
    """The owner keys a list may read: the named owner (if allowed), or what the caller sees."""
    if actor_ref is not None:
        key = target_key(actor_ref)
        caller.require("read", key)
        return (key,)
    if caller.principal.kind == "actor":
        return (caller.own_key, SHARED_POOL)
    return (caller.own_key,)


async def list_entries(db: Database, pages: PageTokens, caller: Caller, request: ListRequest) -> Page:
    agent_config_id = request.agent_config_id
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
    where = listing.listed(
        caller.org_id,
        agent_config_id,
        keys,
        session_id=session_id,
        lifecycle=request.lifecycle,
        layer=request.layer,
        memory_types=request.memory_types,
        min_importance=request.min_importance,
        metadata=request.metadata,
    )

    async def read(session: AsyncSession, position: dict[str, Any] | None, limit: int) -> list[Entry]:
        return await listing.by_importance(session, where, _after(position), limit)

    return await read_page(
        db,
        pages,
        caller,
        PageQuery(
            purpose="list",
            filters=filters,
            read=read,
            position=_position,
            page_size=request.page_size,
            page_token=request.page_token,
            audit_kind="memory.listed",
            audit_details={"owners": list(keys)},
            agent_config_id=agent_config_id,
            session_id=session_id,
            show_quarantined=caller.is_admin,
        ),
    )


def _position(last: Entry) -> dict[str, Any]:
    return {"i": last.importance, "c": last.created_at.isoformat(), "id": str(last.id)}


def _after(pos: dict[str, Any] | None) -> listing.ByImportance | None:
    """Where a listing's page token says the next page starts."""
    if pos is None:
        return None
    try:
        return listing.ByImportance(
            float(pos["i"]), datetime.fromisoformat(str(pos["c"])), UUID(str(pos["id"]))
        )
    except (KeyError, ValueError, TypeError):
        raise InvalidRequest("invalid page token") from None


async def get_entry(db: Database, caller: Caller, request: GetRequest) -> GetReply:
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
