"""embed's subscribers: ``memory.written`` → vectors, ``memory.purged`` → no vectors.

Written entries go through a two-stage pipeline so that the embedding model never waits for
Postgres or NATS: the subscriber fetches a batch and loads its rows, then hands it to a worker
that embeds, upserts and marks it, and only then acknowledges. The hand-over queue holds one
batch, so while the model embeds batch N the subscriber already has batch N+1 loaded — and no
more than two batches are ever unacknowledged. Both are kept from redelivery by a heartbeat from
the moment they are fetched until they are settled: embedding can outlast the short ack_wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Sequence
from contextlib import AsyncExitStack
from typing import Annotated, Any

from faststream import AckPolicy, Context
from faststream.nats import JStream, NatsRouter, PullSub
from faststream.nats.message import NatsBatchMessage
from nats.aio.msg import Msg
from nats.errors import MsgAlreadyAckdError

from contracts.subjects import MEMORY_PURGED, MEMORY_WRITTEN
from services.embed.indexer import index_rows, load_pending, parse_purged, parse_written
from shared.bus import durable_config, heartbeat
from shared.infra import Infra
from shared.metrics import EMBED_BACKLOG, EMBEDDED
from shared.ports import Embedder, VectorIndex
from shared.provenance import refuse_forged
from shared.vectors.coverage import foreign_vectors

__all__ = ["EmbedPipeline", "build_router"]

log = logging.getLogger(__name__)


class EmbedPipeline:
    def __init__(self, infra: Infra, embedder: Embedder, index: VectorIndex) -> None:
        self._infra = infra
        self._embedder = embedder
        self._index = index
        self._queue: asyncio.Queue[tuple[list[Msg], Sequence[Any], AsyncExitStack] | None] = asyncio.Queue(
            maxsize=1
        )
        self._task: asyncio.Task[None] | None = None

    async def settle(self, raw: list[Msg], work: Awaitable[object]) -> bool:
        """Ack the batch when ``work`` succeeds, nak it (with backoff) when it fails."""
        try:
            await work
        except Exception:
            log.warning("a batch of %d failed; it will be redelivered", len(raw), exc_info=True)
            await self._retry_later(raw)
            return False
        for m in raw:
            await m.ack()
        return True

    async def _retry_later(self, raw: list[Msg]) -> None:
        for m in raw:
            with contextlib.suppress(MsgAlreadyAckdError):
                await m.nak(delay=self._infra.backoff(m.metadata.num_delivered))

    async def submit(self, raw: list[Msg]) -> None:
        """Load the batch's rows (nak on failure) and queue it; waits while one is queued."""
        ids = parse_written([m.data for m in raw])
        beating = AsyncExitStack()  # closed by the worker once the batch is settled
        await beating.enter_async_context(heartbeat(raw, self._infra.settings.ack_wait_s))
        try:
            todo, _ = await load_pending(self._infra.db, self._embedder, ids)
        except Exception:  # Postgres away: the batch comes back after the backoff
            await beating.aclose()
            log.warning("loading a batch of %d failed; it will be redelivered", len(raw), exc_info=True)
            await self._retry_later(raw)
            return
        EMBED_BACKLOG.inc(len(todo))
        await self._queue.put((raw, todo, beating))

    async def start(self) -> None:
        await self._warn_about_foreign_vectors()
        self._task = asyncio.create_task(self._run(), name="embed-pipeline")

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

    async def stop(self) -> None:
        """Finish what was handed over (the subscriber has stopped), then end the worker."""
        if self._task is None:
            return
        await self._queue.put(None)
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    async def _run(self) -> None:
        while (item := await self._queue.get()) is not None:
            raw, todo, beating = item
            try:
                await self.settle(raw, self._index_rows(todo))
            finally:
                await beating.aclose()
                EMBED_BACKLOG.dec(len(todo))

    async def _index_rows(self, todo: Sequence[Any]) -> None:
        outcome = await index_rows(self._infra.db, self._embedder, self._index, todo)
        EMBEDDED.inc(outcome.indexed)


def build_router(infra: Infra, pipeline: EmbedPipeline, index: VectorIndex) -> NatsRouter:
    router = NatsRouter()
    stream = JStream("ENGRAM_MEMORY", declare=False)
    # An embedder or vector store outage is retried until it ends; nothing here is bad input.
    consumer = durable_config(infra.settings.ack_wait_s)

    @router.subscriber(
        MEMORY_WRITTEN,
        stream=stream,
        durable="embed",
        # Embedding models are fastest in batches; the timeout bounds a lone entry's wait.
        inbox_prefix=infra.inbox_prefix,
        pull_sub=PullSub(batch_size=256, timeout=0.02, batch=True),
        ack_policy=AckPolicy.MANUAL,
        config=consumer,
        title="embed:memory.written",
    )
    async def on_written(msg: Annotated[NatsBatchMessage, Context("message")]) -> None:
        """Embed and index written entries (a reinforcement of an indexed entry changes nothing)."""
        genuine = await refuse_forged(infra, msg.raw_message, consumer="embed")
        if genuine:
            await pipeline.submit(genuine)

    @router.subscriber(
        MEMORY_PURGED,
        stream=stream,
        durable="embed-purge",
        inbox_prefix=infra.inbox_prefix,
        pull_sub=PullSub(batch_size=256, timeout=0.02, batch=True),
        ack_policy=AckPolicy.MANUAL,
        config=consumer,
        title="embed:memory.purged",
    )
    async def on_purged(msg: Annotated[NatsBatchMessage, Context("message")]) -> None:
        """Delete the vectors of purged and pruned entries."""
        # Only an erasure a service announced deletes vectors: a forged one is dead-lettered.
        raw: list[Msg] = await refuse_forged(infra, msg.raw_message, consumer="embed-purge")
        if raw and not await pipeline.settle(raw, index.delete(parse_purged([m.data for m in raw]))):
            raise RuntimeError("vector delete failed; redelivered")

    return router
