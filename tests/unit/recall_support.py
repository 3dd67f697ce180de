"""Builders for the recall domain tests: candidates with sensible defaults."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from services.recall.candidates import Candidate
from services.recall.ranking import Ranked

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)


def uid(n: int) -> UUID:
    """A readable, ordered UUID: ``uid(1) < uid(2)``."""
    return UUID(int=n)


def cand(n: int, text: str | None = None, *, age_days: float = 0.0, **fields: Any) -> Candidate:
    """Candidate ``n`` created ``age_days`` before ``NOW``; any field can be overridden."""
    created = NOW - timedelta(days=age_days)
    values: dict[str, Any] = {
        "id": uid(n),
        "text": f"memory number {n}" if text is None else text,
        "importance": 0.5,
        "created_at": created,
        "updated_at": created,
        "memory_type": "lesson",
        "layer": "memory",
        "session_id": None,
        "metadata": {},
        "pinned": False,
        "quarantined": False,
        "source": "distill",
        "reinforcement_count": 0,
        "confidence": 0.8,
        "reliability": 1.0,
        "owner_key": "",
    }
    values.update(fields)
    return Candidate(**values)


def ranked(*cands: Candidate) -> list[Ranked]:
    """Candidates in the given order with descending positional scores."""
    return [Ranked(c, 1.0 / (1 + i)) for i, c in enumerate(cands)]


def ids(items: list[Ranked]) -> list[UUID]:
    return [r.candidate.id for r in items]
