"""Changing the deployment's embedder: entries record which model embedded them, vectors of two
models never meet, the entries the old model embedded are detected (a start-up warning, and
``semantic_index_incomplete`` on recall) until ``engram reindex`` re-embeds them.

The switch is the real upgrade path: hashing-384 (the former default) to all-MiniLM-L6-v2. This
module has its own database, because the start-up check is deployment-wide and other modules'
entries must not count (recall's warning is per organization)."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from uuid import UUID, uuid4

import pytest
from nats.aio.client import Client
from sqlalchemy import select

from services.embed.indexer import index_entries
from services.reindex import reindex_all
from services.runtime import build_embedder, build_vector_index, running_services
from shared.adapters.embedders import HashingEmbedder, MiniLMEmbedder
from shared.adapters.vectors.coverage import ForeignVectors, VectorCoverage, foreign_vectors
from shared.runtime.settings import EngramSettings
from shared.storage.db.engine import Database
from shared.storage.db.models import ENTRIES
from tests.platform import eventually, request
from tests.support.servers import throwaway_database

pytestmark = pytest.mark.integration

TEXTS = (
    "The nightly backup failed because the disk on node 7 was full.",
    "Alice prefers store credit to card refunds.",
    "Deploys to production need a second approver on Fridays.",
)


@pytest.fixture
async def own_database(tmp_path: Path) -> AsyncIterator[str]:
    """A database of this test's own: the check is deployment-wide."""
    async with throwaway_database(os.environ.get("ENGRAM_TEST_DATABASE_URL"), tmp_path / "pg") as url:
        yield url


@pytest.fixture
def old_settings(settings: EngramSettings, own_database: str, tmp_path: Path) -> EngramSettings:
    return settings.model_copy(
        update={
            "database_url": own_database,
            "embedder": "hashing-384",
            "data_dir": tmp_path / "data",
            "redis_url": "",
        }
    )


@pytest.fixture
def new_settings(old_settings: EngramSettings) -> EngramSettings:
    return old_settings.model_copy(update={"embedder": "all-MiniLM-L6-v2"})


async def _made_by(database_url: str) -> dict[UUID, tuple[str | None, str | None, int | None]]:
    db = Database(database_url, pool_size=1)
    try:
        async with db.read() as session:
            rows = await session.execute(
                select(
                    ENTRIES.c.id,
                    ENTRIES.c.embedding_status,
                    ENTRIES.c.embedding_model,
                    ENTRIES.c.embedding_dimension,
                )
            )
            return {row[0]: (row[1], row[2], row[3]) for row in rows}
    finally:
        await db.close()


async def _save(nc: Client, token: str, agent: UUID, *texts: str) -> list[UUID]:
    body = {
        "agent_config_id": str(agent),
        "wait": True,
        "entries": [{"text": t, "importance": 0.5, "memory_type": "fact"} for t in texts],
    }
    reply = await request(nc, "engram.memory.save", body, token)
    assert reply["status"] == 200, reply
    return [UUID(i) for i in reply["ids"]]


async def _recall(nc: Client, token: str, agent: UUID, strategy: str, cue: str) -> dict[str, object]:
    body = {"agent_config_id": str(agent), "strategy": strategy, "cue": cue, "top_k": 10}
    return await request(nc, "engram.recall", body, token)


async def _all_indexed(database_url: str, ids: list[UUID], model: str) -> None:
    async def done() -> bool:
        made = await _made_by(database_url)
        return all(made.get(i, (None,))[:2] == ("indexed", model) for i in ids)

    await eventually(done, timeout=60, what=f"entries indexed by {model}")


async def test_an_embedder_switch_is_detected_until_reindex(
    old_settings: EngramSettings,
    new_settings: EngramSettings,
    nc: Client,
    agent: UUID,
    service_token: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Entries embedded by hashing-384 are reported after the switch to all-MiniLM-L6-v2 (a start-up
    warning naming `engram reindex`; semantic and hybrid answer with ``semantic_index_incomplete``,
    hybrid still finding them lexically); `engram reindex` re-embeds them with MiniLM, after which
    semantic recall finds them without the warning."""
    async with running_services(old_settings):
        old_ids = await _save(nc, service_token, agent, *TEXTS)
        await _all_indexed(old_settings.database_url, old_ids, "hashing-384")
    made = await _made_by(old_settings.database_url)
    assert {made[i] for i in old_ids} == {("indexed", "hashing-384", 384)}

    with caplog.at_level(logging.WARNING, logger="services.embed.router"):
        async with running_services(new_settings):
            warned = [r.getMessage() for r in caplog.records if "engram reindex" in r.getMessage()]
            assert len(warned) == 1
            assert "3 indexed entries" in warned[0]
            assert "all-MiniLM-L6-v2" in warned[0]
            assert "3 by hashing-384 (384-d)" in warned[0]

            hybrid = await _recall(nc, service_token, agent, "hybrid", "nightly backup disk full")
            assert "semantic_index_incomplete" in hybrid["warnings"]
            # Both legs are in MiniLM's vector store (the lexical one beside the dense vectors),
            # which holds none of them yet.
            assert hybrid["count"] == 0
            semantic = await _recall(nc, service_token, agent, "semantic", "backups that failed")
            assert "semantic_index_incomplete" in semantic["warnings"]
            assert semantic["count"] == 0  # MiniLM's collection holds none of them yet

            (new_id,) = await _save(nc, service_token, agent, "The VPN drops every night at 2am.")
            await _all_indexed(new_settings.database_url, [new_id], "all-MiniLM-L6-v2")

    embedder = build_embedder(new_settings)
    index = build_vector_index(new_settings, embedder)
    assert index is not None
    try:
        assert await reindex_all(new_settings.database_url, embedder, index) == 4
    finally:
        await index.close()
    made = await _made_by(new_settings.database_url)
    assert set(made.values()) == {("indexed", "all-MiniLM-L6-v2", 384)}

    async with running_services(new_settings):
        semantic = await _recall(nc, service_token, agent, "semantic", "backups that failed")
        assert semantic["warnings"] == []
        assert semantic["count"] == 4
        assert semantic["results"][0]["text"] == TEXTS[0]
        hybrid = await _recall(nc, service_token, agent, "hybrid", "nightly backup disk full")
        assert (hybrid["warnings"], hybrid["results"][0]["text"]) == ([], TEXTS[0])  # reindex made both legs


async def test_entries_another_embedder_indexed_are_embedded_again(
    old_settings: EngramSettings, nc: Client, org: UUID, agent: UUID, service_token: str
) -> None:
    """Without ``force``, indexing skips what this embedder already indexed but not what another
    one did; the coverage check follows (asked afresh each time with ``ttl_s=0``), for the
    organization whose entries they are and never for another."""
    async with running_services(old_settings):
        ids = await _save(nc, service_token, agent, *TEXTS)
        await _all_indexed(old_settings.database_url, ids, "hashing-384")
    db = Database(old_settings.database_url, pool_size=2)
    minilm = MiniLMEmbedder()
    index = build_vector_index(old_settings, minilm)
    assert index is not None
    try:
        coverage = VectorCoverage(db, minilm, ttl_s=0)
        assert not await coverage.complete(org)
        assert await coverage.complete(uuid4())  # another tenant's index is not this one's
        assert await foreign_vectors(db, minilm) == [ForeignVectors("hashing-384", 384, len(ids))]
        first = await index_entries(db, minilm, index, ids)
        assert (first.indexed, first.skipped) == (len(ids), 0)
        again = await index_entries(db, minilm, index, ids)
        assert (again.indexed, again.skipped) == (0, len(ids))
        assert await coverage.complete(org)
        assert await foreign_vectors(db, minilm) == []
        assert await foreign_vectors(db, HashingEmbedder(384)) == [
            ForeignVectors("all-MiniLM-L6-v2", 384, len(ids))
        ]
    finally:
        await index.close()
        await db.close()
