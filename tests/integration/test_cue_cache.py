"""The cue-vector cache: shared through Redis, and answers are the same with Redis present,
flushed or absent (losing Redis loses nothing)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import UUID

import pytest
import redis.asyncio as redis_asyncio
from nats.aio.client import Client

from shared.cache import CueVectorCache
from shared.embedders.hashing import HashingEmbedder
from shared.infra import Infra
from tests.platform import eventually, request

pytestmark = pytest.mark.integration

REDIS_URL = "redis://127.0.0.1:6379/15"


@pytest.fixture
async def redis_db() -> AsyncIterator[redis_asyncio.Redis]:
    client = redis_asyncio.from_url(REDIS_URL)
    try:
        await client.ping()
    except Exception:
        pytest.skip("no Redis at 127.0.0.1:6379 (the machine's Redis; CI starts it)")
    await client.flushdb()
    yield client
    await client.flushdb()
    await client.aclose()


async def test_vectors_are_shared_through_redis(redis_db: redis_asyncio.Redis) -> None:
    """A vector put by one instance is found by another through Redis, bit for bit (float32)."""
    one, two = CueVectorCache("m", redis_url=REDIS_URL), CueVectorCache("m", redis_url=REDIS_URL)
    vector = (await HashingEmbedder().embed(["the deploy quota"]))[0]
    await one.put("the deploy quota", vector)
    got = await two.get("the deploy quota")
    assert got is not None
    assert got == pytest.approx(vector, abs=1e-7)
    assert await two.get("another cue") is None
    assert await redis_db.dbsize() == 1
    await one.close()
    await two.close()


async def test_redis_down_is_a_miss_not_an_error() -> None:
    """With Redis unreachable, get misses and put keeps the vector in-process."""
    cache = CueVectorCache("m", redis_url="redis://127.0.0.1:1/0")
    assert await cache.get("cue") is None
    await cache.put("cue", [0.5, 0.5])
    assert await cache.get("cue") == [0.5, 0.5]
    await cache.close()


async def test_answers_do_not_depend_on_the_cache(
    engram: Infra, nc: Client, org: UUID, agent: UUID, service_token: str, redis_db: redis_asyncio.Redis
) -> None:
    """The same hybrid recall gives the same results cold, warm, and after Redis is flushed."""
    for text in ("The deploy needs the VPN.", "Quota errors come from region r3.", "Alice likes tea."):
        await request(
            nc,
            "engram.memory.save",
            {"agent_config_id": str(agent), "wait": True, "content": text},
            service_token,
        )

    async def ask() -> list[tuple[str, float]]:
        reply = await request(
            nc,
            "engram.recall",
            {"agent_config_id": str(agent), "strategy": "hybrid", "cue": "deploy quota region", "top_k": 3},
            service_token,
        )
        return [(r["id"], round(r["score"], 9)) for r in reply["results"]]

    async def indexed() -> bool:
        reply = await request(
            nc,
            "engram.recall",
            {"agent_config_id": str(agent), "strategy": "semantic", "cue": "anything", "top_k": 5},
            service_token,
        )
        return reply.get("count") == 3

    await eventually(indexed, what="three entries indexed")
    cold = await ask()
    warm = await ask()
    await redis_db.flushdb()
    flushed = await ask()
    assert [i for i, _ in cold] == [i for i, _ in warm] == [i for i, _ in flushed]
