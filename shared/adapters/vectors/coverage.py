"""Which embedder made the indexed entries' vectors, and whether another one made some.

Every indexed entry records the embedder (name and dimension) that made its vector (its
``embedding_model`` and ``embedding_dimension``, :mod:`shared.storage.entries.indexing`). Each embedder has
its own collection, so vectors of two models are never compared; but after the deployment's embedder
changes, the entries that the old one embedded are missing from the new collection until
``engram reindex`` re-embeds them. This module finds them: the embed service logs them at start
(deployment-wide), and recall warns (``semantic_index_incomplete``) while any of the asking
organization's remain — never because of another tenant's entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from cachetools import TTLCache

from shared.ports import Embedder
from shared.storage.db.engine import Database
from shared.storage.entries import indexing

__all__ = ["ForeignVectors", "VectorCoverage", "foreign_vectors"]


@dataclass(frozen=True)
class ForeignVectors:
    """Indexed entries whose vector another embedder made (``None``: unknown, indexed before the
    model was recorded)."""

    model: str | None
    dimension: int | None
    entries: int


async def foreign_vectors(db: Database, embedder: Embedder) -> list[ForeignVectors]:
    """The indexed entries that ``embedder`` did not embed, counted per model, most first."""
    async with db.read() as session:
        rows = await indexing.made_by_others(session, embedder.name, embedder.dimension)
    return [ForeignVectors(model, dimension, count) for model, dimension, count in rows]


class VectorCoverage:
    """Whether every indexed entry of an organization has ``embedder``'s vector, asked at most
    once per ``ttl_s`` per organization (a reindex in another process is noticed within it)."""

    def __init__(
        self, db: Database, embedder: Embedder, *, ttl_s: float = 30.0, organizations: int = 4096
    ) -> None:
        self._db = db
        self._embedder = embedder
        # One answer per organization, asked again once it is ``ttl_s`` old.
        self._answers: TTLCache[UUID, bool] = TTLCache(maxsize=organizations, ttl=ttl_s)

    async def complete(self, org_id: UUID) -> bool:
        known = self._answers.get(org_id)
        if known is not None:
            return known
        async with self._db.read() as session:
            complete = await indexing.only_made_by(
                session, org_id, self._embedder.name, self._embedder.dimension
            )
        self._answers[org_id] = complete
        return complete
