"""``engram.memory.export`` (SPEC 7.2): one owner's memory in pages, oldest first.

Every page is a new request: the token is verified and the caller authorized again, and the page
token — signed over caller, organization, filters, position and expiry — only says where to go on.
Each page is an audit record (``memory.exported``) naming the ids it disclosed. A quarantined
entry is exported flagged ``quarantined``, its text and metadata withheld as in a listing, unless
the caller holds ``memory.admin`` (docs/adr/0021-quarantine.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncSession

from contracts.errors import InvalidRequest
from contracts.governance import ExportRequest, Page
from services.governance_audit.paging import PageQuery, read_page
from shared.security.access import Caller, target_key
from shared.security.page_tokens import PageTokens
from shared.storage.db.engine import Database
from shared.storage.entries import Entry, listing

__all__ = ["export_page"]


async def export_page(db: Database, pages: PageTokens, caller: Caller, request: ExportRequest) -> Page:
    key = target_key(request.actor_ref)
    caller.require("read", key)
    agent_config_id = request.agent_config_id
    session_id = caller.session_only
    filters = {
        "agent_config_id": str(agent_config_id) if agent_config_id else None,
        "owner": key,
        "lifecycle": request.lifecycle,
        "page_size": request.page_size,
        "session_id": session_id,
        "principal": caller.ref,
    }
    where = listing.exported(
        caller.org_id, agent_config_id, key, session_id=session_id, lifecycle=request.lifecycle
    )

    async def read(session: AsyncSession, position: dict[str, Any] | None, limit: int) -> list[Entry]:
        return await listing.by_creation(session, where, _after(position), limit)

    return await read_page(
        db,
        pages,
        caller,
        PageQuery(
            purpose="export",
            filters=filters,
            read=read,
            position=lambda last: {"c": last.created_at.isoformat(), "id": str(last.id)},
            page_size=request.page_size,
            page_token=request.page_token,
            audit_kind="memory.exported",
            audit_details={"owner": request.actor_ref, "continued": request.page_token is not None},
            agent_config_id=agent_config_id,
            session_id=session_id,
            show_quarantined=caller.is_admin,
        ),
    )


def _after(pos: dict[str, Any] | None) -> listing.ByCreation | None:
    """Where an export's page token says the next page starts."""
    if pos is None:
        return None
    try:
        return listing.ByCreation(datetime.fromisoformat(str(pos["c"])), UUID(str(pos["id"])))
    except (KeyError, ValueError, TypeError):
        raise InvalidRequest("invalid page token") from None
