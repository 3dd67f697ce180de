"""The entry fields recall ranks and renders, as read from the store (already scoped)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from shared.memory_block import QUARANTINE_PLACEHOLDER

__all__ = ["QUARANTINE_PLACEHOLDER", "Candidate", "display_metadata", "display_text"]


class Candidate(NamedTuple):
    """One visible, active, unexpired entry that a strategy may return.

    A named tuple, not a frozen dataclass: hybrid builds a few hundred per recall, and a frozen
    dataclass's ``__init__`` (one ``object.__setattr__`` per field) cost five times as much."""

    id: UUID
    text: str
    importance: float
    created_at: datetime
    updated_at: datetime
    memory_type: str
    layer: str
    session_id: str | None
    metadata: dict[str, Any]
    pinned: bool
    quarantined: bool
    source: str
    reinforcement_count: int
    confidence: float
    reliability: float
    owner_key: str
    #: when the entry leaves recall (None: never); bounds how long a reply with it may be cached.
    expires_at: datetime | None = None
    #: when what it records happened, as its writer said (None: not said; ``created_at`` stands in).
    occurred_at: datetime | None = None


def display_text(candidate: Candidate) -> str:
    """The text recall may show for ``candidate``: the placeholder when it is quarantined."""
    return QUARANTINE_PLACEHOLDER if candidate.quarantined else candidate.text


def display_metadata(candidate: Candidate) -> dict[str, Any]:
    """The metadata recall may show for ``candidate``: none when it is quarantined (its writer
    chose the metadata as it chose the text)."""
    return {} if candidate.quarantined else candidate.metadata
