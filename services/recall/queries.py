"""The SQL side of recall: every read is scoped by organization, agent config and the owner keys
the caller may see — the predicate is built in one place, so no strategy can forget a part of it."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import ColumnElement, Select, Text, and_, func, or_, select, text, union
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.recall import RecallFilters
from services.recall.candidates import Candidate
from shared.db.models import ENTRIES

__all__ = ["Scope", "by_ids", "lexical_ids", "newest", "pack_candidates", "top_importance"]

_COLUMNS = (
    ENTRIES.c.id,
    ENTRIES.c.text,
    ENTRIES.c.importance,
    ENTRIES.c.created_at,
    ENTRIES.c.updated_at,
    ENTRIES.c.memory_type,
    ENTRIES.c.layer,
    ENTRIES.c.session_id,
    ENTRIES.c.metadata,
    ENTRIES.c.pinned,
    ENTRIES.c.quarantined,
    ENTRIES.c.source,
    ENTRIES.c.reinforcement_count,
    ENTRIES.c.confidence,
    ENTRIES.c.reliability,
    ENTRIES.c.owner_key,
    ENTRIES.c.expires_at,
)


@dataclass(frozen=True)
class Scope:
    """Who may see what (SPEC 3) plus the request's narrowing (SPEC 5.5)."""

    org_id: UUID
    agent_config_id: UUID
    owner_keys: tuple[str, ...]
    now: datetime
    #: set when the config's scope is ``session``: only entries of exactly this session.
    session_only: str | None = None
    layer: str | None = None
    memory_types: tuple[str, ...] | None = None
    filters: RecallFilters | None = None

    def predicate(self) -> ColumnElement[bool]:
        if not self.owner_keys:
            raise ValueError("a scope without owner keys sees nothing; do not query")
        parts: list[ColumnElement[bool]] = [
            ENTRIES.c.org_id == self.org_id,
            ENTRIES.c.agent_config_id == self.agent_config_id,
            ENTRIES.c.owner_key.in_(self.owner_keys),
            ENTRIES.c.lifecycle == "active",
            or_(ENTRIES.c.expires_at.is_(None), ENTRIES.c.expires_at > self.now),
        ]
        if self.session_only is not None:
            parts.append(ENTRIES.c.session_id == self.session_only)
        if self.layer is not None:
            parts.append(ENTRIES.c.layer == self.layer)
        if self.memory_types is not None:
            parts.append(ENTRIES.c.memory_type.in_(self.memory_types))
        f = self.filters
        if f is not None:
            if f.memory_types is not None:
                parts.append(ENTRIES.c.memory_type.in_(f.memory_types))
            if f.min_importance is not None:
                parts.append(ENTRIES.c.importance >= f.min_importance)
            if f.min_confidence is not None:
                parts.append(ENTRIES.c.confidence >= f.min_confidence)
            if f.source is not None:
                parts.append(ENTRIES.c.source.in_(f.source))
            if f.source_agent is not None:
                parts.append(ENTRIES.c.source_agent == f.source_agent)
            if f.session_id is not None:
                parts.append(ENTRIES.c.session_id == f.session_id)
            if f.created_after is not None:
                parts.append(ENTRIES.c.created_at >= f.created_after)
            if f.created_before is not None:
                parts.append(ENTRIES.c.created_at < f.created_before)
        return and_(*parts)


def _candidates(rows: Sequence[Any]) -> list[Candidate]:
    return [
        Candidate(
            id=r.id,
            text=r.text,
            importance=r.importance,
            created_at=r.created_at,
            updated_at=r.updated_at,
            memory_type=r.memory_type,
            layer=r.layer,
            session_id=r.session_id,
            metadata=r.metadata,
            pinned=r.pinned,
            quarantined=r.quarantined,
            source=r.source,
            reinforcement_count=r.reinforcement_count,
            confidence=r.confidence,
            reliability=r.reliability,
            owner_key=r.owner_key,
            expires_at=r.expires_at,
        )
        for r in rows
    ]


async def _fetch(session: AsyncSession, stmt: Select[Any]) -> list[Candidate]:
    return _candidates((await session.execute(stmt)).all())


async def newest(session: AsyncSession, scope: Scope, limit: int) -> list[Candidate]:
    """Pinned first, then newest (``last_k``, ``full``)."""
    stmt = (
        select(*_COLUMNS)
        .where(scope.predicate())
        .order_by(ENTRIES.c.pinned.desc(), ENTRIES.c.created_at.desc(), ENTRIES.c.id)
        .limit(limit)
    )
    return await _fetch(session, stmt)


async def top_importance(session: AsyncSession, scope: Scope, limit: int) -> list[Candidate]:
    """Pinned first, then highest importance, then newest (``importance``)."""
    stmt = (
        select(*_COLUMNS)
        .where(scope.predicate())
        .order_by(
            ENTRIES.c.pinned.desc(), ENTRIES.c.importance.desc(), ENTRIES.c.created_at.desc(), ENTRIES.c.id
        )
        .limit(limit)
    )
    return await _fetch(session, stmt)


async def pack_candidates(session: AsyncSession, scope: Scope, each: int = 250) -> list[Candidate]:
    """SPEC 5.2: the ``each`` newest and the ``each`` highest-importance visible entries (union)."""
    ids_newest = (
        select(ENTRIES.c.id).where(scope.predicate()).order_by(ENTRIES.c.created_at.desc()).limit(each)
    )
    ids_important = (
        select(ENTRIES.c.id)
        .where(scope.predicate())
        .order_by(ENTRIES.c.importance.desc(), ENTRIES.c.created_at.desc())
        .limit(each)
    )
    ids = union(ids_newest, ids_important).subquery()
    stmt = select(*_COLUMNS).where(ENTRIES.c.id.in_(select(ids.c.id)))
    return await _fetch(session, stmt)


async def by_ids(session: AsyncSession, scope: Scope, ids: Sequence[UUID]) -> list[Candidate]:
    """The given entries that the scope allows (ids from a vector index are re-checked here)."""
    if not ids:
        return []
    stmt = select(*_COLUMNS).where(scope.predicate(), ENTRIES.c.id.in_(list(ids)))
    return await _fetch(session, stmt)


#: BM25's usual constants (Robertson & Zaragoza).
_BM25_K1, _BM25_B = 1.2, 0.75
#: At most this many matching entries are scored per query; beyond it the best by Postgres's
#: own rank are taken (document frequencies then count within them: an approximation that only
#: applies to cues whose words occur in thousands of entries).
_BM25_MAX_DOCS = 2000
_CORPUS_TTL_S = 30.0
_corpus_stats: dict[tuple[Any, ...], tuple[float, int, float]] = {}


async def lexical_ids(session: AsyncSession, scope: Scope, cue: str, limit: int) -> list[UUID]:
    return [entry_id for entry_id, _ in await lexical_scores(session, scope, cue, limit)]


async def lexical_scores(
    session: AsyncSession, scope: Scope, cue: str, limit: int
) -> list[tuple[UUID, float]]:
    """Okapi BM25 over Postgres full-text lexemes (English stemming, stop words removed): ids
    whose text shares a cue term, best first.

    Postgres finds the entries that contain any cue lexeme (GIN index); their lexeme counts and
    lengths come back as ``tsvector`` text and are scored here. Every entry of the scope that
    contains a cue term is among those matches, so document frequencies counted over them are
    exact (up to ``_BM25_MAX_DOCS`` matches). IDF down-weights words that occur everywhere —
    a speaker's name, say — which plain ``ts_rank`` cannot.
    """
    query = func.to_tsquery("english", _or_query(cue))
    cue_terms = await _lexemes(session, cue)
    if not cue_terms:
        return []
    stmt = (
        select(ENTRIES.c.id, func.cast(ENTRIES.c.search, Text))
        .where(scope.predicate(), ENTRIES.c.search.op("@@")(query))
        .order_by(func.ts_rank_cd(ENTRIES.c.search, query, text("1|32")).desc(), ENTRIES.c.id)
        .limit(_BM25_MAX_DOCS)
    )
    docs = [(row[0], _parse_tsvector(row[1])) for row in (await session.execute(stmt)).all()]
    if not docs:
        return []
    total, avg_len = await _corpus(session, scope)
    total = max(total, len(docs))
    df = {t: sum(1 for _, tf in docs if t in tf) for t in cue_terms}
    idf = {t: math.log(1 + (total - n + 0.5) / (n + 0.5)) for t, n in df.items()}
    scored = []
    for entry_id, tf in docs:
        length = len(tf) or 1  # distinct lexemes, as Postgres's length(tsvector) counts them
        norm = _BM25_K1 * (1 - _BM25_B + _BM25_B * length / max(avg_len, 1.0))
        score = sum(idf[t] * tf[t] * (_BM25_K1 + 1) / (tf[t] + norm) for t in cue_terms if t in tf)
        scored.append((score, entry_id))
    scored.sort(key=lambda pair: (-pair[0], str(pair[1])))
    return [(entry_id, score) for score, entry_id in scored[:limit]]


async def _lexemes(session: AsyncSession, cue: str) -> list[str]:
    """The cue's lexemes exactly as Postgres derives them for stored texts."""
    row = (await session.execute(select(func.cast(func.to_tsvector("english", cue), Text)))).scalar_one()
    return list(_parse_tsvector(row))


async def _corpus(session: AsyncSession, scope: Scope) -> tuple[int, float]:
    """Entries in scope and their average lexeme count, cached briefly (BM25 needs both; both
    change slowly)."""
    key = (scope.org_id, scope.agent_config_id, scope.owner_keys, scope.layer, scope.session_only)
    hit = _corpus_stats.get(key)
    if hit is not None and time.monotonic() - hit[0] < _CORPUS_TTL_S:
        return hit[1], hit[2]
    row = (
        await session.execute(
            select(func.count(), func.avg(func.length(ENTRIES.c.search))).where(scope.predicate())
        )
    ).one()
    total, avg_len = int(row[0]), float(row[1] or 1.0)
    if len(_corpus_stats) > 10_000:
        _corpus_stats.clear()
    _corpus_stats[key] = (time.monotonic(), total, avg_len)
    return total, avg_len


def _parse_tsvector(value: str | None) -> dict[str, int]:
    """``'card':3 'declin':4,7`` → ``{"card": 1, "declin": 2}`` (term → occurrences)."""
    out: dict[str, int] = {}
    if not value:
        return out
    for match in _TSV_ENTRY.finditer(value):
        lexeme = match.group(1).replace("''", "'")
        positions = match.group(2)
        out[lexeme] = positions.count(",") + 1 if positions else 1
    return out


_TSV_ENTRY = re.compile(r"'((?:[^']|'')*)'(?::([0-9A-D,]+))?")


def _or_query(cue: str) -> str:
    """A ``to_tsquery`` OR of the cue's words, each quoted as a plain lexeme (no operators from
    user input reach the query parser)."""
    words = [w for w in "".join(c if c.isalnum() else " " for c in cue.lower()).split() if len(w) > 1]
    if not words:
        return "''"
    return " | ".join(f"'{w}'" for w in dict.fromkeys(words))
