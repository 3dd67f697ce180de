"""One clock for the codebase, so tests and records agree on timezone-aware UTC."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["utcnow"]


def utcnow() -> datetime:
    return datetime.now(UTC)
