"""The SQL side of recall: every read is scoped by organization, agent config and the owner keys
the caller may see — the predicate is built in one place, so no strategy can forget a part of it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import ColumnElement, Select, and_, func, or_, select, text, union
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.recall import RecallFilters
from services.recall.candidates import Candidate
from shared.db.models import ENTRIES

__all__ = ["Scope", "by_ids", "lexical_ids", "newest", "pack_candidates", "top_importance"]

_COLUMNS = (
    ENTRIES.c.id,
    ENTRIES.c.text,
    ENTRIES.c.importance,
    ENTRIES.c.created_at,
    ENTRIES.c.updated_at,
    ENTRIES.c.memory_type,
    ENTRIES.c.layer,
    ENTRIES.c.session_id,
    ENTRIES.c.metadata,
    ENTRIES.c.pinned,
    ENTRIES.c.quarantined,
    ENTRIES.c.source,
    ENTRIES.c.reinforcement_count,
    ENTRIES.c.confidence,
    ENTRIES.c.reliability,
    ENTRIES.c.owner_key,
)


@dataclass(frozen=True)
class Scope:
    """Who may see what (SPEC 3) plus the request's narrowing (SPEC 5.5)."""

    org_id: UUID
    agent_config_id: UUID
    owner_keys: tuple[str, ...]
    now: datetime
    #: set when the config's scope is ``session``: only entries of exactly this session.
    session_only: str | None = None
    layer: str | None = None
    memory_types: tuple[str, ...] | None = None
    filters: RecallFilters | None = None

    def predicate(self) -> ColumnElement[bool]:
        if not self.owner_keys:
            raise ValueError("a scope without owner keys sees nothing; do not query")
        parts: list[ColumnElement[bool]] = [
            ENTRIES.c.org_id == self.org_id,
            ENTRIES.c.agent_config_id == self.agent_config_id,
            ENTRIES.c.owner_key.in_(self.owner_keys),
            ENTRIES.c.lifecycle == "active",
            or_(ENTRIES.c.expires_at.is_(None), ENTRIES.c.expires_at > self.now),
        ]
        if self.session_only is not None:
            parts.append(ENTRIES.c.session_id == self.session_only)
        if self.layer is not None:
            parts.append(ENTRIES.c.layer == self.layer)
        if self.memory_types is not None:
            parts.append(ENTRIES.c.memory_type.in_(self.memory_types))
        f = self.filters
        if f is not None:
            if f.memory_types is not None:
                parts.append(ENTRIES.c.memory_type.in_(f.memory_types))
            if f.min_importance is not None:
                parts.append(ENTRIES.c.importance >= f.min_importance)
            if f.min_confidence is not None:
                parts.append(ENTRIES.c.confidence >= f.min_confidence)
            if f.source is not None:
                parts.append(ENTRIES.c.source.in_(f.source))
            if f.source_agent is not None:
                parts.append(ENTRIES.c.source_agent == f.source_agent)
            if f.session_id is not None:
                parts.append(ENTRIES.c.session_id == f.session_id)
            if f.created_after is not None:
                parts.append(ENTRIES.c.created_at >= f.created_after)
            if f.created_before is not None:
                parts.append(ENTRIES.c.created_at < f.created_before)
        return and_(*parts)


def _candidates(rows: Sequence[Any]) -> list[Candidate]:
    return [
        Candidate(
            id=r.id,
            text=r.text,
            importance=r.importance,
            created_at=r.created_at,
            updated_at=r.updated_at,
            memory_type=r.memory_type,
            layer=r.layer,
            session_id=r.session_id,
            metadata=r.metadata,
            pinned=r.pinned,
            quarantined=r.quarantined,
            source=r.source,
            reinforcement_count=r.reinforcement_count,
            confidence=r.confidence,
            reliability=r.reliability,
            owner_key=r.owner_key,
        )
        for r in rows
    ]


async def _fetch(session: AsyncSession, stmt: Select[Any]) -> list[Candidate]:
    return _candidates((await session.execute(stmt)).all())


async def newest(session: AsyncSession, scope: Scope, limit: int) -> list[Candidate]:
    """Pinned first, then newest (``last_k``, ``full``)."""
    stmt = (
        select(*_COLUMNS)
        .where(scope.predicate())
        .order_by(ENTRIES.c.pinned.desc(), ENTRIES.c.created_at.desc(), ENTRIES.c.id)
        .limit(limit)
    )
    return await _fetch(session, stmt)


async def top_importance(session: AsyncSession, scope: Scope, limit: int) -> list[Candidate]:
    """Pinned first, then highest importance, then newest (``importance``)."""
    stmt = (
        select(*_COLUMNS)
        .where(scope.predicate())
        .order_by(
            ENTRIES.c.pinned.desc(), ENTRIES.c.importance.desc(), ENTRIES.c.created_at.desc(), ENTRIES.c.id
        )
        .limit(limit)
    )
    return await _fetch(session, stmt)


async def pack_candidates(session: AsyncSession, scope: Scope, each: int = 250) -> list[Candidate]:
    """SPEC 5.2: the ``each`` newest and the ``each`` highest-importance visible entries (union)."""
    ids_newest = (
        select(ENTRIES.c.id).where(scope.predicate()).order_by(ENTRIES.c.created_at.desc()).limit(each)
    )
    ids_important = (
        select(ENTRIES.c.id)
        .where(scope.predicate())
        .order_by(ENTRIES.c.importance.desc(), ENTRIES.c.created_at.desc())
        .limit(each)
    )
    ids = union(ids_newest, ids_important).subquery()
    stmt = select(*_COLUMNS).where(ENTRIES.c.id.in_(select(ids.c.id)))
    return await _fetch(session, stmt)


async def by_ids(session: AsyncSession, scope: Scope, ids: Sequence[UUID]) -> list[Candidate]:
    """The given entries that the scope allows (ids from a vector index are re-checked here)."""
    if not ids:
        return []
    stmt = select(*_COLUMNS).where(scope.predicate(), ENTRIES.c.id.in_(list(ids)))
    return await _fetch(session, stmt)


async def lexical_ids(session: AsyncSession, scope: Scope, cue: str, limit: int) -> list[UUID]:
    """Full-text ranking (English stemming): ids whose text shares any cue term, best first.

    Terms are OR-ed (a question rarely repeats every word of the answer) and ranked by
    ``ts_rank_cd`` normalized by document length, so long entries do not win by size alone.
    """
    query = func.to_tsquery("english", _or_query(cue))
    stmt = (
        select(ENTRIES.c.id)
        .where(scope.predicate(), ENTRIES.c.search.op("@@")(query))
        .order_by(func.ts_rank_cd(ENTRIES.c.search, query, text("1|32")).desc(), ENTRIES.c.created_at.desc())
        .limit(limit)
    )
    return [row[0] for row in (await session.execute(stmt)).all()]


def _or_query(cue: str) -> str:
    """A ``to_tsquery`` OR of the cue's words, each quoted as a plain lexeme (no operators from
    user input reach the query parser)."""
    words = [w for w in "".join(c if c.isalnum() else " " for c in cue.lower()).split() if len(w) > 1]
    if not words:
        return "''"
    return " | ".join(f"'{w}'" for w in dict.fromkeys(words))
