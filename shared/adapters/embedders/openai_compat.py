"""An embedder backed by any OpenAI-compatible ``/v1/embeddings`` endpoint (LiteLLM, vLLM, Ollama,
TEI, OpenAI).

Texts go out in batches of ``batch_size``, each through
:class:`~shared.adapters.guarded_http.ModelEndpoint`: a per-attempt deadline, retries with backoff on
timeouts, connection errors, 5xx and 429, and a circuit breaker: when the endpoint is down the
embedder raises :class:`~contracts.errors.Unavailable` at once, and the caller tries again later.
A vector of the wrong length raises :class:`~contracts.errors.EmbeddingDimensionMismatch` at
once: that is a configuration error (model and dimension disagree), which retrying cannot fix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Unpack

from contracts.errors import EmbeddingDimensionMismatch
from shared.adapters.guarded_http import BadAnswer, EndpointOptions, ModelEndpoint

__all__ = ["OpenAICompatEmbedder"]


class OpenAICompatEmbedder:
    """An :class:`~shared.ports.Embedder` calling ``POST {base_url}/embeddings``; ``name`` is the model.

    ``base_url`` is the API root, e.g. ``http://127.0.0.1:4000/v1``. Texts go out ``batch_size``
    at a time (retries are per batch). Vectors come back L2-normalized, in input order (the
    answer's ``index`` fields decide the order, not the order of its items). ``options``
    (:class:`~shared.adapters.guarded_http.EndpointOptions`): the API key, timeout, retries, a shared
    breaker or HTTP client, the backoff.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        dimension: int,
        batch_size: int = 128,
        **options: Unpack[EndpointOptions],
    ) -> None:
        if not model.strip():
            raise ValueError("embedding model name is empty (set ENGRAM_EMBEDDER)")
        if dimension < 1:
            raise ValueError(
                f"embedding dimension must be positive, got {dimension} (ENGRAM_EMBEDDER_DIMENSION)"
            )
        if batch_size < 1:
            raise ValueError("embedder batch size must be at least 1")
        self.name = model
        self.model = model
        self.dimension = dimension
        self.batch_size = batch_size
        self.endpoint = ModelEndpoint(base_url, "/embeddings", "embedder", "ENGRAM_EMBEDDER_URL", **options)
        self.url, self.breaker = self.endpoint.url, self.endpoint.breaker

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector per text, in order; :class:`Unavailable` when the endpoint cannot answer now."""
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            vectors.extend(await self._embed_batch(list(texts[start : start + self.batch_size])))
        return vectors

    def load(self) -> None:
        """Nothing to load: the model runs behind the endpoint."""

    async def aclose(self) -> None:
        """Close the HTTP client if this embedder created it."""
        await self.endpoint.aclose()

    async def _embed_batch(self, batch: list[str]) -> list[list[float]]:
        details: dict[str, Any] = {"embedder": "openai_compat", "model": self.model, "url": self.url}
        vectors = await self.endpoint.call(
            {"model": self.model, "input": batch},
            lambda answer: _ordered_vectors(_data(answer), len(batch)),
            details=details,
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


def _data(answer: Any) -> Any:
    try:
        return answer["data"]
    except (LookupError, TypeError) as exc:
        raise BadAnswer("no 'data' in the answer") from exc


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
