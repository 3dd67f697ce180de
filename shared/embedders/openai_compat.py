"""An embedder backed by any OpenAI-compatible ``/v1/embeddings`` endpoint (LiteLLM, vLLM, Ollama,
TEI, OpenAI).

Texts go out in batches of ``batch_size``. Each request has a per-attempt deadline, is retried with
backoff on timeouts, connection errors, 5xx and 429, and sits behind a circuit breaker: when the
endpoint is down the embedder raises :class:`~contracts.errors.Unavailable` at once, and the caller
tries again later. A vector of the wrong length raises
:class:`~contracts.errors.EmbeddingDimensionMismatch` at once: that is a configuration error
(model and dimension disagree), which retrying cannot fix.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import httpx

from contracts.errors import EmbeddingDimensionMismatch, Unavailable
from shared.resilience import CircuitBreaker, retry_async

__all__ = ["OpenAICompatEmbedder"]


class _Retryable(Exception):
    """A failure worth trying again: the endpoint may be back in a moment."""

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class _Rejected(Exception):
    """The endpoint answered but refused the request (4xx): retrying will not help."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body


class _BadAnswer(Exception):
    """The endpoint answered 2xx, but not with one embedding per input."""


class OpenAICompatEmbedder:
    """An :class:`~shared.ports.Embedder` calling ``POST {base_url}/embeddings``; ``name`` is the model.

    ``base_url`` is the API root, e.g. ``http://127.0.0.1:4000/v1``. ``retries`` is the number of
    extra attempts after the first, per batch. Vectors come back L2-normalized, in input order
    (the answer's ``index`` fields decide the order, not the order of its items). Pass ``client``
    to share a connection pool (it is then not closed by :meth:`aclose`) and ``breaker`` to share
    one breaker between adapters that call the same endpoint.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        dimension: int,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        retries: int = 2,
        breaker: CircuitBreaker | None = None,
        client: httpx.AsyncClient | None = None,
        batch_size: int = 128,
        *,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 8.0,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"embedder URL {base_url!r} must start with http:// or https:// "
                "(set ENGRAM_EMBEDDER_URL, e.g. http://127.0.0.1:4000/v1)"
            )
        if not model.strip():
            raise ValueError("embedding model name is empty (set ENGRAM_EMBEDDER)")
        if dimension < 1:
            raise ValueError(
                f"embedding dimension must be positive, got {dimension} (ENGRAM_EMBEDDER_DIMENSION)"
            )
        if timeout_s <= 0:
            raise ValueError("embedder timeout must be positive")
        if retries < 0:
            raise ValueError("embedder retries must not be negative")
        if batch_size < 1:
            raise ValueError("embedder batch size must be at least 1")
        self.name = model
        self.model = model
        self.dimension = dimension
        self.url = base_url.rstrip("/") + "/embeddings"
        self.breaker = breaker or CircuitBreaker()
        self.batch_size = batch_size
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout_s = timeout_s
        self._attempts = retries + 1
        self._backoff_base_s = backoff_base_s
        self._backoff_max_s = backoff_max_s
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient()

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector per text, in order; :class:`Unavailable` when the endpoint cannot answer now."""
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            vectors.extend(await self._embed_batch(list(texts[start : start + self.batch_size])))
        return vectors

    async def aclose(self) -> None:
        """Close the HTTP client if this embedder created it."""
        if self._owns_client:
            await self._client.aclose()

    async def _embed_batch(self, batch: list[str]) -> list[list[float]]:
        details: dict[str, Any] = {"embedder": "openai_compat", "model": self.model, "url": self.url}
        if not self.breaker.allow():
            raise Unavailable(
                "embedder circuit breaker is open; not calling the endpoint",
                {**details, "reason": "circuit_open"},
            )
        body = {"model": self.model, "input": batch}
        try:
            vectors = await retry_async(
                lambda: self._post(body, len(batch)),
                attempts=self._attempts,
                base_delay_s=self._backoff_base_s,
                max_delay_s=self._backoff_max_s,
                retry_on=(_Retryable,),
            )
        except _Retryable as exc:
            self.breaker.record_failure()
            raise Unavailable(
                f"embedder unavailable after {self._attempts} attempt(s): {exc.reason}",
                {**details, "reason": exc.reason, "status": exc.status, "attempts": self._attempts},
            ) from exc
        except _Rejected as exc:
            # The endpoint is up (it answered), so the breaker stays closed; a 4xx means our
            # configuration (key, model name, URL) or this request is wrong.
            self.breaker.record_success()
            raise Unavailable(
                f"embedder refused the request with HTTP {exc.status}; check the embedder URL, "
                "model name and API key",
                {**details, "reason": "rejected", "status": exc.status, "body": exc.body},
            ) from exc
        except _BadAnswer as exc:
            self.breaker.record_success()
            raise Unavailable(
                f"embedder answered something that is not one embedding per input: {exc}",
                {**details, "reason": "unparseable_answer"},
            ) from exc
        self.breaker.record_success()
        for vector in vectors:
            if len(vector) != self.dimension:
                raise EmbeddingDimensionMismatch(
                    f"embedding model {self.model!r} returned {len(vector)} dimensions, "
                    f"expected {self.dimension}; set ENGRAM_EMBEDDER_DIMENSION to the model's",
                    {**details, "expected": self.dimension, "actual": len(vector)},
                )
        return vectors

    async def _post(self, body: dict[str, Any], count: int) -> list[list[float]]:
        """One attempt: the answer's unit vectors in input order, or a classified failure."""
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await self._client.post(
                    self.url, json=body, headers=self._headers, timeout=self._timeout_s
                )
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise _Retryable("timeout") from exc
        except httpx.TransportError as exc:
            raise _Retryable(f"connection error ({type(exc).__name__})") from exc
        status = response.status_code
        if status == 429 or status >= 500:
            raise _Retryable(f"HTTP {status}", status)
        if not response.is_success:
            raise _Rejected(status, response.text[:200])
        try:
            items = response.json()["data"]
        except (ValueError, LookupError, TypeError) as exc:
            raise _BadAnswer(response.text[:200]) from exc
        return _ordered_vectors(items, count)


def _ordered_vectors(items: object, count: int) -> list[list[float]]:
    """The ``data`` items' embeddings, L2-normalized and placed by their ``index``; each input must
    get exactly one."""
    if not isinstance(items, list) or len(items) != count:
        raise _BadAnswer(f"expected {count} embeddings in 'data'")
    vectors: list[list[float] | None] = [None] * count
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            raise _BadAnswer("an item of 'data' is not an object")
        index = item.get("index", position)
        embedding = item.get("embedding")
        if not isinstance(index, int) or not 0 <= index < count or vectors[index] is not None:
            raise _BadAnswer(f"index {index!r} is out of range or repeated")
        if not isinstance(embedding, list) or not all(
            isinstance(value, int | float) and not isinstance(value, bool) for value in embedding
        ):
            raise _BadAnswer(f"embedding {index} is not a list of numbers")
        norm = math.sqrt(math.fsum(value * value for value in embedding))
        if norm == 0.0 or not math.isfinite(norm):
            raise _BadAnswer(f"embedding {index} is zero or not finite")
        vectors[index] = [value / norm for value in embedding]
    return [vector for vector in vectors if vector is not None]
