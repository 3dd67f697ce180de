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

from sqlalchemy import ColumnElement, and_, or_

from contracts.errors import InvalidRequest
from contracts.governance import ExportRequest, Page
from services.governance_audit.paging import PageQuery, read_page
from shared.access import Caller, target_key
from shared.config_store import require_known_agent_config
from shared.db.engine import Database
from shared.db.models import ENTRIES
from shared.entries import in_scope
from shared.page_tokens import PageTokens

__all__ = ["export_page"]


async def export_page(db: Database, pages: PageTokens, caller: Caller, request: ExportRequest) -> Page:
    key = target_key(request.actor_ref)
    caller.require("read", key)
    agent_config_id = caller.agent_config(request.agent_config_id)
    if agent_config_id is not None and request.page_token is None:  # later pages: known already
        async with db.read() as session:
            await require_known_agent_config(session, caller.org_id, agent_config_id)
    session_id = caller.session_only
    filters = {
        "agent_config_id": str(agent_config_id) if agent_config_id else None,
        "owner": key,
        "lifecycle": request.lifecycle,
        "page_size": request.page_size,
        "session_id": session_id,
        "principal": caller.ref,
    }
    conditions = [in_scope(caller.org_id, agent_config_id, (key,), session_id=session_id)]
    if request.lifecycle is not None:
        conditions.append(ENTRIES.c.lifecycle.in_(request.lifecycle))
    return await read_page(
        db,
        pages,
        caller,
        PageQuery(
            purpose="export",
            filters=filters,
            conditions=conditions,
            order_by=(ENTRIES.c.created_at, ENTRIES.c.id),
            after=_after,
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


def _after(pos: dict[str, Any]) -> ColumnElement[bool]:
    """Keyset continuation of ``created_at, id``."""
    try:
        created = datetime.fromisoformat(str(pos["c"]))
        last_id = UUID(str(pos["id"]))
    except (KeyError, ValueError, TypeError):
        raise InvalidRequest("invalid page token") from None
    return or_(ENTRIES.c.created_at > created, and_(ENTRIES.c.created_at == created, ENTRIES.c.id > last_id))
