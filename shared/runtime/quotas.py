"""Fair share between tenants: token buckets per organization (and per token) and operation class.

Every request-reply operation belongs to a class (``contracts.operations.Operation.quota_class``:
``read``, ``write``, ``governance``, ``sessions``; the deployment operator's are not limited), and a
published ``session.ended`` is a ``sessions`` charge when ingest takes it. A request over its
budget is ``RATE_LIMITED`` with ``details.retry_after_s`` (HTTP adds ``Retry-After``); a session over
it is dead-lettered with that reason (docs/adr/0084-quotas.md).

One budget per organization across replicas: the buckets live in Redis (``ENGRAM_REDIS_URL``), taken
by a Lua script that reads Redis's own clock (one clock for every replica). A replica leases a few
tokens at a time (about 20 ms of the rate) so that a request rarely pays a Redis round trip. Without
Redis — none configured, or unreachable — each process keeps the buckets itself: reads are let
through while Redis is down (fail open: a read changes nothing), writes, sessions and governance
are held to the per-process bucket (bounded: a replica cannot take more than one budget).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from pydantic import BaseModel, Field

from contracts.errors import RateLimited
from contracts.operations import QUOTA_CLASSES, QuotaClass

__all__ = ["QUOTA_CLASSES", "Limit", "QuotaClass", "QuotaSettings", "Quotas"]

log = logging.getLogger(__name__)

#: A lease covers this many seconds of a bucket's rate (at least one token).
_LEASE_S = 0.02
#: Leased tokens not used within this long go unused (the budget stays one budget).
_LEASE_TTL_S = 0.25


class Limit(BaseModel):
    """A token bucket: ``rate`` requests a second on average, up to ``burst`` at once."""

    rate: float = Field(gt=0, le=1_000_000)
    burst: float = Field(ge=1, le=10_000_000)


class QuotaSettings(BaseModel):
    """``ENGRAM_QUOTAS``: the budget of every organization, of every token, and per-organization
    overrides (a class left out of an override keeps the organization default)."""

    org: dict[QuotaClass, Limit] = Field(default_factory=dict)
    token: dict[QuotaClass, Limit] = Field(default_factory=dict)
    orgs: dict[UUID, dict[QuotaClass, Limit]] = Field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return bool(self.org or self.token or self.orgs)

    def org_limit(self, org_id: UUID, cls: QuotaClass) -> Limit | None:
        override = self.orgs.get(org_id, {})
        return override.get(cls) or self.org.get(cls)


# KEYS[1]: the bucket; ARGV: rate (tokens/s), burst, tokens wanted and, optionally, the time of
# the charge (ms since the epoch; else Redis's own clock). Returns {granted, wait_ms}: up to
# ``want`` tokens (all there are, when fewer), and when none, how long until one is there. A charge
# dated before the bucket's last one refills nothing and never moves its time back.
_TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1]) or burst
local ts = tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate / 1000)
local granted = math.min(want, math.floor(tokens))
tokens = tokens - granted
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', math.max(ts, now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
local wait = 0
if granted < 1 then wait = math.ceil((1 - tokens) * 1000 / rate) end
return {granted, wait}
"""


@dataclass
class _Bucket:
    """An in-process token bucket (no Redis, or Redis down)."""

    limit: Limit
    tokens: float
    at: float

    def take(self, now: float) -> float:
        """0 when a token was taken, else the seconds until one is there."""
        self.tokens = min(self.limit.burst, self.tokens + max(0.0, now - self.at) * self.limit.rate)
        self.at = max(self.at, now)
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.limit.rate


@dataclass
class _Lease:
    tokens: int = 0
    until: float = 0.0
    #: While Redis says the bucket is empty: when to ask again (nothing is taken before).
    empty_until: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Quotas:
    """Charges requests and sessions against their budgets (see the module docstring)."""

    def __init__(
        self,
        settings: QuotaSettings,
        *,
        redis_url: str = "",
        timeout_s: float = 0.2,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._local: dict[str, _Bucket] = {}
        self._leases: dict[str, _Lease] = {}
        #: Per bucket, until when (seconds since the epoch, the dated charges' clock) it is known
        #: to be empty: a dated charge refused says so, and :meth:`refused` reads it.
        self._empty_at: dict[str, float] = {}
        self._redis: Any = None
        self._script: Any = None
        self._warned = False
        if settings.enabled and redis_url:
            import redis.asyncio as redis_asyncio  # only when configured

            self._redis = redis_asyncio.from_url(
                redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
            )
            self._script = self._redis.register_script(_TAKE)

    @property
    def enabled(self) -> bool:
        return self._settings.enabled

    async def aclose(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    async def charge(
        self, cls: QuotaClass | None, org_id: UUID, token_id: str = "", *, at: float | None = None
    ) -> None:
        """Take one request of ``cls`` from the organization's budget and, when tokens have one,
        the token's; ``RATE_LIMITED`` (with ``retry_after_s``) when either is spent. ``at``: when
        the work was asked for (seconds since the epoch; a published session's stream time), so
        that a backlog consumed at once is judged by the rate it was published at."""
        if cls is None or not self._settings.enabled:
            return
        # The token's first: a token over its own budget does not spend its organization's.
        token_limit = self._settings.token.get(cls)
        if token_limit is not None and token_id:
            await self._take(f"token:{token_id}:{cls}", token_limit, cls, f"token's {cls} quota", at)
        org_limit = self._settings.org_limit(org_id, cls)
        if org_limit is not None:
            await self._take(f"org:{org_id}:{cls}", org_limit, cls, f"organization's {cls} quota", at)

    def refuse_known(self, cls: QuotaClass | None, org_id: UUID, token_id: str = "", *, at: float) -> None:
        """``RATE_LIMITED`` when a charge of ``cls`` dated ``at`` is already known here to be
        refused — without spending anything or asking Redis, so work can be refused before it is
        read: known from this process's own buckets, or from a dated charge Redis refused."""
        if cls is None or not self._settings.enabled:
            return
        token_limit = self._settings.token.get(cls)
        if token_limit is not None and token_id:
            wait = self._known_empty(f"token:{token_id}:{cls}", token_limit, at)
            if wait > 0:
                raise _refusal(wait, f"token's {cls} quota")
        org_limit = self._settings.org_limit(org_id, cls)
        if org_limit is not None:
            wait = self._known_empty(f"org:{org_id}:{cls}", org_limit, at)
            if wait > 0:
                raise _refusal(wait, f"organization's {cls} quota")

    def _known_empty(self, key: str, limit: Limit, at: float) -> float:
        if self._redis is None or key in self._local:  # this process keeps the bucket
            bucket = self._local.get(key)
            if bucket is None or bucket.limit != limit:
                return 0.0
            tokens = min(limit.burst, bucket.tokens + max(0.0, at - bucket.at) * limit.rate)
            return 0.0 if tokens >= 1 else (1 - tokens) / limit.rate
        return max(0.0, self._empty_at.get(key, 0.0) - at)

    async def _take(self, key: str, limit: Limit, cls: QuotaClass, what: str, at: float | None) -> None:
        wait = await (self._wait(key, limit, cls) if at is None else self._wait_at(key, limit, cls, at))
        if wait > 0:
            raise _refusal(wait, what)

    async def _wait(self, key: str, limit: Limit, cls: QuotaClass) -> float:
        if self._redis is None:
            return self._take_local(key, limit)
        lease = self._leases.setdefault(key, _Lease())
        now = self._clock()
        if lease.tokens > 0 and now < lease.until:
            lease.tokens -= 1
            return 0.0
        if now < lease.empty_until:
            return lease.empty_until - now
        async with lease.lock:
            now = self._clock()
            if lease.tokens > 0 and now < lease.until:
                lease.tokens -= 1
                return 0.0
            want = max(1, int(limit.rate * _LEASE_S))
            try:
                granted, wait_ms = await self._script(
                    keys=[f"engram:quota:{key}"], args=[limit.rate, limit.burst, want]
                )
            except Exception:
                self._degraded()
                # Fail open for reads; writes stay bounded by this process's own bucket.
                return 0.0 if cls == "read" else self._take_local(key, limit)
            now = self._clock()
            if int(granted) < 1:
                lease.tokens = 0
                lease.empty_until = now + int(wait_ms) / 1000
                return int(wait_ms) / 1000
            lease.tokens, lease.until = int(granted) - 1, now + _LEASE_TTL_S
            return 0.0

    async def _wait_at(self, key: str, limit: Limit, cls: QuotaClass, at: float) -> float:
        """One token as of ``at`` (no lease: a lease is of the present)."""
        if self._redis is None:
            return self._take_local(key, limit, at)
        try:
            granted, wait_ms = await self._script(
                keys=[f"engram:quota:{key}"], args=[limit.rate, limit.burst, 1, int(at * 1000)]
            )
        except Exception:
            self._degraded()
            return 0.0 if cls == "read" else self._take_local(key, limit, at)
        if int(granted) >= 1:
            return 0.0
        self._empty_at[key] = max(self._empty_at.get(key, 0.0), at + int(wait_ms) / 1000)
        return int(wait_ms) / 1000

    def _take_local(self, key: str, limit: Limit, at: float | None = None) -> float:
        now = self._clock() if at is None else at
        bucket = self._local.get(key)
        if bucket is None or bucket.limit != limit:
            bucket = self._local[key] = _Bucket(limit, limit.burst, now)
        return bucket.take(now)

    def _degraded(self) -> None:
        if not self._warned:
            log.warning("Redis unavailable: quotas are kept per process (reads not limited)")
            self._warned = True


def _refusal(wait: float, what: str) -> RateLimited:
    # Whole seconds, rounded up, as Retry-After has them; the hint never says "now".
    retry = max(1, math.ceil(wait))
    return RateLimited(f"over the {what}; retry after {retry} s", {"retry_after_s": retry})
