"""Which embedder made the indexed entries' vectors, and whether another one made some.

Every indexed entry records the embedder (name and dimension) that made its vector
(``memory_entries.embedding_model`` / ``embedding_dimension``). Each embedder has its own
collection, so vectors of two models are never compared; but after the deployment's embedder
changes, the entries that the old one embedded are missing from the new collection until
``engram reindex`` re-embeds them. This module finds them: the embed service logs them at start,
and recall warns (``semantic_index_incomplete``) while any remain.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachetools import TTLCache
from sqlalchemy import ColumnElement, and_, exists, func, or_, select

from shared.db.engine import Database
from shared.db.models import ENTRIES
from shared.ports import Embedder

__all__ = ["ForeignVectors", "VectorCoverage", "foreign_vectors"]


@dataclass(frozen=True)
class ForeignVectors:
    """Indexed entries whose vector another embedder made (``None``: unknown, indexed before the
    model was recorded)."""

    model: str | None
    dimension: int | None
    entries: int


def _made_by_another(embedder: Embedder) -> ColumnElement[bool]:
    e = ENTRIES.c
    # "<" or ">" rather than "<>": each is a range of the partial index ix_memory_entries_embedded_with,
    # so the check costs a few index probes however many entries there are.
    return and_(
        e.embedding_status == "indexed",
        or_(
            e.embedding_model.is_(None),
            e.embedding_model < embedder.name,
            e.embedding_model > embedder.name,
            and_(
                e.embedding_model == embedder.name,
                or_(e.embedding_dimension.is_(None), e.embedding_dimension != embedder.dimension),
            ),
        ),
    )


async def foreign_vectors(db: Database, embedder: Embedder) -> list[ForeignVectors]:
    """The indexed entries that ``embedder`` did not embed, counted per model, most first."""
    e = ENTRIES.c
    stmt = (
        select(e.embedding_model, e.embedding_dimension, func.count())
        .where(_made_by_another(embedder))
        .group_by(e.embedding_model, e.embedding_dimension)
        .order_by(func.count().desc())
    )
    async with db.read() as session:
        rows = (await session.execute(stmt)).all()
    return [ForeignVectors(model, dimension, int(count)) for model, dimension, count in rows]


class VectorCoverage:
    """Whether every indexed entry's vector is ``embedder``'s, asked at most once per ``ttl_s``
    (a reindex in another process is noticed within it)."""

    def __init__(self, db: Database, embedder: Embedder, *, ttl_s: float = 30.0) -> None:
        self._db = db
        self._embedder = embedder
        # One answer, asked again once it is ``ttl_s`` old.
        self._answer: TTLCache[str, bool] = TTLCache(maxsize=1, ttl=ttl_s)

    async def complete(self) -> bool:
        known = self._answer.get("complete")
        if known is not None:
            return known
        query = select(exists().where(_made_by_another(self._embedder)))
        async with self._db.read() as session:
            complete = not (await session.execute(query)).scalar()
        self._answer["complete"] = complete
        return complete
