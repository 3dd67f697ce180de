"""``engram reindex``: rebuild every vector from Postgres, the source of truth. Only entries that
exist are embedded, so a purged memory cannot come back this way."""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

from services.embed.indexer import index_entries
from shared.ports import Embedder, VectorIndex
from shared.storage.db.engine import Database
from shared.storage.entries import indexing

__all__ = ["reindex_all"]


async def reindex_all(
    database_url: str,
    embedder: Embedder,
    index: VectorIndex,
    *,
    batch: int = 256,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    db = Database(database_url, pool_size=2)
    try:
        async with db.read() as session:
            total = await indexing.count_all(session)
        done = 0
        after: UUID | None = None
        while True:
            async with db.read() as session:
                ids = await indexing.ids_after(session, after, batch)
            if not ids:
                return done
            await index_entries(db, embedder, index, ids, force=True)
            done += len(ids)
            after = ids[-1]
            if progress is not None:
                progress(done, total)
    finally:
        await db.close()
