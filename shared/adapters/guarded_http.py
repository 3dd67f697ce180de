"""One JSON-over-HTTP call to a model endpoint (chat completions, embeddings), guarded the same
way everywhere: a per-attempt deadline, retries with backoff for what may pass (timeouts,
connection errors, 429, 5xx), a circuit breaker, and every failure turned into ``Unavailable``
with a reason. :class:`ModelEndpoint` holds all of it for one OpenAI-compatible endpoint; adapters
add only what is theirs: the request body and reading the answer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any, TypedDict, TypeVar

import httpx

from contracts.errors import Unavailable
from shared.runtime.resilience import CircuitBreaker, retry_async

__all__ = ["BadAnswer", "EndpointOptions", "ModelEndpoint", "Rejected", "Retryable", "chat_content"]

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


class EndpointOptions(TypedDict, total=False):
    """How an adapter calls its endpoint, each optional (:class:`ModelEndpoint` has the defaults)."""

    api_key: str | None
    #: Seconds per attempt.
    timeout_s: float
    #: Extra attempts after the first.
    retries: int
    #: Share one between adapters that call the same endpoint.
    breaker: CircuitBreaker | None
    #: Share a connection pool; a client passed in is not closed by ``aclose``.
    client: httpx.AsyncClient | None
    backoff_base_s: float
    backoff_max_s: float


class ModelEndpoint:
    """One OpenAI-compatible endpoint, ``POST {base_url}{path}``, as the adapters call it: the URL
    checked when built, the bearer key, retries with backoff, a circuit breaker and the HTTP
    client, all set by :class:`EndpointOptions`. ``what`` names it in errors (``"embedder"``);
    ``url_setting`` is the setting its URL comes from."""

    def __init__(
        self,
        base_url: str,
        path: str,
        what: str,
        url_setting: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        retries: int = 2,
        breaker: CircuitBreaker | None = None,
        client: httpx.AsyncClient | None = None,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 8.0,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"{what} URL {base_url!r} must start with http:// or https:// "
                f"(set {url_setting}, e.g. http://127.0.0.1:4000/v1)"
            )
        if timeout_s <= 0:
            raise ValueError(f"{what} timeout must be positive, got {timeout_s}")
        if retries < 0:
            raise ValueError(f"{what} retries must not be negative, got {retries}")
        self.url = base_url.rstrip("/") + path
        self.what = what
        self.url_setting = url_setting
        self.breaker = breaker or CircuitBreaker()
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout_s = timeout_s
        self._attempts = retries + 1
        self._backoff = (backoff_base_s, backoff_max_s)
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient()

    async def call(
        self, body: Mapping[str, Any], read: Callable[[Any], T], *, details: dict[str, Any], bad_answer: str
    ) -> T:
        """POST ``body`` under the breaker with retries; ``read`` turns one attempt's JSON answer
        into the result or raises :class:`BadAnswer` (``bad_answer`` says what was expected).
        Any failure is ``Unavailable``, its ``details`` extended with the reason."""
        what = self.what
        if not self.breaker.allow():
            raise Unavailable(
                f"{what} circuit breaker is open; not calling it", {**details, "reason": "circuit_open"}
            )

        async def attempt() -> T:
            return read(await self._post(body))

        try:
            result = await retry_async(
                attempt,
                attempts=self._attempts,
                base_delay_s=self._backoff[0],
                max_delay_s=self._backoff[1],
                retry_on=(Retryable,),
            )
        except Retryable as exc:
            self.breaker.record_failure()
            raise Unavailable(
                f"{what} unavailable after {self._attempts} attempt(s): {exc.reason}",
                {**details, "reason": exc.reason, "status": exc.status, "attempts": self._attempts},
            ) from exc
        except Rejected as exc:
            # The endpoint is up (it answered), so the breaker stays closed; a 4xx means our
            # configuration (key, model name, URL) or this request is wrong, which retrying won't fix.
            self.breaker.record_success()
            raise Unavailable(
                f"{what} refused the request with HTTP {exc.status}; check {self.url_setting}, the "
                "model name and the API key",
                {**details, "reason": "rejected", "status": exc.status, "body": exc.body},
            ) from exc
        except BadAnswer as exc:
            self.breaker.record_success()
            raise Unavailable(
                f"{what} answered something that is not {bad_answer}: {exc}",
                {**details, "reason": "unparseable_answer"},
            ) from exc
        self.breaker.record_success()
        return result

    async def aclose(self) -> None:
        """Close the HTTP client if this endpoint created it."""
        if self._owns_client:
            await self._client.aclose()

    async def _post(self, body: Mapping[str, Any]) -> Any:
        """One attempt: the answer's JSON, or a classified failure."""
        timeout_s = self._timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._client.post(
                    self.url, json=dict(body), headers=self._headers, timeout=timeout_s
                )
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


def chat_content(answer: Any) -> str:
    """The assistant message's content of a chat completion."""
    try:
        content = answer["choices"][0]["message"]["content"]
    except (LookupError, TypeError) as exc:
        raise BadAnswer(json.dumps(answer)[:200]) from exc
    if not isinstance(content, str):
        raise BadAnswer("a chat completion without text content")
    return content
