"""The memory-entry table's one gateway (STYLE habit 17, after eventsourcing's recorders and
Graphiti's ``*Operations``): no module outside this package names ``memory_entries``, for reads
as for writes (``tests/unit/test_entry_gateway.py`` holds that true; the schema in
``shared.storage.db.models`` and the migrations define the table).

- :mod:`.store` — the tenancy predicate (:func:`in_scope`), one entry as a typed row
  (:class:`Entry`), and every write (:class:`EntryStore`: the save path's upsert, manage's
  versions and merges, erasure's deletes), announced on ``memory.written`` in the caller's
  transaction.
- :mod:`.recall` — recall's reads, compiled once per shape, as :class:`~.recall.Candidate` rows.
- :mod:`.listing` — inspection's and export's keyset pages.
- :mod:`.indexing` — the embed service's reads and its ``embedding_*`` columns.

Erasure's meaning (lineage, tombstones, ``memory.purged``) stays in :mod:`shared.storage.erasure`.
"""

# The package's names are the store's, listed once there.
from shared.storage.entries import store as _store
from shared.storage.entries.store import *  # noqa: F403

__all__ = _store.__all__
