"""Caches in front of work that is pure: a cue's embedding depends only on the model and the
text, so a cached vector can never change an answer. Redis shares them between recall instances;
losing Redis (down, flushed, never configured) loses nothing but time (ARCHITECTURE 2)."""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections.abc import Sequence

from cachetools import LRUCache

from shared.observability.metrics import CACHE_REQUESTS

__all__ = ["CueVectorCache", "ResultCache"]

log = logging.getLogger(__name__)


class _OptionalRedis:
    """A Redis client when ``redis_url`` is set (short timeouts: a cache must never be slower than
    the work it saves), and one warning the first time it fails."""

    _when_down = "Redis unavailable"

    def __init__(self, redis_url: str, *, timeout_s: float = 0.2) -> None:
        self._redis = None
        self._warned = False
        if redis_url:
            import redis.asyncio as redis_asyncio  # only when configured

            self._redis = redis_asyncio.from_url(
                redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
            )

    def _degraded(self) -> None:
        if not self._warned:
            log.warning(self._when_down)
            self._warned = True

    async def _get_bytes(self, key: str) -> bytes | None:
        """The bytes Redis holds at ``key``; None without Redis, without the key, or when Redis
        fails (a miss, never an error)."""
        if self._redis is None:
            return None
        try:
            raw = await self._redis.get(key)
        except Exception:
            self._degraded()
            return None
        return raw if isinstance(raw, bytes) else None

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()


class CueVectorCache(_OptionalRedis):
    """An in-process LRU in front of an optional Redis (``redis_url``); every Redis failure is
    a miss, never an error."""

    _when_down = "Redis unavailable: cue vectors are cached in-process only"

    def __init__(
        self,
        model: str,
        *,
        redis_url: str = "",
        local_size: int = 10_000,
        ttl_s: int = 86_400,
        timeout_s: float = 0.2,
    ) -> None:
        super().__init__(redis_url, timeout_s=timeout_s)
        self._model = model
        self._local: LRUCache[str, list[float]] = LRUCache(maxsize=local_size)
        self._ttl = ttl_s

    def _key(self, text: str) -> str:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        return f"engram:cue-vector:{self._model}:{digest}"

    async def get(self, text: str) -> list[float] | None:
        vector = await self._lookup(text)
        CACHE_REQUESTS.labels("cue_vector", "miss" if vector is None else "hit").inc()
        return vector

    async def _lookup(self, text: str) -> list[float] | None:
        key = self._key(text)
        hit = self._local.get(key)
        if hit is not None:
            return hit
        raw = await self._get_bytes(key)
        if raw is None:
            return None
        vector = array("f")
        vector.frombytes(raw)
        values: list[float] = vector.tolist()
        self._local[key] = values
        return values

    async def put(self, text: str, vector: Sequence[float]) -> None:
        key = self._key(text)
        self._local[key] = list(vector)
        if self._redis is None:
            return
        try:
            await self._redis.set(key, array("f", vector).tobytes(), ex=self._ttl)
        except Exception:
            self._degraded()


# Atomic in Redis: store only if the generation is still the one read before computing.
_PUT_IF_CURRENT = """
local current = redis.call('GET', KEYS[1]) or '0'
if current ~= ARGV[1] then return 0 end
redis.call('SADD', KEYS[2], KEYS[3])
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[3])
return 1
"""
# Bump the generation (late puts are refused), then delete every cached copy.
_INVALIDATE = """
redis.call('INCR', KEYS[1])
local keys = redis.call('SMEMBERS', KEYS[2])
local n = 0
for i = 1, #keys, 500 do
  n = n + redis.call('DEL', unpack(keys, i, math.min(i + 499, #keys)))
end
redis.call('DEL', KEYS[2])
return n
"""


class ResultCache(_OptionalRedis):
    """Hot recall replies in Redis, per ``(organization, agent config)``, with their keys kept in
    a set so that an invalidation *deletes* every cached copy (a purge erases cached text too,
    and the receipt can count them).

    Redis only — no in-process layer — so that an invalidation by governance (another process) is
    seen by every recall instance at once. Without Redis nothing is cached and nothing is stale.
    Writes (``memory.written``) invalidate asynchronously, as they arrive; erasures invalidate
    synchronously before they answer. ``ttl_s`` bounds any copy an invalidation could not reach
    (Redis unreachable at that moment).
    """

    _when_down = "Redis unavailable: recall replies are not cached"

    def __init__(
        self,
        redis_url: str = "",
        *,
        ttl_s: int = 30,
        max_value_bytes: int = 256 * 1024,
        timeout_s: float = 0.2,
    ) -> None:
        super().__init__(redis_url, timeout_s=timeout_s)
        self._ttl = ttl_s
        self._max = max_value_bytes

    @property
    def enabled(self) -> bool:
        return self._redis is not None

    @staticmethod
    def _set_key(org_id: object, agent_config_id: object) -> str:
        return f"engram:recall-keys:{org_id}:{agent_config_id}"

    @staticmethod
    def key(org_id: object, agent_config_id: object, material: str) -> str:
        digest = hashlib.sha256(material.encode("utf-8")).hexdigest()
        return f"engram:recall:{org_id}:{agent_config_id}:{digest}"

    async def get(self, key: str) -> bytes | None:
        if self._redis is None:
            return None
        hit = await self._get_bytes(key)
        CACHE_REQUESTS.labels("recall_result", "miss" if hit is None else "hit").inc()
        return hit

    @staticmethod
    def _generation_key(org_id: object, agent_config_id: object) -> str:
        return f"engram:recall-gen:{org_id}:{agent_config_id}"

    async def generation(self, org_id: object, agent_config_id: object) -> bytes | None:
        """Read before computing a reply that will be :meth:`put`; None when Redis is away."""
        if self._redis is None:
            return None
        try:
            value = await self._redis.get(self._generation_key(org_id, agent_config_id))
        except Exception:
            self._degraded()
            return None
        return value if isinstance(value, bytes) else b"0"

    async def put(
        self,
        org_id: object,
        agent_config_id: object,
        key: str,
        value: bytes,
        ttl_s: float,
        generation: bytes | None,
    ) -> None:
        """Cache ``value`` unless an invalidation happened since ``generation`` was read: a reply
        computed from rows a purge has since erased must not be stored after the purge."""
        if self._redis is None or generation is None or len(value) > self._max:
            return
        ttl = max(1, min(self._ttl, int(ttl_s)))
        try:
            await self._redis.eval(
                _PUT_IF_CURRENT,
                3,
                self._generation_key(org_id, agent_config_id),
                self._set_key(org_id, agent_config_id),
                key,
                generation,
                value,
                ttl,
                self._ttl * 2,
            )
        except Exception:
            self._degraded()

    async def invalidate(self, org_id: object, agent_config_ids: Sequence[object]) -> int:
        """Delete every cached reply of these agent configs; returns how many were deleted."""
        if self._redis is None:
            return 0
        deleted = 0
        for agent_config_id in agent_config_ids:
            try:
                deleted += int(
                    await self._redis.eval(
                        _INVALIDATE,
                        2,
                        self._generation_key(org_id, agent_config_id),
                        self._set_key(org_id, agent_config_id),
                    )
                )
            except Exception:
                log.error("Redis unavailable: cached recall replies expire by TTL (%ss) instead", self._ttl)
        return deleted
