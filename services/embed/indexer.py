"""The embed service's work: entries announced on ``memory.written`` get a vector; entries
announced on ``memory.purged`` lose it. Postgres is the source of truth: the text is read from
it (events carry none), and an entry no longer there is never indexed — so a late or replayed
``memory.written`` cannot bring a purged memory back into the vector store."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from uuid import UUID

from contracts.errors import EmbeddingDimensionMismatch
from shared.ports import Embedder, VectorIndex, VectorPoint
from shared.storage.db.engine import Database
from shared.storage.entries import indexing
from shared.storage.entries.indexing import IndexRow
from shared.text.lexical import document_weights

__all__ = ["IndexOutcome", "index_entries", "index_rows", "load_pending"]

log = logging.getLogger(__name__)


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
) -> tuple[list[IndexRow], int]:
    """The rows of ``ids`` still to embed (all existing ones with ``force``), and how many were
    skipped (gone, or already indexed by this embedder). An entry another embedder indexed is
    embedded again: its vector is in that embedder's collection, not in this one."""
    unique = list(dict.fromkeys(ids))
    if not unique:
        return [], 0
    async with db.read() as session:
        rows = await indexing.load_for_index(session, unique)
    made_by = (embedder.name, embedder.dimension)
    todo = [
        r
        for r in rows
        if force or r.embedding_status != "indexed" or (r.embedding_model, r.embedding_dimension) != made_by
    ]
    return todo, len(unique) - len(todo)


async def index_rows(
    db: Database, embedder: Embedder, index: VectorIndex, todo: Sequence[IndexRow]
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


def _point(row: IndexRow, vector: list[float]) -> VectorPoint:
    return VectorPoint(
        id=row.id,
        vector=vector,
        org_id=row.org_id,
        agent_config_id=row.agent_config_id,
        owner_key=row.owner_key,
        layer=row.layer,
        memory_type=row.memory_type,
        session_id=row.session_id,
        created_at=row.created_at.timestamp(),
        lexical=document_weights(
            row.terms or {},
            # an inactive entry is not counted in its scope: its own length then
            row.avg_len or len(row.terms or {}) or 1.0,
        ),
    )


async def _mark(db: Database, ids: list[UUID], status: str, *, made_by: Embedder | None = None) -> set[UUID]:
    """Set ``embedding_status`` (and which embedder made the vector); returns the ids whose rows
    still exist."""
    async with db.transaction() as session:
        if made_by is None:
            return await indexing.mark(session, ids, status)
        return await indexing.mark(session, ids, status, model=made_by.name, dimension=made_by.dimension)
