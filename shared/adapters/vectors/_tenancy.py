"""What every adapter of :class:`~shared.ports.VectorIndex` does the same way: the payload stored
beside a vector, the tenant filter on it, the checks on vector sizes, and the order of hits.

The tenant filter is the most security-sensitive code in the adapters, so its content lives here
alone: which payload keys it pins, to which values, and what an empty list of allowed values
means (:func:`tenant_conditions`); so does the gate in front of every search
(:class:`TenantGatedSearch`, which each adapter's class extends). Each adapter only renders these
conditions in its library's filter classes, one line per kind of condition
(``_edge_shards.edge_filter`` for Qdrant Edge, ``qdrant_server._filter_for`` for qdrant-client);
the payload keys written beside each vector, indexed and filtered on are the constants below, so
writing and filtering cannot drift apart.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contracts.errors import EmbeddingDimensionMismatch
from shared.ports import TenantFilter, VectorHit, VectorPoint

__all__ = [
    "AGENT_CONFIG_ID",
    "CREATED_AT",
    "KEYWORD_FIELDS",
    "LAYER",
    "MEMORY_TYPE",
    "ORG_ID",
    "OWNER_KEY",
    "SESSION_ID",
    "TENANT_FIELD",
    "Condition",
    "Equals",
    "OneOf",
    "TenantGatedSearch",
    "check_dimension",
    "check_limit",
    "payload_of",
    "tenant_conditions",
    "top_hits",
]

# -- the payload beside each vector ---------------------------------------------------------

ORG_ID = "org_id"
AGENT_CONFIG_ID = "agent_config_id"
OWNER_KEY = "owner_key"
LAYER = "layer"
MEMORY_TYPE = "memory_type"
SESSION_ID = "session_id"
CREATED_AT = "created_at"

#: The payload fields indexed as keywords: every field the tenant filter can pin.
KEYWORD_FIELDS = (ORG_ID, AGENT_CONFIG_ID, OWNER_KEY, LAYER, MEMORY_TYPE, SESSION_ID)
#: The field every query pins to one value, so stores may lay out and index points by it.
TENANT_FIELD = AGENT_CONFIG_ID


def payload_of(point: VectorPoint) -> dict[str, Any]:
    """The tenancy fields stored beside a vector (never the entry's text)."""
    return {
        ORG_ID: str(point.org_id),
        AGENT_CONFIG_ID: str(point.agent_config_id),
        OWNER_KEY: point.owner_key,
        LAYER: point.layer,
        MEMORY_TYPE: point.memory_type,
        SESSION_ID: point.session_id,
        CREATED_AT: float(point.created_at),
    }


# -- the tenant filter ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Equals:
    """The point's payload value at ``key`` is ``value``."""

    key: str
    value: str


@dataclass(frozen=True, slots=True)
class OneOf:
    """The point's payload value at ``key`` is one of ``values`` (never empty: see
    :func:`tenant_conditions`)."""

    key: str
    values: tuple[str, ...]


Condition = Equals | OneOf


def tenant_conditions(tenant: TenantFilter) -> tuple[Condition, ...] | None:
    """The conditions a point must meet, all of them, to be seen through ``tenant``: its
    organization, its agent config, an owner key among ``owner_keys``, and the layer, session and
    memory types where ``tenant`` narrows to them.

    ``None`` when ``tenant`` can see nothing (an empty list of allowed owner keys or memory
    types): the caller runs no query and returns no hits, rather than trusting each store to read
    an empty "any of" as "none". A filter without organization, agent config or owner keys is
    refused (``ValueError``), never widened.
    """
    if tenant.org_id is None or tenant.agent_config_id is None:
        raise ValueError("a vector search needs both org_id and agent_config_id in its TenantFilter")
    if tenant.owner_keys is None:
        raise ValueError("a vector search needs owner_keys in its TenantFilter (empty sees nothing)")
    conditions: list[Condition] = [
        Equals(ORG_ID, str(tenant.org_id)),
        Equals(AGENT_CONFIG_ID, str(tenant.agent_config_id)),
        OneOf(OWNER_KEY, tuple(tenant.owner_keys)),
    ]
    if tenant.layer is not None:
        conditions.append(Equals(LAYER, tenant.layer))
    if tenant.session_id is not None:
        conditions.append(Equals(SESSION_ID, tenant.session_id))
    if tenant.memory_types is not None:
        conditions.append(OneOf(MEMORY_TYPE, tuple(tenant.memory_types)))
    if any(isinstance(condition, OneOf) and not condition.values for condition in conditions):
        return None
    return tuple(conditions)


# -- vectors and hits -----------------------------------------------------------------------


def check_dimension(vector: Sequence[float], dimension: int) -> None:
    """Raise :class:`EmbeddingDimensionMismatch` unless ``vector`` has ``dimension`` floats."""
    if len(vector) != dimension:
        raise EmbeddingDimensionMismatch(
            f"vector has {len(vector)} dimensions, the index holds {dimension}",
            {"expected": dimension, "got": len(vector)},
        )


def check_limit(limit: int) -> None:
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")


def top_hits(hits: Iterable[VectorHit], limit: int) -> list[VectorHit]:
    """The ``limit`` best hits, highest score first, each id once (its first occurrence wins)."""
    best: dict[Any, VectorHit] = {}
    for hit in hits:
        best.setdefault(hit.id, hit)
    return sorted(best.values(), key=lambda hit: hit.score, reverse=True)[:limit]


class TenantGatedSearch(ABC):
    """:meth:`search` and :meth:`search_lexical` of :class:`~shared.ports.VectorIndex`, gated the
    same way for every adapter: the limit checked, the tenant's conditions made (no query at all
    when they see nothing, or a lexical query has no terms), the vector's size checked; the
    adapter runs only the query, on conditions it is given."""

    dimension: int

    async def search(self, vector: Sequence[float], tenant: TenantFilter, limit: int) -> list[VectorHit]:
        check_limit(limit)
        conditions = tenant_conditions(tenant)
        if conditions is None:
            return []
        check_dimension(vector, self.dimension)
        return await self._query_vector(vector, conditions, limit)

    async def search_lexical(
        self, terms: Mapping[int, float], tenant: TenantFilter, limit: int
    ) -> list[VectorHit]:
        check_limit(limit)
        conditions = tenant_conditions(tenant)
        if conditions is None or not terms:
            return []
        return await self._query_lexical(terms, conditions, limit)

    @abstractmethod
    async def _query_vector(
        self, vector: Sequence[float], conditions: Sequence[Condition], limit: int
    ) -> list[VectorHit]:
        """The ``limit`` nearest points to ``vector`` that meet every one of ``conditions``."""

    @abstractmethod
    async def _query_lexical(
        self, terms: Mapping[int, float], conditions: Sequence[Condition], limit: int
    ) -> list[VectorHit]:
        """The ``limit`` best points by the sparse ``terms`` that meet every one of ``conditions``."""
