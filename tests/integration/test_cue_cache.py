"""The cue-vector cache: shared through Redis, and answers are the same with Redis present,
flushed or absent (losing Redis loses nothing)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from uuid import UUID, uuid4

import pytest
import redis.asyncio as redis_asyncio
from nats.aio.client import Client

from shared.adapters.embedders.hashing import HashingEmbedder
from shared.service.infra import Infra
from shared.storage.cache import CueVectorCache
from tests.conftest import TEST_REDIS_URL
from tests.platform import eventually, request

pytestmark = pytest.mark.integration

REDIS_URL = TEST_REDIS_URL


@pytest.fixture
async def redis_db() -> AsyncIterator[redis_asyncio.Redis]:
    client = redis_asyncio.from_url(REDIS_URL)
    try:
        await client.ping()
    except Exception:
        pytest.skip("no Redis at 127.0.0.1:6379 (the machine's Redis; CI starts it)")
    # Redis db 15 is shared by every test run on the machine: touch only this test's keys.
    yield client
    await client.aclose()


async def forget(redis_db: redis_asyncio.Redis, pattern: str) -> None:
    """Delete the keys matching ``pattern`` (never FLUSHDB: other runs' keys live here too)."""
    keys = [k async for k in redis_db.scan_iter(match=pattern)]
    if keys:
        await redis_db.delete(*keys)


async def test_vectors_are_shared_through_redis(redis_db: redis_asyncio.Redis) -> None:
    """A vector put by one instance is found by another through Redis, bit for bit (float32)."""
    model = f"test-{uuid4()}"  # a model name of its own: its keys are this test's alone
    # A generous timeout: what is tested is sharing through Redis, not the 0.2 s production timeout
    # (on a loaded host a connect can take longer, and a cache that times out rightly misses).
    one = CueVectorCache(model, redis_url=REDIS_URL, timeout_s=10)
    two = CueVectorCache(model, redis_url=REDIS_URL, timeout_s=10)
    vector = (await HashingEmbedder().embed(["the deploy quota"]))[0]
    await one.put("the deploy quota", vector)
    got = await two.get("the deploy quota")
    assert got is not None
    assert got == pytest.approx(vector, abs=1e-7)
    assert await two.get("another cue") is None
    assert len([k async for k in redis_db.scan_iter(match=f"engram:cue-vector:{model}:*")]) == 1
    await forget(redis_db, f"engram:cue-vector:{model}:*")
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
    # Cold again: this cue's vector and this organization's cached replies gone from Redis.
    digest = hashlib.sha256(b"deploy quota region").hexdigest()
    await forget(redis_db, f"engram:cue-vector:*:{digest}")
    await forget(redis_db, f"engram:recall*:{org}:*")
    flushed = await ask()
    assert [i for i, _ in cold] == [i for i, _ in warm] == [i for i, _ in flushed]
