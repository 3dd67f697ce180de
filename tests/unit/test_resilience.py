"""Circuit breaker and retries (shared/runtime/resilience.py)."""

from __future__ import annotations

import random

import pytest

from shared.runtime.resilience import CircuitBreaker, retry_async


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_starts_closed_and_allows_calls(clock: FakeClock) -> None:
    """A new breaker is closed and lets calls through."""
    breaker = CircuitBreaker(clock=clock)
    assert breaker.state == "closed"
    assert breaker.allow()


def test_opens_after_threshold_consecutive_failures(clock: FakeClock) -> None:
    """Three failures in a row open a threshold-3 breaker, which then refuses calls."""
    breaker = CircuitBreaker(failure_threshold=3, reset_after_s=10, clock=clock)
    for _ in range(2):
        breaker.record_failure()
    assert breaker.state == "closed"
    breaker.record_failure()
    assert breaker.state == "open"
    assert not breaker.allow()


def test_a_success_resets_the_failure_count(clock: FakeClock) -> None:
    """Failures only count while consecutive: a success in between starts over."""
    breaker = CircuitBreaker(failure_threshold=2, clock=clock)
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    assert breaker.state == "closed"
    assert breaker.consecutive_failures == 1


def test_half_opens_after_the_reset_time_and_allows_one_trial(clock: FakeClock) -> None:
    """After reset_after_s an open breaker is half-open and lets exactly one trial call through."""
    breaker = CircuitBreaker(failure_threshold=1, reset_after_s=30, clock=clock)
    breaker.record_failure()
    clock.now += 29.9
    assert breaker.state == "open"
    clock.now += 0.1
    assert breaker.state == "half_open"
    assert breaker.allow()
    assert not breaker.allow()


def test_a_successful_trial_closes_the_breaker(clock: FakeClock) -> None:
    """A half-open breaker whose trial succeeds is closed again."""
    breaker = CircuitBreaker(failure_threshold=1, reset_after_s=5, clock=clock)
    breaker.record_failure()
    clock.now += 5
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state == "closed"
    assert breaker.allow()
    assert breaker.allow()


def test_a_failed_trial_opens_the_breaker_again(clock: FakeClock) -> None:
    """A half-open breaker whose trial fails opens for another full reset period."""
    breaker = CircuitBreaker(failure_threshold=3, reset_after_s=5, clock=clock)
    for _ in range(3):
        breaker.record_failure()
    clock.now += 5
    assert breaker.allow()
    breaker.record_failure()
    assert breaker.state == "open"
    clock.now += 4.9
    assert not breaker.allow()
    clock.now += 0.1
    assert breaker.allow()


def test_a_trial_that_never_reports_back_does_not_wedge_the_breaker(clock: FakeClock) -> None:
    """If a trial's caller never records its result, another trial is allowed one period later."""
    breaker = CircuitBreaker(failure_threshold=1, reset_after_s=5, clock=clock)
    breaker.record_failure()
    clock.now += 5
    assert breaker.allow()
    clock.now += 4
    assert not breaker.allow()
    clock.now += 1
    assert breaker.allow()


def test_refuses_nonsense_configuration() -> None:
    """A zero threshold or a non-positive reset time fails when the breaker is built."""
    with pytest.raises(ValueError, match="failure_threshold"):
        CircuitBreaker(failure_threshold=0)
    with pytest.raises(ValueError, match="reset_after_s"):
        CircuitBreaker(reset_after_s=0)


class Flaky:
    """Fails with ``error`` for the first ``failures`` calls, then returns "done"."""

    def __init__(self, failures: int, error: type[Exception] = ConnectionError) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error(f"failure {self.calls}")
        return "done"


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


async def test_retry_returns_once_a_retry_succeeds() -> None:
    """Two failures then a success, with three attempts, returns the success after two waits."""
    fn, sleeps = Flaky(2), Sleeps()
    result = await retry_async(
        fn, attempts=3, base_delay_s=0.1, max_delay_s=1, retry_on=(ConnectionError,), sleep=sleeps
    )
    assert result == "done"
    assert fn.calls == 3
    assert len(sleeps.delays) == 2


async def test_retry_reraises_the_last_error_when_attempts_run_out() -> None:
    """When every attempt fails, the last error propagates and no wait follows the last attempt."""
    fn, sleeps = Flaky(5), Sleeps()
    with pytest.raises(ConnectionError, match="failure 3"):
        await retry_async(fn, attempts=3, base_delay_s=0.1, max_delay_s=1, retry_on=(OSError,), sleep=sleeps)
    assert fn.calls == 3
    assert len(sleeps.delays) == 2


async def test_retry_does_not_retry_other_errors() -> None:
    """An exception outside retry_on propagates at once."""
    fn, sleeps = Flaky(1, error=KeyError), Sleeps()
    with pytest.raises(KeyError):
        await retry_async(
            fn, attempts=5, base_delay_s=0.1, max_delay_s=1, retry_on=(ConnectionError,), sleep=sleeps
        )
    assert fn.calls == 1
    assert sleeps.delays == []


async def test_retry_backoff_is_full_jitter_under_an_exponential_cap() -> None:
    """The n-th wait is uniform in [0, min(max_delay, base * 2**n)]."""
    fn, sleeps = Flaky(6), Sleeps()
    await retry_async(
        fn,
        attempts=7,
        base_delay_s=0.5,
        max_delay_s=3.0,
        retry_on=(ConnectionError,),
        sleep=sleeps,
        rng=random.Random(7),
    )
    caps = [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert all(0 <= delay <= cap for delay, cap in zip(sleeps.delays, caps, strict=True))
    assert len(set(sleeps.delays)) == len(caps)


async def test_retry_refuses_zero_attempts() -> None:
    """attempts must be at least one."""
    with pytest.raises(ValueError, match="attempts"):
        await retry_async(Flaky(0), attempts=0, base_delay_s=0, max_delay_s=0, retry_on=(ConnectionError,))
