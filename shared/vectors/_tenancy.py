"""What every adapter of :class:`~shared.ports.VectorIndex` does the same way: the payload stored
beside a vector, the checks on a tenant filter and on vector sizes, and the order of hits."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from contracts.errors import EmbeddingDimensionMismatch
from shared.ports import TenantFilter, VectorHit, VectorPoint

__all__ = [
    "KEYWORD_FIELDS",
    "TENANT_FIELD",
    "check_dimension",
    "check_limit",
    "payload_of",
    "sees_anything",
    "top_hits",
]

#: The payload fields indexed as keywords (every one a filter of :class:`TenantFilter`).
KEYWORD_FIELDS = ("org_id", "agent_config_id", "owner_key", "layer", "memory_type", "session_id")
#: The field every query pins to one value, so stores may lay out and index points by it.
TENANT_FIELD = "agent_config_id"


def payload_of(point: VectorPoint) -> dict[str, Any]:
    """The tenancy fields stored beside a vector (never the entry's text)."""
    return {
        "org_id": str(point.org_id),
        "agent_config_id": str(point.agent_config_id),
        "owner_key": point.owner_key,
        "layer": point.layer,
        "memory_type": point.memory_type,
        "session_id": point.session_id,
        "created_at": float(point.created_at),
    }


def sees_anything(tenant: TenantFilter) -> bool:
    """Refuse a filter without organization, agent config or owner scopes (``ValueError``);
    ``False`` when it can see nothing (no owner keys), so the caller returns no hits."""
    if tenant.org_id is None or tenant.agent_config_id is None:
        raise ValueError("a vector search needs both org_id and agent_config_id in its TenantFilter")
    if tenant.owner_keys is None:
        raise ValueError("a vector search needs owner_keys in its TenantFilter (empty sees nothing)")
    return len(tenant.owner_keys) > 0


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
