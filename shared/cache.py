"""Caches in front of work that is pure: a cue's embedding depends only on the model and the
text, so a cached vector can never change an answer. Redis shares them between recall instances;
losing Redis (down, flushed, never configured) loses nothing but time (ARCHITECTURE 2)."""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["CueVectorCache"]

log = logging.getLogger(__name__)


class CueVectorCache:
    """An in-process LRU in front of an optional Redis (``redis_url``); every Redis failure is
    a miss, never an error."""

    def __init__(
        self, model: str, *, redis_url: str = "", local_size: int = 10_000, ttl_s: int = 86_400
    ) -> None:
        self._model = model
        self._local: OrderedDict[str, list[float]] = OrderedDict()
        self._local_size = local_size
        self._ttl = ttl_s
        self._redis = None
        self._warned = False
        if redis_url:
            import redis.asyncio as redis_asyncio  # only when configured

            self._redis = redis_asyncio.from_url(redis_url, socket_timeout=0.2, socket_connect_timeout=0.2)

    def _key(self, text: str) -> str:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        return f"engram:cue-vector:{self._model}:{digest}"

    async def get(self, text: str) -> list[float] | None:
        key = self._key(text)
        hit = self._local.get(key)
        if hit is not None:
            self._local.move_to_end(key)
            return hit
        if self._redis is None:
            return None
        try:
            raw = await self._redis.get(key)
        except Exception:
            self._degraded()
            return None
        if not isinstance(raw, bytes):
            return None
        vector = array("f")
        vector.frombytes(raw)
        self._remember(key, vector.tolist())
        return self._local[key]

    async def put(self, text: str, vector: Sequence[float]) -> None:
        key = self._key(text)
        self._remember(key, list(vector))
        if self._redis is None:
            return
        try:
            await self._redis.set(key, array("f", vector).tobytes(), ex=self._ttl)
        except Exception:
            self._degraded()

    def _remember(self, key: str, vector: list[float]) -> None:
        self._local[key] = vector
        self._local.move_to_end(key)
        while len(self._local) > self._local_size:
            self._local.popitem(last=False)

    def _degraded(self) -> None:
        if not self._warned:
            log.warning("Redis unavailable: cue vectors are cached in-process only")
            self._warned = True

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
