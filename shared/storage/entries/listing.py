"""Whole entries page by page, for inspection (``memory.list``) and export: the filters each
offers, and keyset pages in its order. Where a page starts is a typed position (the page
token's contents are the caller's: ``services.governance_audit``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from sqlalchemy import ColumnElement, and_, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.storage.db.models import ENTRIES
from shared.storage.entries.store import ENTRY_COLUMNS, Entry, entry, in_scope

__all__ = ["ByCreation", "ByImportance", "by_creation", "by_importance", "exported", "listed", "of_sessions"]


class ByImportance(NamedTuple):
    """A position in ``importance DESC, created_at DESC, id`` order (a listing's)."""

    importance: float
    created_at: datetime
    id: UUID


class ByCreation(NamedTuple):
    """A position in ``created_at, id`` order (an export's)."""

    created_at: datetime
    id: UUID


def listed(
    org_id: UUID,
    agent_config_id: UUID,
    owner_keys: Iterable[str],
    *,
    session_id: str | None,
    lifecycle: Sequence[str] | None,
    layer: str | None,
    memory_types: Sequence[str] | None,
    min_importance: float | None,
    metadata: dict[str, Any] | None,
) -> ColumnElement[bool]:
    """What a listing shows: the owners' entries (of ``session_id``), active ones unless
    ``lifecycle`` says otherwise, narrowed by the other filters given."""
    parts: list[ColumnElement[bool]] = [
        in_scope(org_id, agent_config_id, owner_keys, session_id=session_id),
        ENTRIES.c.lifecycle.in_(lifecycle or ["active"]),
    ]
    if layer is not None:
        parts.append(ENTRIES.c.layer == layer)
    if memory_types is not None:
        parts.append(ENTRIES.c.memory_type.in_(memory_types))
    if min_importance is not None:
        parts.append(ENTRIES.c.importance >= min_importance)
    if metadata is not None:
        # JSONB containment, served by the GIN index on metadata (migration 0008).
        parts.append(ENTRIES.c.metadata.contains(metadata))
    return and_(*parts)


def exported(
    org_id: UUID,
    agent_config_id: UUID | None,
    owner_key: str,
    *,
    session_id: str | None,
    lifecycle: Sequence[str] | None,
) -> ColumnElement[bool]:
    """What an export holds: every entry of the owner (of every agent config when None), in any
    lifecycle unless ``lifecycle`` narrows it."""
    where = in_scope(org_id, agent_config_id, (owner_key,), session_id=session_id)
    if lifecycle is not None:
        where = and_(where, ENTRIES.c.lifecycle.in_(lifecycle))
    return where


async def by_importance(
    session: AsyncSession, where: ColumnElement[bool], after: ByImportance | None, limit: int
) -> list[Entry]:
    """Up to ``limit`` entries matching ``where``, highest importance, then newest, first;
    after ``after`` when given."""
    c = ENTRIES.c
    if after is not None:
        same = c.importance == after.importance
        where = and_(
            where,
            or_(
                c.importance < after.importance,
                and_(same, c.created_at < after.created_at),
                and_(same, c.created_at == after.created_at, c.id > after.id),
            ),
        )
    return await _page(session, where, (c.importance.desc(), c.created_at.desc(), c.id), limit)


async def by_creation(
    session: AsyncSession, where: ColumnElement[bool], after: ByCreation | None, limit: int
) -> list[Entry]:
    """Up to ``limit`` entries matching ``where``, oldest first; after ``after`` when given."""
    c = ENTRIES.c
    if after is not None:
        where = and_(
            where,
            or_(c.created_at > after.created_at, and_(c.created_at == after.created_at, c.id > after.id)),
        )
    return await _page(session, where, (c.created_at, c.id), limit)


async def of_sessions(
    session: AsyncSession, org_ids: Iterable[UUID], session_ids: Iterable[str]
) -> list[Entry]:
    """Every entry the given sessions left in the given organizations (the demo's report), by
    organization, oldest first."""
    stmt = (
        select(*ENTRY_COLUMNS)
        .where(ENTRIES.c.org_id.in_(list(org_ids)), ENTRIES.c.session_id.in_(sorted(session_ids)))
        .order_by(ENTRIES.c.org_id, ENTRIES.c.created_at)
    )
    return [entry(r) for r in await session.execute(stmt)]


async def _page(
    session: AsyncSession, where: ColumnElement[bool], order_by: Sequence[Any], limit: int
) -> list[Entry]:
    stmt = select(*ENTRY_COLUMNS).where(where).order_by(*order_by).limit(limit)
    return [entry(r) for r in await session.execute(stmt)]
