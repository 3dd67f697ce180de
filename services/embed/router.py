"""embed's subscribers: ``memory.written`` → vectors, ``memory.purged`` → no vectors."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable
from typing import Annotated

from faststream import AckPolicy, Context
from faststream.nats import ConsumerConfig, JStream, NatsRouter, PullSub
from faststream.nats.message import NatsBatchMessage
from nats.aio.msg import Msg
from nats.errors import MsgAlreadyAckdError

from contracts.subjects import MEMORY_PURGED, MEMORY_WRITTEN
from services.embed.indexer import index_entries, parse_purged, parse_written
from shared.infra import Infra
from shared.ports import Embedder, VectorIndex

__all__ = ["build_router"]

log = logging.getLogger(__name__)


def build_router(infra: Infra, embedder: Embedder, index: VectorIndex) -> NatsRouter:
    router = NatsRouter()
    stream = JStream("ENGRAM_MEMORY", declare=False)
    # An embedder or vector store outage is retried until it ends; nothing here is bad input.
    consumer = ConsumerConfig(ack_wait=infra.settings.ack_wait_s, max_deliver=-1)

    async def settle(raw: list[Msg], work: Awaitable[object]) -> None:
        try:
            await work
        except Exception:
            for m in raw:
                with contextlib.suppress(MsgAlreadyAckdError):
                    await m.nak(delay=infra.backoff(m.metadata.num_delivered))
            raise
        for m in raw:
            await m.ack()

    @router.subscriber(
        MEMORY_WRITTEN,
        stream=stream,
        durable="embed",
        # Embedding models are fastest in batches; the timeout bounds a lone entry's wait.
        pull_sub=PullSub(batch_size=256, timeout=0.02, batch=True),
        ack_policy=AckPolicy.MANUAL,
        config=consumer,
        title="embed:memory.written",
    )
    async def on_written(msg: Annotated[NatsBatchMessage, Context("message")]) -> None:
        """Embed and index written entries (a reinforcement of an indexed entry changes nothing)."""
        raw: list[Msg] = msg.raw_message
        ids = parse_written([m.data for m in raw])
        await settle(raw, index_entries(infra.db, embedder, index, ids))

    @router.subscriber(
        MEMORY_PURGED,
        stream=stream,
        durable="embed-purge",
        pull_sub=PullSub(batch_size=256, timeout=0.02, batch=True),
        ack_policy=AckPolicy.MANUAL,
        config=consumer,
        title="embed:memory.purged",
    )
    async def on_purged(msg: Annotated[NatsBatchMessage, Context("message")]) -> None:
        """Delete the vectors of purged and pruned entries."""
        raw: list[Msg] = msg.raw_message
        await settle(raw, index.delete(parse_purged([m.data for m in raw])))

    return router
