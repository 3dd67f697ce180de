"""One JSON-over-HTTP call to a model endpoint (chat completions, embeddings), guarded the same
way everywhere: a per-attempt deadline, retries with backoff for what may pass (timeouts,
connection errors, 429, 5xx), a circuit breaker, and every failure turned into ``Unavailable``
with a reason. Adapters add only what is theirs: the request body and reading the answer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import httpx

from contracts.errors import Unavailable
from shared.resilience import CircuitBreaker, retry_async

__all__ = ["BadAnswer", "Rejected", "Retryable", "guarded_call", "post_json"]

T = TypeVar("T")


class Retryable(Exception):
    """A failure worth trying again: the endpoint may be back in a moment."""

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class Rejected(Exception):
    """The endpoint answered but refused the request (4xx): retrying will not help."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body


class BadAnswer(Exception):
    """The endpoint answered 2xx, but not with what was asked for."""


async def post_json(
    client: httpx.AsyncClient, url: str, body: Mapping[str, Any], headers: Mapping[str, str], timeout_s: float
) -> Any:
    """One attempt: the answer's JSON, or a classified failure."""
    try:
        async with asyncio.timeout(timeout_s):
            response = await client.post(url, json=dict(body), headers=dict(headers), timeout=timeout_s)
    except (TimeoutError, httpx.TimeoutException) as exc:
        raise Retryable("timeout") from exc
    except httpx.TransportError as exc:
        raise Retryable(f"connection error ({type(exc).__name__})") from exc
    status = response.status_code
    if status == 429 or status >= 500:
        raise Retryable(f"HTTP {status}", status)
    if not response.is_success:
        raise Rejected(status, response.text[:200])
    try:
        return response.json()
    except ValueError as exc:
        raise BadAnswer(response.text[:200]) from exc


async def guarded_call(
    attempt: Callable[[], Awaitable[T]],
    *,
    what: str,
    breaker: CircuitBreaker,
    attempts: int,
    base_delay_s: float,
    max_delay_s: float,
    details: dict[str, Any],
    rejected_hint: str,
    bad_answer: str,
) -> T:
    """Run ``attempt`` under the breaker with retries; any failure is ``Unavailable``."""
    if not breaker.allow():
        raise Unavailable(
            f"{what} circuit breaker is open; not calling it", {**details, "reason": "circuit_open"}
        )
    try:
        result = await retry_async(
            attempt,
            attempts=attempts,
            base_delay_s=base_delay_s,
            max_delay_s=max_delay_s,
            retry_on=(Retryable,),
        )
    except Retryable as exc:
        breaker.record_failure()
        raise Unavailable(
            f"{what} unavailable after {attempts} attempt(s): {exc.reason}",
            {**details, "reason": exc.reason, "status": exc.status, "attempts": attempts},
        ) from exc
    except Rejected as exc:
        # The endpoint is up (it answered), so the breaker stays closed; a 4xx means our
        # configuration (key, model name, URL) or this request is wrong, which retrying won't fix.
        breaker.record_success()
        raise Unavailable(
            f"{what} refused the request with HTTP {exc.status}; {rejected_hint}",
            {**details, "reason": "rejected", "status": exc.status, "body": exc.body},
        ) from exc
    except BadAnswer as exc:
        breaker.record_success()
        raise Unavailable(
            f"{what} answered something that is not {bad_answer}: {exc}",
            {**details, "reason": "unparseable_answer"},
        ) from exc
    breaker.record_success()
    return result
