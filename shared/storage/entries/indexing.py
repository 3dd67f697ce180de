"""The embed service's reads and writes of entries: what an entry's vector is made from, which
embedder made the stored vectors, and the ``embedding_status`` columns (the indexer's own)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from sqlalchemy import JSON, ColumnElement, Float, and_, exists, func, literal_column, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from shared.storage.db.models import ENTRIES, LEXICAL_SCOPES

__all__ = ["IndexRow", "count_all", "ids_after", "load_for_index", "made_by_others", "mark", "only_made_by"]


class IndexRow(NamedTuple):
    """What an entry's vector point is made from, and who made the vector it has."""

    id: UUID
    text: str
    org_id: UUID
    agent_config_id: UUID
    owner_key: str
    layer: str
    memory_type: str
    session_id: str | None
    created_at: datetime
    embedding_status: str
    embedding_model: str | None
    embedding_dimension: int | None
    #: its lexemes and their frequencies, as the Postgres BM25 leg counts them
    terms: dict[str, int] | None
    #: the average entry length (distinct lexemes) in its owner scope now; None when it is not
    #: counted there (inactive)
    avg_len: float | None


_TERMS = literal_column(
    "(SELECT json_object_agg(u.lexeme, coalesce(cardinality(u.positions), 1)) "
    "FROM unnest(memory_entries.search) u)",
    JSON,
).label("terms")
_AVG_LEN = (
    select(func.cast(LEXICAL_SCOPES.c.lexemes, Float) / func.greatest(LEXICAL_SCOPES.c.docs, 1))
    .where(
        and_(
            LEXICAL_SCOPES.c.org_id == ENTRIES.c.org_id,
            LEXICAL_SCOPES.c.agent_config_id == ENTRIES.c.agent_config_id,
            LEXICAL_SCOPES.c.owner_key == ENTRIES.c.owner_key,
        )
    )
    .scalar_subquery()
    .label("avg_len")
)
_LOAD = select(
    ENTRIES.c.id,
    ENTRIES.c.text,
    ENTRIES.c.org_id,
    ENTRIES.c.agent_config_id,
    ENTRIES.c.owner_key,
    ENTRIES.c.layer,
    ENTRIES.c.memory_type,
    ENTRIES.c.session_id,
    ENTRIES.c.created_at,
    ENTRIES.c.embedding_status,
    ENTRIES.c.embedding_model,
    ENTRIES.c.embedding_dimension,
    _TERMS,
    _AVG_LEN,
)


async def load_for_index(session: AsyncSession, ids: Sequence[UUID]) -> list[IndexRow]:
    """The entries of ``ids`` that exist (in no particular order)."""
    return [IndexRow._make(r) for r in await session.execute(_LOAD.where(ENTRIES.c.id.in_(list(ids))))]


async def mark(
    session: AsyncSession,
    ids: Sequence[UUID],
    status: str,
    *,
    model: str | None = None,
    dimension: int | None = None,
) -> set[UUID]:
    """Set ``embedding_status`` (and, with ``model``, which embedder made the vector); returns the
    ids whose rows still exist."""
    values: dict[str, Any] = {"embedding_status": status}
    if model is not None:
        values.update(embedding_model=model, embedding_dimension=dimension)
    stmt = update(ENTRIES).where(ENTRIES.c.id.in_(list(ids))).values(**values).returning(ENTRIES.c.id)
    return {row[0] for row in await session.execute(stmt)}


async def count_all(session: AsyncSession) -> int:
    """Every entry of every organization (``engram reindex``'s progress)."""
    return int((await session.execute(select(func.count()).select_from(ENTRIES))).scalar_one())


async def ids_after(session: AsyncSession, after: UUID | None, limit: int) -> list[UUID]:
    """Up to ``limit`` entry ids in id order, after ``after`` (None: from the first)."""
    stmt = select(ENTRIES.c.id).order_by(ENTRIES.c.id).limit(limit)
    if after is not None:
        stmt = stmt.where(ENTRIES.c.id > after)
    return list((await session.execute(stmt)).scalars().all())


def _made_by_another(model: str, dimension: int) -> ColumnElement[bool]:
    e = ENTRIES.c
    # "<" or ">" rather than "<>": each is a range of the partial index on (embedding_model,
    # embedding_dimension), so the check costs a few index probes however many entries there are.
    return and_(
        e.embedding_status == "indexed",
        or_(
            e.embedding_model.is_(None),
            e.embedding_model < model,
            e.embedding_model > model,
            and_(
                e.embedding_model == model,
                or_(e.embedding_dimension.is_(None), e.embedding_dimension != dimension),
            ),
        ),
    )


async def made_by_others(
    session: AsyncSession, model: str, dimension: int
) -> list[tuple[str | None, int | None, int]]:
    """Indexed entries whose vector another embedder made, as ``(model, dimension, count)``,
    most first (None: unknown, indexed before the model was recorded)."""
    e = ENTRIES.c
    stmt = (
        select(e.embedding_model, e.embedding_dimension, func.count())
        .where(_made_by_another(model, dimension))
        .group_by(e.embedding_model, e.embedding_dimension)
        .order_by(func.count().desc())
    )
    return [(m, d, int(n)) for m, d, n in await session.execute(stmt)]


async def only_made_by(session: AsyncSession, org_id: UUID, model: str, dimension: int) -> bool:
    """Whether every indexed entry of the organization has this embedder's vector."""
    foreign = and_(ENTRIES.c.org_id == org_id, _made_by_another(model, dimension))
    return not (await session.execute(select(exists().where(foreign)))).scalar()
