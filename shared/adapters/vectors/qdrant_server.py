"""The :class:`~shared.ports.VectorIndex` on a Qdrant server (or cluster), through ``qdrant-client``.

Production runs it against a server URL; tests run the same code against the client's local mode
(``AsyncQdrantClient(location=":memory:")`` or ``path=``), which ignores payload indexes and is slow
beyond ~20k points. Failures to reach the server surface as
:class:`~contracts.errors.VectorUnavailable`, so the caller retries later.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID

import grpc
import httpx
from pydantic import ValidationError
from qdrant_client import AsyncQdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from contracts.errors import EmbeddingDimensionMismatch, VectorUnavailable
from shared.adapters.vectors._tenancy import (
    KEYWORD_FIELDS,
    TENANT_FIELD,
    Condition,
    Equals,
    TenantGatedSearch,
    check_dimension,
    payload_of,
    top_hits,
)
from shared.ports import VectorHit, VectorPoint
from shared.text.lexical import LEXICAL_VECTOR

__all__ = ["QdrantServerIndex"]

_UNREACHABLE_GRPC_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class QdrantServerIndex(TenantGatedSearch):
    """Entry vectors in one Qdrant collection (cosine), tenancy fields in the payload.

    The collection and its keyword payload indexes are created on first use when missing
    (call :meth:`ensure_collection` at start-up to fail fast). ``client`` stays the caller's: it
    may be shared, and :meth:`close` leaves it open.
    """

    def __init__(self, client: AsyncQdrantClient, collection: str, dimension: int) -> None:
        if dimension < 1:
            raise ValueError(f"dimension must be positive, got {dimension}")
        self.dimension = dimension
        self._client = client
        self._collection = collection
        self._ready = False
        self._ready_lock = asyncio.Lock()

    async def ensure_collection(self) -> None:
        """Create the collection and its payload indexes unless they exist; refuse a collection
        whose vectors have another size."""
        if self._ready:
            return
        async with self._ready_lock, self._reaching_qdrant():
            if self._ready:
                return
            if not await self._client.collection_exists(self._collection):
                await self._create_collection()
            info = await self._client.get_collection(self._collection)
            self._check_vector_size(info)
            for field in KEYWORD_FIELDS:
                if field not in info.payload_schema:
                    await self._client.create_payload_index(
                        self._collection,
                        field,
                        field_schema=models.KeywordIndexParams(
                            type=models.KeywordIndexType.KEYWORD, is_tenant=field == TENANT_FIELD
                        ),
                        wait=True,
                    )
            self._ready = True

    async def upsert(self, points: Sequence[VectorPoint]) -> None:
        for point in points:
            check_dimension(point.vector, self.dimension)
        if not points:
            return
        await self.ensure_collection()
        structs = [
            models.PointStruct(id=str(point.id), vector=_vectors_of(point), payload=payload_of(point))
            for point in points
        ]
        async with self._reaching_qdrant():
            await self._client.upsert(self._collection, points=structs, wait=True)

    async def delete(self, ids: Sequence[UUID]) -> None:
        if not ids:
            return
        await self.ensure_collection()
        selector = models.PointIdsList(points=[str(point_id) for point_id in ids])
        async with self._reaching_qdrant():
            await self._client.delete(self._collection, points_selector=selector, wait=True)

    async def _query_vector(
        self, vector: Sequence[float], conditions: Sequence[Condition], limit: int
    ) -> list[VectorHit]:
        return await self._query(list(vector), None, conditions, limit)

    async def _query_lexical(
        self, terms: Mapping[int, float], conditions: Sequence[Condition], limit: int
    ) -> list[VectorHit]:
        return await self._query(_sparse(terms), LEXICAL_VECTOR, conditions, limit)

    async def _query(
        self, query: Any, using: str | None, conditions: Sequence[Condition], limit: int
    ) -> list[VectorHit]:
        await self.ensure_collection()
        async with self._reaching_qdrant():
            response = await self._client.query_points(
                self._collection,
                query=query,
                using=using,
                query_filter=_filter_for(conditions),
                limit=limit,
                with_payload=False,
                with_vectors=False,
            )
        return top_hits((VectorHit(UUID(str(hit.id)), hit.score) for hit in response.points), limit)

    async def count(self) -> int:
        await self.ensure_collection()
        async with self._reaching_qdrant():
            result = await self._client.count(self._collection, exact=True)
        return result.count

    async def close(self) -> None:
        """Nothing to release: the client belongs to whoever made it."""

    async def _create_collection(self) -> None:
        try:
            await self._client.create_collection(
                self._collection,
                vectors_config=models.VectorParams(size=self.dimension, distance=models.Distance.COSINE),
                # Plain dot product: the cue carries the IDF (shared/text/lexical.py), per tenant scope.
                sparse_vectors_config={LEXICAL_VECTOR: models.SparseVectorParams()},
            )
        except UnexpectedResponse as exc:
            if exc.status_code != 409:  # another instance created it first: fine
                raise

    def _check_vector_size(self, info: models.CollectionInfo) -> None:
        vectors = info.config.params.vectors
        size = vectors.size if isinstance(vectors, models.VectorParams) else None
        if size != self.dimension:
            raise EmbeddingDimensionMismatch(
                f"collection {self._collection!r} holds vectors of size {size}, the embedder makes "
                f"{self.dimension}: {self._start_over}",
                {"collection": self._collection, "expected": self.dimension, "got": size},
            )
        if LEXICAL_VECTOR not in (info.config.params.sparse_vectors or {}):
            raise ValueError(
                f"collection {self._collection!r} has no {LEXICAL_VECTOR!r} sparse vectors (made before "
                f"hybrid's lexical leg moved into the vector store): {self._start_over}"
            )

    @property
    def _start_over(self) -> str:
        """What an operator does about a collection this embedder cannot use: its name follows from
        the embedder (``engram_<model>``), so the collection goes, or the server changes."""
        return (
            f"delete the collection {self._collection!r} from the Qdrant server (or point "
            "ENGRAM_VECTOR_STORE at another server), then run `engram reindex`"
        )

    @asynccontextmanager
    async def _reaching_qdrant(self) -> AsyncIterator[None]:
        """Turn "the server cannot be reached" into :class:`VectorUnavailable`; let the rest through."""
        try:
            yield
        except UnexpectedResponse as exc:
            if exc.status_code is not None and exc.status_code >= 500:
                raise self._unavailable(exc) from exc
            raise
        except ResponseHandlingException as exc:
            if isinstance(exc.source, ValidationError):
                raise
            raise self._unavailable(exc) from exc
        except (httpx.TransportError, ConnectionError, TimeoutError) as exc:
            raise self._unavailable(exc) from exc
        except grpc.RpcError as exc:
            if exc.code() in _UNREACHABLE_GRPC_CODES:  # the aio error's `code` is a method
                raise self._unavailable(exc) from exc
            raise

    def _unavailable(self, exc: BaseException) -> VectorUnavailable:
        return VectorUnavailable(
            f"Qdrant collection {self._collection!r} is unreachable: {exc}", {"collection": self._collection}
        )


def _vectors_of(point: VectorPoint) -> models.VectorStruct:
    """The unnamed dense vector and, when the entry has lexemes, the lexical sparse one."""
    if not point.lexical:
        return {"": list(point.vector)}
    return {"": list(point.vector), LEXICAL_VECTOR: _sparse(point.lexical)}


def _sparse(terms: Mapping[int, float]) -> models.SparseVector:
    indices = sorted(terms)
    return models.SparseVector(indices=indices, values=[terms[i] for i in indices])


def _filter_for(conditions: Sequence[Condition]) -> models.Filter:
    """The tenant conditions (:func:`~shared.adapters.vectors._tenancy.tenant_conditions`) in
    qdrant-client's types: every one must hold."""
    return models.Filter(must=[_condition(condition) for condition in conditions])


def _condition(condition: Condition) -> models.FieldCondition:
    if isinstance(condition, Equals):
        return models.FieldCondition(key=condition.key, match=models.MatchValue(value=condition.value))
    return models.FieldCondition(key=condition.key, match=models.MatchAny(any=list(condition.values)))
