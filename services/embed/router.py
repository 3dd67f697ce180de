"""embed's subscribers: ``memory.written`` → vectors, ``memory.purged`` → no vectors.

Written entries go through a two-stage pipeline so that the embedding model never waits for
Postgres or NATS: the subscriber fetches a batch and loads its rows, then hands it over to a
worker that embeds, upserts and marks it, and only then settles it. The hand-over queue holds a
few batches, so while the model embeds the subscriber goes on loading; the worker then takes
every batch waiting (up to :data:`MERGE_ROWS` rows) in one embedding call, one vector upsert and
one mark — under load the model gets big batches however the pulls happened to cut the stream
(docs/adr/0101-write-path-throughput.md). Every batch is kept from redelivery by its heartbeat
(``shared.service.consumer``) from the moment it is fetched until it is settled: embedding can outlast
the short ack_wait. Should the merged work fail, each batch is worked and settled on its own, as
if it had come alone (a batch that fails then is tried a message at a time).
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any

from faststream.nats import NatsRouter

from contracts.events import MemoryPurged, MemoryWritten
from contracts.operations import EMBED_PURGED, EMBED_WRITTEN
from services.embed.indexer import index_rows, load_pending
from shared.adapters.vectors.coverage import foreign_vectors
from shared.observability.metrics import EMBED_BACKLOG, EMBEDDED
from shared.ports import Embedder, VectorIndex
from shared.runtime.background import Worker
from shared.service.consumer import Batch, batch_consumer
from shared.service.infra import Infra

__all__ = ["MERGE_ROWS", "QUEUED_BATCHES", "EmbedPipeline", "build_router"]

log = logging.getLogger(__name__)

#: Loaded batches waiting for the worker (the subscriber waits when they are this many).
QUEUED_BATCHES = 4
#: The most rows the worker embeds in one call when it takes several waiting batches together.
MERGE_ROWS = 512

_Loaded = tuple[Batch, dict[int, Any]]


class EmbedPipeline(Worker):
    name = "embed-pipeline"

    def __init__(self, infra: Infra, embedder: Embedder, index: VectorIndex) -> None:
        super().__init__()
        self._infra = infra
        self._embedder = embedder
        self._index = index
        self._queue: asyncio.Queue[_Loaded | None] = asyncio.Queue(maxsize=QUEUED_BATCHES)

    async def submit(self, batch: Batch) -> None:
        """Load the batch's rows and queue it; waits while the queue is full. A failure to load is
        settled by the subscriber (``shared.service.consumer``: an outage comes back after the backoff)."""
        batch.hand_over()
        events = await batch.parse(MemoryWritten, what="memory.written event")
        todo, _ = await load_pending(self._infra.db, self._embedder, [event.entry_id for _, event in events])
        rows = {row.id: row for row in todo}
        # Each message's row (none when it needs no embedding): a message the worker must try
        # alone (shared.service.consumer) is embedded alone.
        by_message = {id(msg): rows[event.entry_id] for msg, event in events if event.entry_id in rows}
        EMBED_BACKLOG.inc(len(todo))
        await self._queue.put((batch, by_message))

    async def start(self) -> None:
        await self._warn_about_foreign_vectors()
        await super().start()

    async def _warn_about_foreign_vectors(self) -> None:
        """Say so when entries were indexed by another embedder: recall's semantic legs miss them
        (their vectors are in that embedder's collection) until ``engram reindex`` runs."""
        try:
            foreign = await foreign_vectors(self._infra.db, self._embedder)
        except Exception:  # a start-up courtesy: never the reason the service does not start
            log.warning("could not check which embedder made the stored vectors", exc_info=True)
            return
        if not foreign:
            return
        made_by = ", ".join(
            f"{f.entries} by {f.model or 'an unrecorded embedder'}"
            + (f" ({f.dimension}-d)" if f.dimension else "")
            for f in foreign
        )
        log.warning(
            "%d indexed entries were embedded by another model than %s (%s): semantic and hybrid "
            "recall leave them out, with the warning semantic_index_incomplete, until `engram "
            "reindex` re-embeds them",
            sum(f.entries for f in foreign),
            self._embedder.name,
            made_by,
        )

    async def request_stop(self) -> None:
        """Finish what was handed over (the subscriber has stopped), then end the worker."""
        await self._queue.put(None)

    async def run(self) -> None:
        while (item := await self._queue.get()) is not None:
            taken, stop = [item], False
            # Every batch waiting now, up to MERGE_ROWS rows: one embedding call for all of them.
            while not self._queue.empty() and _rows(taken) < MERGE_ROWS:
                more = self._queue.get_nowait()
                if more is None:
                    stop = True
                    break
                taken.append(more)
            try:
                await self._work(taken)
            finally:
                EMBED_BACKLOG.dec(
                    sum(len({row.id for row in by_message.values()}) for _, by_message in taken)
                )
            if stop:
                return

    async def _work(self, taken: list[_Loaded]) -> None:
        if len(taken) > 1:
            try:
                outcome = await index_rows(self._infra.db, self._embedder, self._index, _unique_rows(taken))
            except Exception:
                # Each batch on its own below: its failure is settled as it would have been alone.
                log.warning(
                    "embedding %d batches together failed; each is tried alone", len(taken), exc_info=True
                )
            else:
                EMBEDDED.inc(outcome.indexed)
                for batch, _ in taken:
                    await batch.settle(_indexed_already)
                return
        for batch, by_message in taken:
            await batch.settle(partial(self._index_each, by_message=by_message))

    async def _index_each(self, each: Batch, *, by_message: dict[int, Any]) -> None:
        # Each row once, though several messages (reinforcements) may name it.
        todo = {by_message[id(m)].id: by_message[id(m)] for m in each.msgs if id(m) in by_message}
        outcome = await index_rows(self._infra.db, self._embedder, self._index, list(todo.values()))
        EMBEDDED.inc(outcome.indexed)


async def _indexed_already(_: Batch) -> None:
    """The batch's rows were indexed with the others it was taken with: only its ack is left."""


def _rows(taken: list[_Loaded]) -> int:
    return sum(len(by_message) for _, by_message in taken)


def _unique_rows(taken: list[_Loaded]) -> list[Any]:
    """Each row of the taken batches once (several messages, even in different batches, may
    name one entry)."""
    return list({row.id: row for _, by_message in taken for row in by_message.values()}.values())


def build_router(infra: Infra, pipeline: EmbedPipeline, index: VectorIndex) -> NatsRouter:
    router = NatsRouter()
    # An embedder or vector store outage is retried until it ends; the streams are internal, so
    # a message no service signed is dead-lettered, and so is one that does not parse.

    # Embedding models are fastest in batches; the timeout bounds a lone entry's wait.
    @batch_consumer(router, infra, EMBED_WRITTEN)
    async def on_written(batch: Batch) -> None:
        await pipeline.submit(batch)

    @batch_consumer(router, infra, EMBED_PURGED)
    async def on_purged(batch: Batch) -> None:
        # Only an erasure a service announced deletes vectors (a forged one is dead-lettered).
        purged = await batch.parse(MemoryPurged, what="memory.purged event")
        await index.delete([entry_id for _, event in purged for entry_id in event.entry_ids])

    return router
