"""One page of entries for list and export: keyset pagination behind a signed page token, and the
audit record of what the page disclosed — written in the same transaction as the read."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncSession

from contracts.governance import Page
from services.governance_audit.views import entry_view
from shared.security.access import Caller
from shared.security.page_tokens import PageTokens
from shared.storage import audit
from shared.storage.db.engine import Database
from shared.storage.entries import Entry

__all__ = ["PageQuery", "read_page"]


@dataclass(frozen=True)
class PageQuery:
    """What a page sequence reads: ``filters`` are what its page tokens are bound to."""

    purpose: str
    filters: dict[str, Any]
    #: up to ``limit`` entries from a token's position (None: the first page) on, through the
    #: entry gateway (``shared.storage.entries.listing``); raises ``INVALID_REQUEST`` on a malformed one
    read: Callable[[AsyncSession, dict[str, Any] | None, int], Awaitable[list[Entry]]]
    #: the position a page's last entry leaves for the next token
    position: Callable[[Entry], dict[str, Any]]
    page_size: int
    page_token: str | None
    audit_kind: str
    audit_details: dict[str, Any]
    agent_config_id: UUID | None
    session_id: str | None
    #: a quarantined entry's text and metadata, shown to ``memory.admin`` callers only
    show_quarantined: bool


async def read_page(db: Database, pages: PageTokens, caller: Caller, query: PageQuery) -> Page:
    position = None
    if query.page_token is not None:
        position = pages.open(
            query.page_token,
            purpose=query.purpose,
            org_id=caller.org_id,
            caller=caller.ref,
            filters=query.filters,
        )
    async with db.transaction() as session:
        rows = await query.read(session, position, query.page_size + 1)
        more = len(rows) > query.page_size
        rows = rows[: query.page_size]
        entries = [entry_view(r, show_quarantined=query.show_quarantined) for r in rows]
        await audit.append(
            session,
            caller.org_id,
            [
                audit.AuditEntry(
                    kind=query.audit_kind,
                    actor_ref=caller.ref,
                    agent_config_id=query.agent_config_id,
                    session_id=query.session_id,
                    entry_ids=[e.id for e in entries],
                    details={**query.audit_details, "count": len(entries), **caller.via},
                )
            ],
        )
    token = None
    if more and rows:
        token = pages.issue(
            purpose=query.purpose,
            org_id=caller.org_id,
            caller=caller.ref,
            filters=query.filters,
            position=query.position(rows[-1]),
        )
    return Page(entries=entries, next_page_token=token)
