"""Entries as management and export show them (SPEC 2, every field)."""

from __future__ import annotations

from uuid import UUID

from contracts.common import Principal
from contracts.governance import EntryView
from shared.security.access import Caller
from shared.storage.entries import Entry, EntryStore

__all__ = ["QUARANTINE_PLACEHOLDER", "entry_view", "load_entry"]

QUARANTINE_PLACEHOLDER = "[quarantined memory withheld]"


def entry_view(row: Entry, *, show_quarantined: bool) -> EntryView:
    """``row`` as shown; a quarantined entry's text and metadata (what its writer chose) are
    withheld unless ``show_quarantined`` (a ``memory.admin`` caller reviewing quarantine)."""
    owner = Principal(kind=row.owner_kind, id=row.owner_id) if row.owner_kind else None
    withheld = row.quarantined and not show_quarantined
    text = QUARANTINE_PLACEHOLDER if withheld else row.text
    return EntryView(
        id=row.id,
        org_id=row.org_id,
        agent_config_id=row.agent_config_id,
        owner=owner,
        session_id=row.session_id,
        text=text,
        fingerprint=row.fingerprint,
        importance=row.importance,
        reinforcement_count=row.reinforcement_count,
        memory_type=row.memory_type,
        layer=row.layer,
        source=row.source,
        source_agent=row.source_agent,
        confidence=row.confidence,
        reliability=row.reliability,
        lifecycle=row.lifecycle,
        pinned=row.pinned,
        category=row.category,
        confirmation=row.confirmation,
        sensitivity=row.sensitivity,
        consent=row.consent,
        redaction=list(row.redaction or []),
        quarantined=row.quarantined,
        expires_at=row.expires_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
        last_accessed_at=row.last_accessed_at,
        access_count=row.access_count,
        version=row.version,
        supersedes=row.supersedes,
        superseded_by=row.superseded_by,
        valid_from=row.valid_from,
        valid_until=row.valid_until,
        derived_from=[UUID(str(x)) for x in row.derived_from or []],
        embedding_status=row.embedding_status,
        metadata={} if withheld else dict(row.metadata or {}),
        occurred_at=row.occurred_at,
        session_position=row.session_position,
    )


async def load_entry(
    entries: EntryStore, caller: Caller, entry_id: UUID, agent_config_id: UUID, *, for_update: bool = False
) -> Entry:
    """The entry ``entry_id`` of the caller's organization and ``agent_config_id``, if the caller
    may see it; ``NOT_FOUND`` otherwise (:meth:`Caller.require_sees`). ``for_update`` locks it."""
    row = await entries.get(caller.org_id, agent_config_id, entry_id, for_update=for_update)
    return caller.require_sees(row)
