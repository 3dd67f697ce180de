"""What both OpenAI-compatible adapters (distiller and embedder) owe their callers when the endpoint
misbehaves, through ``shared.adapters.guarded_http.ModelEndpoint``, against a real HTTP server speaking the
protocol (FakeOpenAI): retries with backoff for what may pass (5xx, 429, timeouts, refused
connections), one request for what will not (4xx, an unreadable answer), a breaker that opens and
recovers, and a shared HTTP client left open. Every test runs once per adapter.

Decision: a 4xx and an unreadable 2xx answer raise Unavailable without counting against the breaker
(the endpoint is up; our configuration or the model is wrong)."""

from __future__ import annotations

import httpx
import pytest

from contracts.errors import Unavailable
from shared.runtime.resilience import CircuitBreaker
from tests.integration.openai_adapters import ADAPTERS, Adapter, Closing, closing
from tests.platform import eventually
from tests.support import FakeOpenAI

__all__ = ["closing"]  # the fixture

pytestmark = pytest.mark.parametrize("adapter", ADAPTERS, ids=str)


async def test_a_failing_endpoint_is_unavailable_after_retries(adapter: Adapter, closing: Closing) -> None:
    """HTTP 500 on every attempt: three requests (retries=2), then Unavailable with the status."""
    async with FakeOpenAI(mode="fail") as server:
        built = closing(adapter.build(server.base_url))
        with pytest.raises(Unavailable) as caught:
            await adapter.call(built)
        assert server.request_count == 3
    assert caught.value.code == "UNAVAILABLE"
    assert caught.value.details | {"reason": "HTTP 500", "status": 500} == caught.value.details
    assert built.breaker.consecutive_failures == 1


@pytest.mark.parametrize("status", [500, 503, 429])
async def test_a_flaky_endpoint_recovers_through_retries(
    adapter: Adapter, closing: Closing, status: int
) -> None:
    """Two 5xx/429 answers then success: the third attempt's answer is returned, the breaker clean."""
    async with FakeOpenAI(mode="flaky", fail_first=2, fail_status=status) as server:
        built = closing(adapter.build(server.base_url))
        answer = await adapter.call(built)
        assert server.request_count == 3
        assert answer == await adapter.call(built)  # what a healthy endpoint answers
    assert built.breaker.consecutive_failures == 0


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_a_refused_request_is_not_retried(adapter: Adapter, closing: Closing, status: int) -> None:
    """A 4xx other than 429 is a configuration problem: Unavailable after one request."""
    async with FakeOpenAI(mode="fail", fail_status=status) as server:
        built = closing(adapter.build(server.base_url, breaker=CircuitBreaker(failure_threshold=1)))
        with pytest.raises(Unavailable) as caught:
            await adapter.call(built)
        assert server.request_count == 1
    assert caught.value.details | {"reason": "rejected", "status": status} == caught.value.details
    assert built.breaker.state == "closed"


async def test_an_unreadable_answer_is_not_retried(adapter: Adapter, closing: Closing) -> None:
    """A 2xx answer that is not what was asked for (a completion whose content is not JSON; a body
    without ``data``): Unavailable (unparseable_answer) after one request, the breaker closed."""
    async with FakeOpenAI(mode="garbage") as server:
        built = closing(adapter.build(server.base_url, breaker=CircuitBreaker(failure_threshold=1)))
        with pytest.raises(Unavailable) as caught:
            await adapter.call(built)
        assert server.request_count == 1
    assert caught.value.details["reason"] == "unparseable_answer"
    assert built.breaker.state == "closed"


async def test_a_slow_endpoint_times_out_after_retries(adapter: Adapter, closing: Closing) -> None:
    """An endpoint slower than the 0.3 s timeout is tried retries+1 times, then Unavailable."""
    async with FakeOpenAI(mode="slow", delay_s=5.0) as server:
        built = closing(adapter.build(server.base_url, timeout_s=0.3, retries=1))
        with pytest.raises(Unavailable) as caught:
            await adapter.call(built)
        assert caught.value.details["reason"] == "timeout"
        assert built.breaker.consecutive_failures == 1

        # Each attempt opened a connection; on a starved loop the client may time out before the
        # server has read its request, so attempts are counted as connections, awaited, not sampled.
        async def both_attempts() -> bool:
            return server.connections >= 2

        await eventually(both_attempts, timeout=30, what="two connection attempts")
        assert server.connections == 2


async def test_nobody_listening_is_unavailable(adapter: Adapter, closing: Closing) -> None:
    """A refused connection is retried and ends in Unavailable."""
    async with FakeOpenAI() as server:
        base_url = server.base_url
    with pytest.raises(Unavailable, match="connection error"):
        await adapter.call(closing(adapter.build(base_url, retries=1)))


async def test_the_breaker_opens_and_then_short_circuits(adapter: Adapter, closing: Closing) -> None:
    """After two failed calls the breaker is open: no HTTP request until it half-opens and recovers."""
    now = [0.0]
    breaker = CircuitBreaker(failure_threshold=2, reset_after_s=30, clock=lambda: now[0])
    async with FakeOpenAI(mode="fail") as server:
        built = closing(adapter.build(server.base_url, retries=0, breaker=breaker))
        for _ in range(2):
            with pytest.raises(Unavailable):
                await adapter.call(built)
        assert breaker.state == "open"
        assert server.request_count == 2

        with pytest.raises(Unavailable) as caught:
            await adapter.call(built)
        assert caught.value.details["reason"] == "circuit_open"
        assert server.request_count == 2

        server.mode = "ok"
        now[0] += 30
        await adapter.call(built)
        assert server.request_count == 3
        assert breaker.state == "closed"


async def test_a_shared_client_is_left_open(adapter: Adapter) -> None:
    """aclose() closes only a client the adapter created itself."""
    async with httpx.AsyncClient() as client, FakeOpenAI() as server:
        built = adapter.build(server.base_url, client=client)
        await adapter.call(built)
        await built.aclose()
        assert not client.is_closed
