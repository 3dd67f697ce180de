"""Staying up when a dependency is not: a circuit breaker and retries with backoff.

Adapters for things we do not run ourselves (a model endpoint, an embeddings endpoint) wrap their
calls in both: retries ride out a blip, the breaker stops hammering something that is down.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

__all__ = ["BreakerState", "CircuitBreaker", "retry_async"]

T = TypeVar("T")

BreakerState = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    """Counts consecutive failures of one dependency and refuses calls while it looks down.

    ``closed``: calls pass; ``failure_threshold`` consecutive failures open it.
    ``open``: calls are refused until ``reset_after_s`` has passed, then it is ``half_open``.
    ``half_open``: one trial call passes; its success closes the breaker, its failure opens it again.

    The breaker never raises; callers ask :meth:`allow` and report back with
    :meth:`record_success` / :meth:`record_failure`.
    """

    def __init__(
        self,
        failure_threshold: int = 5,
        reset_after_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        if reset_after_s <= 0:
            raise ValueError("reset_after_s must be positive")
        self.failure_threshold = failure_threshold
        self.reset_after_s = reset_after_s
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._trial_started_at: float | None = None

    @property
    def state(self) -> BreakerState:
        """The current state; ``open`` turns into ``half_open`` by itself once the wait is over."""
        if self._opened_at is None:
            return "closed"
        if self._clock() - self._opened_at >= self.reset_after_s:
            return "half_open"
        return "open"

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    def allow(self) -> bool:
        """Whether a call may go out now. In ``half_open`` only one trial call at a time passes."""
        state = self.state
        if state == "closed":
            return True
        if state == "open":
            return False
        now = self._clock()
        # A trial whose caller never reported back must not wedge the breaker: after another
        # reset period a new trial is allowed.
        if self._trial_started_at is not None and now - self._trial_started_at < self.reset_after_s:
            return False
        self._trial_started_at = now
        return True

    def record_success(self) -> None:
        """A call succeeded: the dependency is up, the breaker closes."""
        self._failures = 0
        self._opened_at = None
        self._trial_started_at = None

    def record_failure(self) -> None:
        """A call failed: count it; at the threshold (or after a failed trial) the breaker opens."""
        self._failures += 1
        self._trial_started_at = None
        if self._opened_at is not None or self._failures >= self.failure_threshold:
            self._opened_at = self._clock()


async def retry_async(
    fn: Callable[[], Awaitable[T]],
    *,
    attempts: int,
    base_delay_s: float,
    max_delay_s: float,
    retry_on: tuple[type[BaseException], ...],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rng: random.Random | None = None,
) -> T:
    """Call ``fn`` up to ``attempts`` times, retrying only on ``retry_on`` exceptions.

    Between attempts it waits a random time in ``[0, min(max_delay_s, base_delay_s * 2**n))``
    ("full jitter"), so that many callers recovering at once do not retry in lockstep.
    The last exception is re-raised when every attempt failed; other exceptions propagate at once.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    if base_delay_s < 0 or max_delay_s < 0:
        raise ValueError("delays must not be negative")
    uniform = (rng or random).uniform
    for attempt in range(attempts):
        try:
            return await fn()
        except retry_on:
            if attempt == attempts - 1:
                raise
        await sleep(uniform(0.0, min(max_delay_s, base_delay_s * 2**attempt)))
    raise AssertionError("unreachable")  # pragma: no cover
