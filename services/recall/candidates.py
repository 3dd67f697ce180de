"""The entry fields recall ranks and renders, as read from the store (already scoped):
:class:`Candidate` is the entry gateway's row (``shared.storage.entries.recall``); what may be shown of it
is decided here."""

from __future__ import annotations

from typing import Any

from shared.storage.entries.recall import Candidate
from shared.text.memory_block import QUARANTINE_PLACEHOLDER

__all__ = ["QUARANTINE_PLACEHOLDER", "Candidate", "display_metadata", "display_text"]


def display_text(candidate: Candidate) -> str:
    """The text recall may show for ``candidate``: the placeholder when it is quarantined."""
    return QUARANTINE_PLACEHOLDER if candidate.quarantined else candidate.text


def display_metadata(candidate: Candidate) -> dict[str, Any]:
    """The metadata recall may show for ``candidate``: none when it is quarantined (its writer
    chose the metadata as it chose the text)."""
    return {} if candidate.quarantined else candidate.metadata
