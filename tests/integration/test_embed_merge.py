"""embed's worker takes every loaded batch waiting in one embedding call
(docs/adr/0101-write-path-throughput.md): each entry is indexed once and every batch acked — and
when the merged call fails, each batch is worked alone, as if it had come by itself."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from uuid import UUID

import pytest
from nats.aio.client import Client
from sqlalchemy import func, select

from contracts.common import Principal
from contracts.config import MemoryConfig
from contracts.events import MemoryWritten
from services.distill.save_path import Draft, SaveContext, save_entries
from services.embed.router import EmbedPipeline
from shared.adapters.embedders.hashing import HashingEmbedder
from shared.adapters.vectors.qdrant_edge import QdrantEdgeIndex
from shared.service.consumer import Batch
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from shared.storage.db.models import MemoryEntry

pytestmark = pytest.mark.integration

PER_BATCH = 4
BATCHES = 3


class CountingEmbedder(HashingEmbedder):
    """The hashing embedder, noting how many texts each call got; it refuses calls of more than
    ``refuse_over`` texts (a model that fails on a large batch)."""

    def __init__(self, refuse_over: int | None = None) -> None:
        super().__init__(384)
        # Not the services' embedder: the embed service running beside the test (which may
        # index these entries too) never makes an entry look done to this one.
        self.name = "counting-384"
        self.calls: list[int] = []
        self.refuse_over = refuse_over

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(len(texts))
        if self.refuse_over is not None and len(texts) > self.refuse_over:
            raise RuntimeError("too many texts at once")
        return await super().embed(texts)


async def _saved(db: Database, org: UUID, agent: UUID) -> list[UUID]:
    ctx = SaveContext(
        org_id=org,
        agent_config_id=agent,
        owner=Principal(kind="none"),
        session_id=None,
        source="elective",
        requested_by="service:test",
    )
    drafts = [
        Draft(text=f"Release train {i} leaves from platform {i % 7}.", importance=0.5, memory_type="semantic")
        for i in range(PER_BATCH * BATCHES)
    ]
    async with db.transaction() as session:
        result = await save_entries(session, ctx, drafts, MemoryConfig())
    assert len(result.ids) == PER_BATCH * BATCHES
    return result.ids


async def _loaded_batches(
    infra: Infra, observer_nc: Client, org: UUID, agent: UUID, ids: list[UUID]
) -> tuple[list[Batch], str, str]:
    """The entries' memory.written events as BATCHES pulled batches of a stream of their own."""
    js = observer_nc.jetstream()
    stream, subject = f"WRITTEN_{org.hex[:8]}", f"test.written.{org.hex[:8]}"
    await js.add_stream(name=stream, subjects=[subject])
    for entry_id in ids:
        event = MemoryWritten(
            org_id=org,
            agent_config_id=agent,
            entry_id=entry_id,
            outcome="saved",
            owner=None,
            session_id=None,
            layer="memory",
            memory_type="semantic",
            source="elective",
            importance=0.5,
            version=1,
            quarantined=False,
        )
        await js.publish(subject, event.model_dump_json().encode())
    sub = await js.pull_subscribe(subject, durable="embed-merge", stream=stream)
    batches = []
    for _ in range(BATCHES):
        msgs = await sub.fetch(PER_BATCH, timeout=5)
        batch = Batch(infra, msgs, consumer="embed-merge", source="embed")
        batch.start()
        batches.append(batch)
    return batches, stream, "embed-merge"


async def _indexed(db: Database, org: UUID) -> int:
    async with db.read() as s:
        rows = await s.execute(
            select(func.count())
            .select_from(MemoryEntry)
            .where(MemoryEntry.org_id == org, MemoryEntry.embedding_status == "indexed")  # type: ignore[arg-type]
        )
        return int(rows.scalar_one())


@pytest.mark.parametrize(
    ("refuse_over", "calls"),
    [
        (None, [PER_BATCH * BATCHES]),  # the waiting batches in one call
        (PER_BATCH, [PER_BATCH * BATCHES] + [PER_BATCH] * BATCHES),  # merged refused: each alone
    ],
)
async def test_waiting_batches_are_embedded_together_each_entry_once(
    engram: Infra,
    observer_nc: Client,
    db: Database,
    org: UUID,
    agent: UUID,
    tmp_path: Path,
    refuse_over: int | None,
    calls: list[int],
) -> None:
    ids = await _saved(db, org, agent)
    embedder = CountingEmbedder(refuse_over)
    index = QdrantEdgeIndex(tmp_path / "vectors", embedder.dimension)
    pipeline = EmbedPipeline(engram, embedder, index)
    batches, stream, durable = await _loaded_batches(engram, observer_nc, org, agent, ids)
    try:
        for batch in batches:  # loaded and queued before the worker runs: all of them wait
            await pipeline.submit(batch)
        await pipeline.start()
        await pipeline.stop()  # the worker finishes what was handed over, then ends
        assert embedder.calls == calls
        assert await _indexed(db, org) == len(ids)
        assert await index.count() == len(ids)
        info = await observer_nc.jetstream().consumer_info(stream, durable)
        assert (info.num_ack_pending, info.num_pending) == (0, 0)
    finally:
        await index.close()
        await observer_nc.jetstream().delete_stream(stream)
