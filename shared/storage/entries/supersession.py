"""Knowledge updates in the table (docs/adr/0103-knowledge-updates.md): the older entries a new
one may update (its neighbourhood), and the supersession itself.

Candidates are the same owner's newest current entries of the same agent config (:data:`WINDOW`)
that share a word with the new text or one of its attributes' trigger words (Postgres full
text), best match first, a few per new entry: the rules (:mod:`shared.text.supersession`) only accept a
pair with the same subject and the same attribute (or the same words, negated). Only entries saved
before the new one are candidates here (the save path compares a batch's own entries itself). Only a new
entry that could update anything (:func:`shared.text.supersession.could_update`) looks them up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from sqlalchemy import text, update
from sqlalchemy.ext.asyncio import AsyncSession

from shared.storage.db.models import ENTRIES
from shared.text.supersession import ELIGIBLE_LAYER, INELIGIBLE_TYPES, search_words

__all__ = ["NEIGHBOURS", "WINDOW", "Neighbour", "NewText", "neighbours", "supersede"]

#: Candidates per new entry: the rules and a model judge see at most these.
NEIGHBOURS = 8
#: The owner's newest current entries the candidates are found among (the scope index read
#: backwards, then the full-text match and its rank on these only): bounds the work whatever the
#: owner holds — matching and ranking all of an owner's 10k entries cost 75 ms per new entry
#: (docs/benchmarks.md) — at the price of never superseding an entry this many newer ones follow.
WINDOW = 200


class NewText(NamedTuple):
    id: UUID
    org_id: UUID
    agent_config_id: UUID
    owner_key: str
    text: str
    created_at: datetime


@dataclass(frozen=True)
class Neighbour:
    id: UUID
    text: str
    created_at: datetime


def _tsquery(text_: str) -> str | None:
    """An OR of the text's words and its attributes' trigger words (quoted plain lexemes: no
    operator from a text reaches the query parser)."""
    words = "".join(c if c.isalnum() else " " for c in " ".join(search_words(text_))).split()
    kept = list(dict.fromkeys(w for w in words if len(w) > 1))[:64]
    return " | ".join(f"'{w}'" for w in kept) or None


async def neighbours(session: AsyncSession, new: Sequence[NewText]) -> dict[UUID, list[Neighbour]]:
    """For each new entry, up to :data:`NEIGHBOURS` older current entries of its owner that share
    a word with it (best full-text match first): what it may supersede."""
    queried = [(n, q) for n in new if (q := _tsquery(n.text)) is not None]
    if not queried:
        return {}
    # One statement per batch: the new ids and their queries as parallel arrays, a lateral
    # best-first search per new entry.
    stmt = text(
        """
        SELECT n.new_id, c.id, c.text, c.created_at
        FROM unnest(CAST(:ids AS uuid[]), CAST(:queries AS text[])) AS n(new_id, q)
        CROSS JOIN LATERAL (SELECT to_tsquery('english', n.q) AS tq) AS t
        JOIN memory_entries e ON e.id = n.new_id
        JOIN LATERAL (
            SELECT m.id, m.text, m.created_at
            FROM (
                SELECT o.id, o.text, o.created_at, o.search
                FROM memory_entries o
                WHERE o.org_id = e.org_id AND o.agent_config_id = e.agent_config_id
                  AND o.owner_key = e.owner_key
                  AND o.lifecycle = 'active' AND o.layer = :layer AND NOT o.quarantined
                  AND o.memory_type <> ALL(CAST(:ineligible AS text[]))
                  AND o.created_at < e.created_at
                  AND (o.expires_at IS NULL OR o.expires_at > e.created_at)
                ORDER BY o.created_at DESC
                LIMIT :window
            ) m
            WHERE m.search @@ t.tq
            ORDER BY ts_rank(m.search, t.tq) DESC, m.created_at DESC
            LIMIT :limit
        ) c ON true
        """
    )
    rows = await session.execute(
        stmt,
        {
            "ids": [str(n.id) for n, _ in queried],
            "queries": [q for _, q in queried],
            "layer": ELIGIBLE_LAYER,
            "ineligible": sorted(INELIGIBLE_TYPES),
            "limit": NEIGHBOURS,
            "window": WINDOW,
        },
    )
    out: dict[UUID, list[Neighbour]] = {}
    for new_id, old_id, old_text, created_at in rows:
        out.setdefault(new_id, []).append(Neighbour(old_id, old_text, created_at))
    return out


async def supersede(session: AsyncSession, old_id: UUID, new_id: UUID, at: datetime) -> bool:
    """Mark ``old_id`` superseded by ``new_id`` as of ``at``; False (nothing changed) when the old
    one is no longer current (a concurrent writer superseded, edited or erased it first)."""
    marked = await session.execute(
        update(ENTRIES)
        .where(ENTRIES.c.id == old_id, ENTRIES.c.lifecycle == "active")
        .values(lifecycle="superseded", superseded_by=new_id, valid_until=at, updated_at=at)
        .returning(ENTRIES.c.id)
    )
    if marked.first() is None:
        return False
    await session.execute(
        update(ENTRIES).where(ENTRIES.c.id == new_id).values(supersedes=old_id, valid_from=at)
    )
    return True
