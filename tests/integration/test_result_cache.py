"""The hot recall result cache (Redis): a hit equals a fresh answer and is still a disclosure;
writes and erasures invalidate it; a purge leaves no cached copy; without Redis nothing changes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import pytest
import redis.asyncio as redis_asyncio
from nats.aio.client import Client
from sqlalchemy import func, select

from contracts.common import Principal
from shared.security.auth import TokenService
from shared.service.infra import Infra
from shared.storage.cache import ResultCache
from shared.storage.db.engine import Database
from shared.storage.db.models import RECALLS
from tests.conftest import TEST_REDIS_URL
from tests.platform import eventually, request

pytestmark = pytest.mark.integration

REDIS_URL = TEST_REDIS_URL
ALICE = {"kind": "end_user", "id": "alice"}


@pytest.fixture
async def redis_db() -> AsyncIterator[redis_asyncio.Redis]:
    client = redis_asyncio.from_url(REDIS_URL)
    try:
        await client.ping()
    except Exception:
        pytest.skip("no Redis at 127.0.0.1:6379 (the machine's Redis; CI starts it)")
    yield client
    await client.aclose()


async def cached_keys(redis_db: redis_asyncio.Redis, org: UUID) -> list[bytes]:
    return [k async for k in redis_db.scan_iter(match=f"engram:recall:{org}:*")]


def without_pack(reply: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in reply.items() if k != "pack_id"}


async def save(nc: Client, token: str, agent: UUID, text: str) -> str:
    body = {"agent_config_id": str(agent), "principal": ALICE, "wait": True, "content": text}
    reply = await request(nc, "engram.memory.save", body, token)
    return str(reply["ids"][0])


async def test_a_hit_equals_a_fresh_answer_and_is_recorded(
    engram: Infra,
    nc: Client,
    db: Database,
    org: UUID,
    agent: UUID,
    service_token: str,
    redis_db: redis_asyncio.Redis,
) -> None:
    for text in ("Use the EU region.", "Builds need the VPN.", "Alice likes tea."):
        await save(nc, service_token, agent, text)
    ask = {"agent_config_id": str(agent), "principal": ALICE, "strategy": "importance", "token_budget": 500}
    replies: list[dict[str, Any]] = []

    async def cached() -> bool:
        # The saves' memory.written events may still be on their way: a reply read before one of
        # them lands is rightly not stored (the generation moved), so the next one caches.
        replies.append(await request(nc, "engram.recall", ask, service_token))
        return len(await cached_keys(redis_db, org)) == 1

    await eventually(cached, timeout=10, what="a recall reply cached")
    first = replies[-1]
    second = await request(nc, "engram.recall", ask, service_token)
    assert without_pack(second) == without_pack(first)
    assert second["pack_id"] != first["pack_id"]
    # Gone from Redis (only this organization's keys: other runs share db 15).
    stale = [k async for k in redis_db.scan_iter(match=f"engram:recall*:{org}:*")]
    await redis_db.delete(*stale)
    third = await request(nc, "engram.recall", ask, service_token)
    assert without_pack(third) == without_pack(first)

    async def recorded() -> bool:
        async with db.read() as s:
            n = (
                await s.execute(select(func.count()).select_from(RECALLS).where(RECALLS.c.org_id == org))
            ).scalar_one()
        return int(n) == len(replies) + 2

    await eventually(recorded, what="a recall record per recall, hits included")


async def test_a_write_invalidates_and_a_purge_leaves_no_cached_copy(
    engram: Infra,
    nc: Client,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    service_token: str,
    redis_db: redis_asyncio.Redis,
) -> None:
    await save(nc, service_token, agent, "First memory.")
    ask = {"agent_config_id": str(agent), "principal": ALICE, "strategy": "last_k"}

    async def cached_first() -> bool:
        assert (await request(nc, "engram.recall", ask, service_token))["count"] == 1
        return bool(await cached_keys(redis_db, org))

    await eventually(cached_first, timeout=10, what="the reply cached")
    new_id = await save(nc, service_token, agent, "Second memory.")

    async def sees_new() -> bool:
        reply = await request(nc, "engram.recall", ask, service_token)
        return new_id in [r["id"] for r in reply["results"]]

    await eventually(sees_new, timeout=10, what="memory.written invalidating the cached reply")

    # recall sees the new row once it commits, before its memory.written may have reached the
    # cache; a late invalidation would drop the copy cached below and leave the purge none to
    # count. Each write's event bumps the generation once: wait for both.
    cache = ResultCache(REDIS_URL, timeout_s=10)  # the production 0.2 s would miss on a loaded host

    async def both_writes_invalidated() -> bool:
        return int(await cache.generation(org, agent) or b"0") >= 2

    await eventually(both_writes_invalidated, timeout=10, what="both writes' invalidations applied")
    await cache.close()

    async def cached_again() -> bool:
        # A reply read before an invalidation that lands after it is rightly not stored (the
        # generation moved), so the next recall may be the one that caches.
        await request(nc, "engram.recall", ask, service_token)
        return bool(await cached_keys(redis_db, org))

    await eventually(cached_again, timeout=10, what="the reply cached again")
    purger = tokens.mint(
        org_id=org,
        principal=Principal(kind="end_user", id="alice"),
        permissions={"memory.purge", "memory.read"},
    )
    receipt = await request(
        nc, "engram.memory.purge", {"agent_config_id": str(agent), "actor_ref": "end_user:alice"}, purger
    )
    assert receipt["entries"] == 2
    assert receipt["cache_entries"] >= 1
    assert await cached_keys(redis_db, org) == []
    assert (await request(nc, "engram.recall", ask, service_token))["count"] == 0


async def test_a_put_after_an_invalidation_is_refused(redis_db: redis_asyncio.Redis) -> None:
    """A reply computed from rows read before a purge must not be stored after the purge."""
    cache = ResultCache(REDIS_URL, timeout_s=10)  # the production 0.2 s would miss on a loaded host
    org, agent = UUID(int=1), UUID(int=2)
    key = ResultCache.key(org, agent, "material")
    generation = await cache.generation(org, agent)
    await cache.invalidate(org, [agent])  # the purge lands while the reply is being computed
    await cache.put(org, agent, key, b"stale", 30, generation)
    assert await cache.get(key) is None
    fresh = await cache.generation(org, agent)
    await cache.put(org, agent, key, b"fresh", 30, fresh)
    assert await cache.get(key) == b"fresh"
    assert await cache.invalidate(org, [agent]) == 1
    assert await cache.get(key) is None
    await cache.close()


async def test_without_redis_nothing_is_cached_and_nothing_fails() -> None:
    cache = ResultCache("redis://127.0.0.1:1/0")
    org, agent = UUID(int=1), UUID(int=2)
    generation = await cache.generation(org, agent)
    assert generation is None
    await cache.put(org, agent, "k", b"v", 30, generation)
    assert await cache.get("k") is None
    assert await cache.invalidate(org, [agent]) == 0
    await cache.close()
