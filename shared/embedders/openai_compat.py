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

import math
from collections.abc import Sequence
from typing import Any

import httpx

from contracts.errors import EmbeddingDimensionMismatch
from shared.guarded_http import BadAnswer, guarded_call, post_json
from shared.resilience import CircuitBreaker

__all__ = ["OpenAICompatEmbedder"]


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
        vectors = await guarded_call(
            lambda: self._post({"model": self.model, "input": batch}, len(batch)),
            what="embedder",
            breaker=self.breaker,
            attempts=self._attempts,
            base_delay_s=self._backoff_base_s,
            max_delay_s=self._backoff_max_s,
            details=details,
            rejected_hint="check the embedder URL, model name and API key",
            bad_answer="one embedding per input",
        )
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
        answer = await post_json(self._client, self.url, body, self._headers, self._timeout_s)
        try:
            items = answer["data"]
        except (LookupError, TypeError) as exc:
            raise BadAnswer("no 'data' in the answer") from exc
        return _ordered_vectors(items, count)


def _ordered_vectors(items: object, count: int) -> list[list[float]]:
    """The ``data`` items' embeddings, L2-normalized and placed by their ``index``; each input must
    get exactly one."""
    if not isinstance(items, list) or len(items) != count:
        raise BadAnswer(f"expected {count} embeddings in 'data'")
    vectors: list[list[float] | None] = [None] * count
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadAnswer("an item of 'data' is not an object")
        index = item.get("index", position)
        embedding = item.get("embedding")
        if not isinstance(index, int) or not 0 <= index < count or vectors[index] is not None:
            raise BadAnswer(f"index {index!r} is out of range or repeated")
        if not isinstance(embedding, list) or not all(
            isinstance(value, int | float) and not isinstance(value, bool) for value in embedding
        ):
            raise BadAnswer(f"embedding {index} is not a list of numbers")
        norm = math.sqrt(math.fsum(value * value for value in embedding))
        if norm == 0.0 or not math.isfinite(norm):
            raise BadAnswer(f"embedding {index} is zero or not finite")
        vectors[index] = [value / norm for value in embedding]
    return [vector for vector in vectors if vector is not None]
