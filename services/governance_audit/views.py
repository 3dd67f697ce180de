"""Entries as management and export show them (SPEC 2, every field)."""

from __future__ import annotations

from uuid import UUID

from contracts.common import Principal
from contracts.governance import EntryView
from shared.security.access import Caller
from shared.storage.entries import Entry, EntryStore

__all__ = ["QUARANTINE_PLACEHOLDER", "entry_view", "load_entry"]

QUARANTINE_PLACEHOLDER = "[quarantined memory withheld]"
#: The view's fields that are not a column of the row as it is.
_MADE_HERE = frozenset({"owner", "text", "redaction", "derived_from", "metadata"})


def entry_view(row: Entry, *, show_quarantined: bool) -> EntryView:
    """``row`` as shown; a quarantined entry's text and metadata (what its writer chose) are
    withheld unless ``show_quarantined`` (a ``memory.admin`` caller reviewing quarantine)."""
    owner = Principal(kind=row.owner_kind, id=row.owner_id) if row.owner_kind else None
    withheld = row.quarantined and not show_quarantined
    text = QUARANTINE_PLACEHOLDER if withheld else row.text
    # Every field the view shares with the row is copied as it is; the rest are made here.
    copied = {name: getattr(row, name) for name in EntryView.model_fields if name not in _MADE_HERE}
    return EntryView(
        **copied,
        owner=owner,
        text=text,
        redaction=list(row.redaction or []),
        derived_from=[UUID(str(x)) for x in row.derived_from or []],
        metadata={} if withheld else dict(row.metadata or {}),
    )


async def load_entry(
    entries: EntryStore, caller: Caller, entry_id: UUID, agent_config_id: UUID, *, for_update: bool = False
) -> Entry:
    """The entry ``entry_id`` of the caller's organization and ``agent_config_id``, if the caller
    may see it; ``NOT_FOUND`` otherwise (:meth:`Caller.require_sees`). ``for_update`` locks it."""
    row = await entries.get(caller.org_id, agent_config_id, entry_id, for_update=for_update)
    return caller.require_sees(row)
