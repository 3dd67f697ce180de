"""The embed service's work: entries announced on ``memory.written`` get a vector; entries
announced on ``memory.purged`` lose it. Postgres is the source of truth: the text is read from
it (events carry none), and an entry no longer there is never indexed — so a late or replayed
``memory.written`` cannot bring a purged memory back into the vector store."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import JSON, Float, and_, func, literal_column, select, update

from contracts.errors import EmbeddingDimensionMismatch
from shared.db.engine import Database
from shared.db.models import ENTRIES, LEXICAL_SCOPES
from shared.lexical import document_weights
from shared.ports import Embedder, VectorIndex, VectorPoint

__all__ = ["IndexOutcome", "index_entries", "index_rows", "load_pending"]

log = logging.getLogger(__name__)

#: Each entry's lexemes and their frequencies, as the Postgres BM25 leg counts them.
_TERMS = literal_column(
    "(SELECT json_object_agg(u.lexeme, coalesce(cardinality(u.positions), 1)) "
    "FROM unnest(memory_entries.search) u)",
    JSON,
).label("terms")
#: The average entry length (distinct lexemes) in the entry's owner scope, now.
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


class IndexOutcome:
    def __init__(self) -> None:
        self.indexed = 0
        self.skipped = 0
        self.failed = 0


async def index_entries(
    db: Database,
    embedder: Embedder,
    index: VectorIndex,
    ids: Sequence[UUID],
    *,
    force: bool = False,
) -> IndexOutcome:
    """Embed and index the given entries that exist and are not indexed yet by ``embedder`` (all
    with ``force``).

    Raises ``Unavailable`` when the embedder or the vector store is down (the caller retries).
    """
    todo, skipped = await load_pending(db, embedder, ids, force=force)
    outcome = await index_rows(db, embedder, index, todo)
    outcome.skipped += skipped
    return outcome


async def load_pending(
    db: Database, embedder: Embedder, ids: Sequence[UUID], *, force: bool = False
) -> tuple[list[Any], int]:
    """The rows of ``ids`` still to embed (all existing ones with ``force``), and how many were
    skipped (gone, or already indexed by this embedder). An entry another embedder indexed is
    embedded again: its vector is in that embedder's collection, not in this one."""
    unique = list(dict.fromkeys(ids))
    if not unique:
        return [], 0
    async with db.read() as session:
        rows = (await session.execute(_LOAD.where(ENTRIES.c.id.in_(unique)))).all()
    made_by = (embedder.name, embedder.dimension)
    todo = [
        r
        for r in rows
        if force or r.embedding_status != "indexed" or (r.embedding_model, r.embedding_dimension) != made_by
    ]
    return todo, len(unique) - len(todo)


async def index_rows(
    db: Database, embedder: Embedder, index: VectorIndex, todo: Sequence[Any]
) -> IndexOutcome:
    """Embed ``todo`` (rows from :func:`load_pending`), upsert their vectors, mark them indexed."""
    outcome = IndexOutcome()
    if not todo:
        return outcome
    try:
        vectors = await embedder.embed([r.text for r in todo])
    except EmbeddingDimensionMismatch:
        # Not retried: the same model will answer the same way. Marked so an operator sees it.
        await _mark(db, [r.id for r in todo], "failed")
        outcome.failed = len(todo)
        log.error("embedder answered with the wrong dimension; %d entries not indexed", len(todo))
        return outcome
    await index.upsert([_point(r, v) for r, v in zip(todo, vectors, strict=True)])
    done = [r.id for r in todo]
    still_there = await _mark(db, done, "indexed", made_by=embedder)
    # Purged while we were embedding: its purge may have run before our upsert, so undo it here.
    vanished = set(done) - still_there
    if vanished:
        await index.delete(list(vanished))
    outcome.indexed = len(still_there)
    return outcome


def _point(row: object, vector: list[float]) -> VectorPoint:
    created: datetime = row.created_at  # type: ignore[attr-defined]
    return VectorPoint(
        id=row.id,  # type: ignore[attr-defined]
        vector=vector,
        org_id=row.org_id,  # type: ignore[attr-defined]
        agent_config_id=row.agent_config_id,  # type: ignore[attr-defined]
        owner_key=row.owner_key,  # type: ignore[attr-defined]
        layer=row.layer,  # type: ignore[attr-defined]
        memory_type=row.memory_type,  # type: ignore[attr-defined]
        session_id=row.session_id,  # type: ignore[attr-defined]
        created_at=created.timestamp(),
        lexical=document_weights(
            row.terms or {},  # type: ignore[attr-defined]
            # an inactive entry is not counted in its scope: its own length then
            row.avg_len or len(row.terms or {}) or 1.0,  # type: ignore[attr-defined]
        ),
    )


async def _mark(db: Database, ids: list[UUID], status: str, *, made_by: Embedder | None = None) -> set[UUID]:
    """Set ``embedding_status`` (and which embedder made the vector); returns the ids whose rows
    still exist."""
    values: dict[str, Any] = {"embedding_status": status}
    if made_by is not None:
        values.update(embedding_model=made_by.name, embedding_dimension=made_by.dimension)
    async with db.transaction() as session:
        result = await session.execute(
            update(ENTRIES).where(ENTRIES.c.id.in_(ids)).values(**values).returning(ENTRIES.c.id)
        )
        return {row[0] for row in result}
