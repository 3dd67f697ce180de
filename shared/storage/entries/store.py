"""Entries as stored: the tenancy predicate, whole-entry reads as typed rows, and every write.

- **Tenancy**: :func:`in_scope` is the predicate every read of entries starts from — the
  organization, the agent config and the owner keys (:mod:`shared.security.tenancy` keys owners) — so no
  reader retypes it or leaves a part out.
- **Reads**: :class:`Entry` is a whole entry as read (every column but the derived full-text
  vector); :meth:`EntryStore.get` and the page reads of :mod:`shared.storage.entries.listing` return it.
- **Writes**: :class:`EntryStore` stores entries — the save path's owner-scoped upsert, manage's
  new versions and merges — and changes them. Every write that changes what an entry says
  announces ``memory.written`` through the outbox in the caller's transaction, so the row and its
  event commit together (SPEC 4.3) and the embed service (re-)indexes it. Erasure's deletes are
  here too (:meth:`EntryStore.lock`, :meth:`EntryStore.delete`); what an erasure means —
  lineage, tombstones, ``memory.purged`` — is :mod:`shared.storage.erasure`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple
from uuid import UUID

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    and_,
    bindparam,
    delete,
    false,
    func,
    literal_column,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import array
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.common import Principal
from contracts.events import MemoryWritten
from contracts.subjects import MEMORY_WRITTEN
from shared.runtime.cooperative import TimeSlice
from shared.storage.db.compiled import one_of
from shared.storage.db.models import ENTRIES
from shared.storage.outbox import enqueue_many

__all__ = [
    "ENTRY_COLUMNS",
    "DedupeKey",
    "Entry",
    "EntryRef",
    "EntryStore",
    "NewEntry",
    "Upserted",
    "covered",
    "dedupe_key",
    "in_scope",
    "with_ids",
]

#: Every column but the derived full-text vector: what a read of whole entries selects.
ENTRY_COLUMNS = tuple(c for c in ENTRIES.c if c.name != "search")


class Entry(NamedTuple):
    """One entry as read, every column of :data:`ENTRY_COLUMNS` (a test holds the two equal).
    A named tuple: rows of a page become entries at the cost of one tuple each."""

    id: UUID
    org_id: UUID
    agent_config_id: UUID
    owner_key: str
    owner_kind: str | None
    owner_id: str | None
    session_id: str | None
    text: str
    fingerprint: str
    importance: float
    reinforcement_count: int
    memory_type: str
    layer: str
    source: str
    source_agent: str | None
    confidence: float
    reliability: float
    lifecycle: str
    pinned: bool
    category: str | None
    confirmation: str | None
    sensitivity: str | None
    consent: str | None
    redaction: list[str]
    quarantined: bool
    quarantine_reasons: list[str]
    provenance: dict[str, Any]
    expires_at: datetime | None
    occurred_at: datetime | None
    session_position: int | None
    created_at: datetime
    updated_at: datetime
    last_accessed_at: datetime | None
    access_count: int
    version: int
    supersedes: UUID | None
    superseded_by: UUID | None
    valid_from: datetime | None
    valid_until: datetime | None
    derived_from: list[str]
    embedding_status: str
    embedding_model: str | None
    embedding_dimension: int | None
    metadata: dict[str, Any]

    def values(self) -> dict[str, Any]:
        """The row by column name: what :meth:`EntryStore.insert` takes (a copy's starting point)."""
        return self._asdict()


#: :class:`Entry`'s fields in the order :data:`ENTRY_COLUMNS` selects them (rows are built by
#: position: the table's column order is the model's, not necessarily the tuple's).
_SELECTED = tuple(c.name for c in ENTRY_COLUMNS)


def entry(row: Sequence[Any]) -> Entry:
    """A row of :data:`ENTRY_COLUMNS` as an :class:`Entry`."""
    return Entry(**dict(zip(_SELECTED, row, strict=True)))


class EntryRef(NamedTuple):
    """What erasure needs of an entry: which it is, its agent config (events go per config) and
    its layer (receipts count observations)."""

    id: UUID
    agent_config_id: UUID
    layer: str


#: The owner-scoped dedupe key (SPEC 4.3): ``(org_id, agent_config_id, owner_key, fingerprint)``.
DedupeKey = tuple[UUID, UUID, str, str]

_INSERT = pg_insert(ENTRIES)
#: Insert, or — same owner scope, same fingerprint — reinforce: keep the higher importance and
#: count (a new row arrives with ``reinforcement_count`` = its recurrences within the batch).
#: One statement, built once, so racing writers still produce one row.
_UPSERT = _INSERT.on_conflict_do_update(
    index_elements=["org_id", "agent_config_id", "owner_key", "fingerprint"],
    index_where=text("lifecycle <> 'superseded'"),
    set_={
        "importance": func.greatest(ENTRIES.c.importance, _INSERT.excluded.importance),
        "reinforcement_count": ENTRIES.c.reinforcement_count + _INSERT.excluded.reinforcement_count + 1,
        "updated_at": _INSERT.excluded.updated_at,
    },
).returning(
    ENTRIES.c.id,
    literal_column("(xmax = 0)"),
    ENTRIES.c.version,
    ENTRIES.c.importance,
    # The key, to match returned rows to the batch's rows (RETURNING order is not guaranteed).
    ENTRIES.c.org_id,
    ENTRIES.c.agent_config_id,
    ENTRIES.c.owner_key,
    ENTRIES.c.fingerprint,
)

_BUMP = (
    update(ENTRIES)
    .where(ENTRIES.c.id == bindparam("entry_id"))
    .values(access_count=ENTRIES.c.access_count + bindparam("n"), last_accessed_at=bindparam("at"))
)


def in_scope(
    org_id: UUID | BindParameter[UUID],
    agent_config_id: UUID | BindParameter[UUID] | None,
    owner_keys: Iterable[str | BindParameter[str]] | BindParameter[list[str]],
    *,
    session_id: str | BindParameter[str] | None = None,
) -> ColumnElement[bool]:
    """Entries of ``org_id`` and ``agent_config_id`` (None: every agent config of the organization,
    as export and purge may span them) owned by one of ``owner_keys`` — and with ``session_id``,
    of exactly that session. No owner keys is a caller who sees nothing: it matches nothing.
    In a compiled template (``shared.storage.db.compiled``) each value may be a named bind, the owner
    keys a bind of the whole list."""
    if isinstance(owner_keys, BindParameter):
        owned = one_of(ENTRIES.c.owner_key, owner_keys)
    else:
        keys = tuple(dict.fromkeys(owner_keys))
        if not keys:
            return false()
        owned = ENTRIES.c.owner_key == keys[0] if len(keys) == 1 else ENTRIES.c.owner_key.in_(keys)
    parts: list[ColumnElement[bool]] = [ENTRIES.c.org_id == org_id]
    if agent_config_id is not None:
        parts.append(ENTRIES.c.agent_config_id == agent_config_id)
    parts.append(owned)
    if session_id is not None:
        parts.append(ENTRIES.c.session_id == session_id)
    return and_(*parts)


def covered(
    org_id: UUID,
    agent_config_id: UUID | None,
    owner_key: str,
    *,
    session_id: str | None,
    fingerprints: Sequence[str] | None,
    until: datetime,
) -> ColumnElement[bool]:
    """The entries an erasure covered (a purge ledger's record, re-applied): the owner's, of the
    agent config and session when given, created up to ``until``, only the texts of
    ``fingerprints`` when given."""
    where = and_(
        in_scope(org_id, agent_config_id, (owner_key,), session_id=session_id), ENTRIES.c.created_at <= until
    )
    if fingerprints is not None:
        where = and_(where, ENTRIES.c.fingerprint.in_(list(fingerprints)))
    return where


def with_ids(ids: Sequence[UUID]) -> ColumnElement[bool]:
    """Entries by id (what an erasure of known entries selects; :func:`in_scope` narrows further)."""
    return ENTRIES.c.id == ids[0] if len(ids) == 1 else ENTRIES.c.id.in_(list(ids))


def dedupe_key(row: Mapping[str, Any]) -> DedupeKey:
    """The owner-scoped dedupe key of a row about to be stored."""
    return (row["org_id"], row["agent_config_id"], row["owner_key"], row["fingerprint"])


@dataclass(frozen=True)
class NewEntry:
    """One occurrence of a text a writer stores: the whole row, and the trace its event carries
    (None: the current span's)."""

    row: Mapping[str, Any]
    trace_headers: dict[str, str] | None = None


@dataclass(frozen=True)
class Upserted:
    """What happened to one :class:`NewEntry`: stored as a new row (``saved``) or reinforced one."""

    entry_id: UUID
    saved: bool


class EntryStore:
    """The memory-entry table within the caller's transaction (the caller commits)."""

    def __init__(self, session: AsyncSession) -> None:
        self._session = session

    # -- reads ----------------------------------------------------------------------------------
    async def get(
        self, org_id: UUID, agent_config_id: UUID, entry_id: UUID, *, for_update: bool = False
    ) -> Entry | None:
        """Entry ``entry_id`` of the organization and agent config, or None. Its owner is the
        caller's to check: an entry of another owner must answer as a missing one."""
        stmt = select(*ENTRY_COLUMNS).where(
            ENTRIES.c.id == entry_id,
            ENTRIES.c.org_id == org_id,
            ENTRIES.c.agent_config_id == agent_config_id,
        )
        if for_update:
            stmt = stmt.with_for_update()
        row = (await self._session.execute(stmt)).first()
        return None if row is None else entry(row)

    async def visible(
        self, org_id: UUID, agent_config_id: UUID, owner_keys: Iterable[str], entry_id: UUID
    ) -> Entry | None:
        """Entry ``entry_id`` if one of ``owner_keys`` owns it (None otherwise), locked: a change
        by whom may see it (feedback) follows."""
        stmt = select(*ENTRY_COLUMNS).where(
            ENTRIES.c.id == entry_id, in_scope(org_id, agent_config_id, owner_keys)
        )
        row = (await self._session.execute(stmt.with_for_update())).first()
        return None if row is None else entry(row)

    async def holding(self, key: DedupeKey) -> list[UUID]:
        """The current (not superseded) entries under a dedupe key: what the unique index holds."""
        org_id, agent_config_id, owner_key, fingerprint = key
        found = await self._session.execute(
            select(ENTRIES.c.id).where(
                in_scope(org_id, agent_config_id, (owner_key,)),
                ENTRIES.c.fingerprint == fingerprint,
                ENTRIES.c.lifecycle != "superseded",
            )
        )
        return list(found.scalars().all())

    async def count(self, org_id: UUID, agent_config_id: UUID) -> int:
        """How many entries the agent config holds (every owner, every lifecycle)."""
        stmt = select(func.count()).where(
            ENTRIES.c.org_id == org_id, ENTRIES.c.agent_config_id == agent_config_id
        )
        return int((await self._session.execute(stmt)).scalar_one())

    async def least_important(self, org_id: UUID, agent_config_id: UUID, limit: int) -> list[UUID]:
        """Up to ``limit`` unpinned entries of the agent config, lowest importance then oldest
        first: what a prune to a cap erases."""
        stmt = (
            select(ENTRIES.c.id)
            .where(
                ENTRIES.c.org_id == org_id,
                ENTRIES.c.agent_config_id == agent_config_id,
                ENTRIES.c.pinned.is_(False),
            )
            .order_by(ENTRIES.c.importance.asc(), ENTRIES.c.created_at.asc(), ENTRIES.c.id)
            .limit(limit)
        )
        return list((await self._session.execute(stmt)).scalars().all())

    async def expired(self, now: datetime, limit: int) -> list[tuple[UUID, UUID]]:
        """Up to ``limit`` entries expired by ``now`` as ``(id, org_id)``, soonest expiry first,
        locked — skipping rows another sweeper holds, so sweepers share the backlog."""
        stmt = (
            select(ENTRIES.c.id, ENTRIES.c.org_id)
            .where(ENTRIES.c.expires_at.is_not(None), ENTRIES.c.expires_at <= now)
            .order_by(ENTRIES.c.expires_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        return [(entry_id, org_id) for entry_id, org_id in await self._session.execute(stmt)]

    async def accessed(self, hits: Mapping[UUID, int], at: datetime) -> None:
        """Count recalls' disclosures of entries (``access_count``, ``last_accessed_at``): one
        column pair that recall's side effects own; nothing is announced."""
        if not hits:
            return
        # In id order: concurrent flushers (several recall instances) lock rows alike.
        params = [
            {"entry_id": i, "n": n, "at": at} for i, n in sorted(hits.items(), key=lambda kv: str(kv[0]))
        ]
        await self._session.execute(_BUMP, params)

    # -- erasure (shared.storage.erasure decides what; these touch the rows) -----------------------------
    async def lock(self, org_id: UUID, where: ColumnElement[bool]) -> list[EntryRef]:
        """The organization's entries matching ``where`` (:func:`in_scope`, :func:`with_ids`),
        locked for their erasure."""
        stmt = select(ENTRIES.c.id, ENTRIES.c.agent_config_id, ENTRIES.c.layer).where(
            ENTRIES.c.org_id == org_id, where
        )
        return [EntryRef(*r) for r in await self._session.execute(stmt.with_for_update())]

    async def linked(self, org_id: UUID, ids: Sequence[UUID]) -> list[EntryRef]:
        """Entries linked to ``ids`` by one step of edit versions (``supersedes`` /
        ``superseded_by``, both directions) or merges (``derived_from``), locked.

        A knowledge update's link is not lineage: the old entry (``valid_until`` set) holds other
        knowledge than the one that replaced it, so erasing either leaves the other
        (docs/adr/0103-knowledge-updates.md)."""
        as_text = [str(i) for i in ids]
        older = ENTRIES.alias("older")
        edited = select(older.c.id).where(
            older.c.org_id == org_id, older.c.id.in_(ids), older.c.valid_until.is_(None)
        )
        stmt = select(ENTRIES.c.id, ENTRIES.c.agent_config_id, ENTRIES.c.layer).where(
            ENTRIES.c.org_id == org_id,
            or_(
                ENTRIES.c.supersedes.in_(edited),
                and_(ENTRIES.c.superseded_by.in_(ids), ENTRIES.c.valid_until.is_(None)),
                # merges that folded one in (a merge's sources point to it by superseded_by)
                ENTRIES.c.derived_from.has_any(array(as_text)),
            ),
        )
        return [EntryRef(*r) for r in await self._session.execute(stmt.with_for_update())]

    async def delete(self, ids: Sequence[UUID]) -> None:
        """Delete the rows (an erasure's last step: :func:`shared.storage.erasure.erase` announces it).

        Knowledge updates that pointed at them lose the pointer (the erased entry leaves the
        chain); an entry it superseded stays superseded — erasing knowledge does not make the
        knowledge it replaced true again."""
        listed = list(ids)
        await self._session.execute(delete(ENTRIES).where(ENTRIES.c.id.in_(listed)))
        await self._session.execute(
            update(ENTRIES).where(ENTRIES.c.supersedes.in_(listed)).values(supersedes=None)
        )
        await self._session.execute(
            update(ENTRIES).where(ENTRIES.c.superseded_by.in_(listed)).values(superseded_by=None)
        )

    # -- writes ---------------------------------------------------------------------------------
    async def upsert(self, new: Sequence[NewEntry]) -> list[Upserted]:
        """Store a batch of occurrences with the owner-scoped dedupe, in one statement.

        Occurrences of one dedupe key fold into one row (the first's, with the highest importance
        and ``reinforcement_count`` = the further occurrences); a stored row under the key is
        reinforced instead. The first occurrence of a key is ``saved`` when its row is new, every
        other one reinforced — exactly what storing them one after another gives. Each occurrence
        is announced on ``memory.written`` (``saved`` or ``reinforced``) with its own trace.
        """
        if not new:
            return []
        folded: dict[DedupeKey, dict[str, Any]] = {}
        counts: dict[DedupeKey, int] = {}
        for occurrence in new:
            key = dedupe_key(occurrence.row)
            if key in folded:
                row = folded[key]
                row["importance"] = max(row["importance"], occurrence.row["importance"])
                counts[key] += 1
            else:
                folded[key], counts[key] = dict(occurrence.row), 1
        await _place_in_sessions(
            self._session, [row for row in folded.values() if row["session_id"] is not None]
        )
        # Key order, so two batches lock the rows they share in the same order (no deadlock);
        # keys are unique within the statement, as one ON CONFLICT DO UPDATE requires.
        ordered = sorted(folded, key=lambda k: (str(k[0]), str(k[1]), k[2], k[3]))
        returned = await self._session.execute(
            _UPSERT, [{**folded[k], "reinforcement_count": counts[k] - 1} for k in ordered]
        )
        stored = {
            (org_id, agent_config_id, owner, fp): (entry_id, bool(inserted), version, importance)
            for entry_id, inserted, version, importance, org_id, agent_config_id, owner, fp in returned
        }
        out: list[Upserted] = []
        events: list[tuple[MemoryWritten, dict[str, str] | None]] = []
        first_seen: set[DedupeKey] = set()
        slicer = TimeSlice()  # a batch is hundreds of events: recall answers in between
        for occurrence in new:
            await slicer.turn()
            key = dedupe_key(occurrence.row)
            entry_id, inserted, version, importance = stored[key]
            saved = inserted and key not in first_seen
            first_seen.add(key)
            out.append(Upserted(entry_id, saved))
            outcome: Literal["saved", "reinforced"] = "saved" if saved else "reinforced"
            event = _written(occurrence.row, entry_id, outcome, version=version, importance=importance)
            events.append((event, occurrence.trace_headers))
        await self._announce(events)
        return out

    async def insert(self, row: Mapping[str, Any]) -> None:
        """Store a whole new row (a new version of an entry, a merge) and announce it ``saved``."""
        await self._session.execute(ENTRIES.insert().values(dict(row)))
        await self._announce([(_written(row, row["id"], "saved"), None)])

    async def update(self, entry_id: UUID, *, announce: bool = False, **values: Any) -> None:
        """Set ``values`` on one entry. ``announce`` when what it says changed (text, owner): the
        entry as it now is goes out on ``memory.written`` and the embed service re-indexes it."""
        stmt = update(ENTRIES).where(ENTRIES.c.id == entry_id).values(**values)
        if not announce:
            await self._session.execute(stmt)
            return
        row = (await self._session.execute(stmt.returning(*ENTRY_COLUMNS))).one()
        await self._announce([(_written(dict(row._mapping), entry_id, "saved"), None)])

    async def _announce(self, events: Sequence[tuple[MemoryWritten, dict[str, str] | None]]) -> None:
        await enqueue_many(self._session, [(MEMORY_WRITTEN, e, e.event_id, h) for e, h in events])


_POSITIONS = text("SELECT nextval('memory_entry_session_position') FROM generate_series(1, :n)")


async def _place_in_sessions(session: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    """Number the new rows of entries saved with a session in the order their drafts came
    (``rows`` keeps it): within a session, a smaller ``session_position`` was saved earlier,
    which is what recall's neighbourhood reads. One sequence for all sessions, so concurrent
    writers never collide; a reinforced entry keeps the place it was first saved at (the upsert
    does not update the column)."""
    if not rows:
        return
    numbers = sorted((await session.execute(_POSITIONS, {"n": len(rows)})).scalars())
    for row, number in zip(rows, numbers, strict=True):
        row["session_position"] = number


def _written(
    row: Mapping[str, Any],
    entry_id: UUID,
    outcome: Literal["saved", "reinforced"],
    *,
    version: int | None = None,
    importance: float | None = None,
) -> MemoryWritten:
    """The ``memory.written`` event of ``row`` (ids and metadata, never text: SPEC 6); ``version``
    and ``importance`` as the table holds them after an upsert, else the row's own."""
    kind, owner_id = row["owner_kind"], row["owner_id"]
    return MemoryWritten(
        org_id=row["org_id"],
        agent_config_id=row["agent_config_id"],
        entry_id=entry_id,
        outcome=outcome,
        owner=Principal(kind=kind, id=owner_id) if kind else None,
        session_id=row["session_id"],
        layer="observation" if row["layer"] == "observation" else "memory",
        memory_type=row["memory_type"],
        source=row["source"],
        importance=row["importance"] if importance is None else importance,
        version=row["version"] if version is None else version,
        quarantined=row["quarantined"],
    )
