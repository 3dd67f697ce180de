"""Recall's reads of entries: every read is scoped by organization, agent config and the owner
keys the caller may see — the predicate is built in one place, so no strategy can forget a part
of it. The hot ones are compiled once per shape (``shared.storage.db.compiled``) and come back as
:class:`Candidate` rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from cachetools import TTLCache
from sqlalchemy import (
    ColumnElement,
    CompoundSelect,
    Float,
    Select,
    Text,
    and_,
    any_,
    bindparam,
    func,
    or_,
    select,
    text,
    true,
    union,
)

from contracts.recall import RecallFilters
from shared.ports import TenantFilter
from shared.storage.db.compiled import Binds, Template, one_of
from shared.storage.db.engine import Database
from shared.storage.db.models import ENTRIES, LEXICAL_SCOPES, LEXICAL_TERMS
from shared.storage.entries.store import in_scope
from shared.text.lexical import BM25_B as _BM25_B
from shared.text.lexical import BM25_K1 as _BM25_K1
from shared.text.lexical import idf

__all__ = [
    "Candidate",
    "Scope",
    "adjacent",
    "by_ids",
    "cue_statistics",
    "lexical_ids",
    "lexical_scores",
    "newest",
    "pack_candidates",
    "ranking_inputs",
    "top_importance",
]


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
    ENTRIES.c.occurred_at,
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
    #: Also reach knowledge that a newer entry superseded (``valid_until`` set): a cue that asks
    #: about the past (docs/adr/0103-knowledge-updates.md). Otherwise only what is current.
    history: bool = False

    def tenant(self) -> TenantFilter:
        """The vector store's filter for this scope: one for both of hybrid's legs."""
        return TenantFilter(
            org_id=self.org_id,
            agent_config_id=self.agent_config_id,
            owner_keys=self.owner_keys,
            layer=self.layer,
            session_id=self.session_only,
            memory_types=self.memory_types,
        )

    def values(self) -> dict[str, Any]:
        """Every value :meth:`predicate` binds, by name; which names are present is the
        predicate's shape (the compiled statements' cache key, ``shared.storage.db.compiled``)."""
        if not self.owner_keys:
            raise ValueError("a scope without owner keys sees nothing; do not query")
        keys = list(dict.fromkeys(self.owner_keys))
        v: dict[str, Any] = {"org_id": self.org_id, "agent_config_id": self.agent_config_id, "now": self.now}
        # One owner key is an equality (an index range); several are a list.
        v.update({"owner_key": keys[0]} if len(keys) == 1 else {"owner_keys": keys})
        optional: dict[str, Any] = {"session_only": self.session_only, "layer": self.layer}
        # Its presence is the predicate's shape (no column compares with it).
        optional["history"] = True if self.history else None
        optional["memory_types"] = None if self.memory_types is None else list(self.memory_types)
        f = self.filters
        if f is not None:
            optional |= {
                "f_memory_types": f.memory_types,
                "f_min_importance": f.min_importance,
                "f_min_confidence": f.min_confidence,
                "f_source": None if f.source is None else list(f.source),
                "f_source_agent": f.source_agent,
                "f_session_id": f.session_id,
                "f_created_after": f.created_after,
                "f_created_before": f.created_before,
            }
        v.update((name, value) for name, value in optional.items() if value is not None)
        return v

    def predicate(self) -> ColumnElement[bool]:
        """The scope as a WHERE clause over its values (templates use :func:`scope_predicate`
        over binds of the same names)."""
        return scope_predicate(self.values())


def scope_predicate(v: Mapping[str, Any] | Binds) -> ColumnElement[bool]:
    """:meth:`Scope.predicate` over ``v``: :meth:`Scope.values`, or binds of the same names."""
    owners = [v["owner_key"]] if "owner_key" in v else v["owner_keys"]
    parts: list[ColumnElement[bool]] = [
        in_scope(v["org_id"], v["agent_config_id"], owners, session_id=v.get("session_only")),
        _current(history="history" in v),
        or_(ENTRIES.c.expires_at.is_(None), ENTRIES.c.expires_at > v["now"]),
    ]
    if "layer" in v:
        parts.append(ENTRIES.c.layer == v["layer"])
    for name, column in (("memory_types", ENTRIES.c.memory_type), ("f_memory_types", ENTRIES.c.memory_type)):
        if name in v:
            parts.append(one_of(column, v[name]))
    if "f_source" in v:
        parts.append(one_of(ENTRIES.c.source, v["f_source"]))
    if "f_min_importance" in v:
        parts.append(ENTRIES.c.importance >= v["f_min_importance"])
    if "f_min_confidence" in v:
        parts.append(ENTRIES.c.confidence >= v["f_min_confidence"])
    if "f_source_agent" in v:
        parts.append(ENTRIES.c.source_agent == v["f_source_agent"])
    if "f_session_id" in v:
        parts.append(ENTRIES.c.session_id == v["f_session_id"])
    if "f_created_after" in v:
        parts.append(ENTRIES.c.created_at >= v["f_created_after"])
    if "f_created_before" in v:
        parts.append(ENTRIES.c.created_at < v["f_created_before"])
    return and_(*parts)


def _current(*, history: bool) -> ColumnElement[bool]:
    """Active entries; with ``history`` also those a knowledge update superseded (an ``edit``'s old
    versions and a merge's sources have no ``valid_until``: they stay out)."""
    active = ENTRIES.c.lifecycle == "active"
    if not history:
        return active
    return or_(active, and_(ENTRIES.c.lifecycle == "superseded", ENTRIES.c.valid_until.is_not(None)))


def _candidates(rows: Sequence[Mapping[str, Any]]) -> list[Candidate]:
    return [
        Candidate(
            id=r["id"],
            text=r["text"],
            importance=r["importance"],
            created_at=r["created_at"],
            updated_at=r["updated_at"],
            memory_type=r["memory_type"],
            layer=r["layer"],
            session_id=r["session_id"],
            metadata=r["metadata"],
            pinned=r["pinned"],
            quarantined=r["quarantined"],
            source=r["source"],
            reinforcement_count=r["reinforcement_count"],
            confidence=r["confidence"],
            reliability=r["reliability"],
            owner_key=r["owner_key"],
            expires_at=r["expires_at"],
            occurred_at=r["occurred_at"],
        )
        for r in rows
    ]


_NEWEST = Template(
    lambda b: (
        select(*_COLUMNS)
        .where(scope_predicate(b))
        .order_by(ENTRIES.c.pinned.desc(), ENTRIES.c.created_at.desc(), ENTRIES.c.id)
        .limit(b["limit"])
    )
)


async def newest(db: Database, scope: Scope, limit: int) -> list[Candidate]:
    """Pinned first, then newest (``last_k``, ``full``)."""
    return _candidates(await _run(db, _NEWEST, scope, limit=limit))


_TOP_IMPORTANCE = Template(
    lambda b: (
        select(*_COLUMNS)
        .where(scope_predicate(b))
        .order_by(
            ENTRIES.c.pinned.desc(), ENTRIES.c.importance.desc(), ENTRIES.c.created_at.desc(), ENTRIES.c.id
        )
        .limit(b["limit"])
    )
)


async def top_importance(db: Database, scope: Scope, limit: int) -> list[Candidate]:
    """Pinned first, then highest importance, then newest (``importance``)."""
    return _candidates(await _run(db, _TOP_IMPORTANCE, scope, limit=limit))


def _pack_statement(b: Binds) -> Select[Any]:
    ids_newest = (
        select(ENTRIES.c.id).where(scope_predicate(b)).order_by(ENTRIES.c.created_at.desc()).limit(b["each"])
    )
    ids_important = (
        select(ENTRIES.c.id)
        .where(scope_predicate(b))
        .order_by(ENTRIES.c.importance.desc(), ENTRIES.c.created_at.desc())
        .limit(b["each"])
    )
    ids = union(ids_newest, ids_important).subquery()
    return select(*_COLUMNS).where(ENTRIES.c.id.in_(select(ids.c.id)))


_PACK = Template(_pack_statement)


async def pack_candidates(db: Database, scope: Scope, each: int = 250) -> list[Candidate]:
    """SPEC 5.2: the ``each`` newest and the ``each`` highest-importance visible entries (union)."""
    return _candidates(await _run(db, _PACK, scope, each=each))


_RANKING_COLUMNS = (
    ENTRIES.c.id,
    ENTRIES.c.importance,
    ENTRIES.c.created_at,
    ENTRIES.c.pinned,
    ENTRIES.c.occurred_at,
)


_RANKING_INPUTS = Template(
    lambda b: select(*_RANKING_COLUMNS).where(scope_predicate(b), one_of(ENTRIES.c.id, b["ids"]))
)


async def ranking_inputs(db: Database, scope: Scope, ids: Sequence[UUID]) -> list[Candidate]:
    """The given entries that the scope allows, with only what fusion reads (id, importance,
    created_at, pinned, occurred_at): hybrid re-checks a few hundred hits, and reading their text and
    metadata cost more than the rest of the call. Text and the other fields are empty — rank
    with these, then read the winners with :func:`by_ids`; never return them."""
    if not ids:
        return []
    return [_partial(r) for r in await _run(db, _RANKING_INPUTS, scope, ids=list(ids))]


def _partial(r: Sequence[Any]) -> Candidate:
    """A candidate with only what fusion reads (see :func:`ranking_inputs`), from a row of
    ``_RANKING_COLUMNS``. By position, not by name: hybrid makes a few hundred per recall, and a
    Record's name lookups cost more than the tuple."""
    entry_id, importance, created_at, pinned, occurred_at = r
    return Candidate(
        entry_id, "", importance, created_at, created_at, "", "", None, {}, pinned, False, "", 0, 0.0,
        0.0, "", None, occurred_at,
    )  # fmt: skip


def _adjacent_statement(b: Binds) -> CompoundSelect[Any]:
    hit = ENTRIES.alias("hit")
    sides = []
    for before in (True, False):
        order = ENTRIES.c.session_position.desc() if before else ENTRIES.c.session_position.asc()
        nearest = (
            select(*_COLUMNS, func.row_number().over(order_by=order).label("distance"))
            .where(
                scope_predicate(b),
                ENTRIES.c.owner_key == hit.c.owner_key,
                ENTRIES.c.session_id == hit.c.session_id,
                ENTRIES.c.session_position < hit.c.session_position
                if before
                else ENTRIES.c.session_position > hit.c.session_position,
            )
            .order_by(order)
            .limit(b["reach"])
            .lateral()
        )
        sides.append(
            select(hit.c.id.label("hit"), *nearest.c)
            .select_from(hit.join(nearest, true()))
            .where(
                hit.c.id == any_(b["ids"]),
                hit.c.org_id == b["org_id"],
                hit.c.agent_config_id == b["agent_config_id"],
                hit.c.session_position.is_not(None),
            )
        )
    return sides[0].union_all(sides[1])


_ADJACENT = Template(_adjacent_statement)


async def adjacent(
    db: Database, scope: Scope, ids: Sequence[UUID], reach: int
) -> dict[UUID, list[tuple[int, Candidate]]]:
    """For each given entry that has a place in a session, the ``reach`` entries just before and
    just after it in that session that the scope allows, with their distance (1 = next to it).

    A session is an owner's: the same ``session_id`` under another owner key is another session,
    even where the caller may see both. Each neighbour passes the whole scope predicate, so a
    neighbour is never an entry the caller could not have recalled; where the entry next in line
    is not visible (another layer, filtered out, expired), the nearest visible one stands in.
    Neighbours are read whole, as :func:`by_ids` reads entries: a neighbour that wins its place
    needs no second read.
    """
    if not ids or reach < 1:
        return {}
    rows = await _run(db, _ADJACENT, scope, ids=list(ids), reach=reach)
    out: dict[UUID, list[tuple[int, Candidate]]] = {}
    for row, candidate in zip(rows, _candidates(rows), strict=True):
        out.setdefault(row["hit"], []).append((int(row["distance"]), candidate))
    return out


_BY_IDS = Template(lambda b: select(*_COLUMNS).where(scope_predicate(b), one_of(ENTRIES.c.id, b["ids"])))


async def by_ids(db: Database, scope: Scope, ids: Sequence[UUID]) -> list[Candidate]:
    """The given entries that the scope allows (ids from a vector index are re-checked here)."""
    if not ids:
        return []
    return _candidates(await _run(db, _BY_IDS, scope, ids=list(ids)))


async def _run(db: Database, template: Template, scope: Scope, **extra: Any) -> list[Any]:
    """``template`` over the scope's values and the query's own (``extra``)."""
    values = scope.values() | extra
    return await db.fetch(template.compiled(values), values)


#: At most this many matching entries are scored per query; beyond it the best by Postgres's
#: own rank are taken (document frequencies then count within them: an approximation that only
#: applies to cues whose words occur in thousands of entries).
_BM25_MAX_DOCS = 2000
#: A scope's entry count and average lexeme count, trusted for 30 s: both change slowly.
_corpus_stats: TTLCache[tuple[Any, ...], tuple[int, float]] = TTLCache(maxsize=10_000, ttl=30.0)


def _cue_statistics_statement(b: Binds) -> Select[Any]:
    cue_terms = select(
        func.unnest(func.tsvector_to_array(func.to_tsvector("english", b["words"]))).label("lexeme")
    ).subquery("cue")
    # One primary-key range per lexeme (a correlated subquery): a join let the planner scan the
    # whole table when its statistics were stale (77 ms at 100k entries in the bench).
    containing = (
        select(func.coalesce(func.sum(LEXICAL_TERMS.c.docs), 0))
        .where(
            LEXICAL_TERMS.c.org_id == b["org_id"],
            LEXICAL_TERMS.c.agent_config_id == b["agent_config_id"],
            LEXICAL_TERMS.c.lexeme == cue_terms.c.lexeme,
            LEXICAL_TERMS.c.owner_key == any_(b["owner_keys"]),
        )
        .scalar_subquery()
    )
    documents = (
        select(func.coalesce(func.sum(LEXICAL_SCOPES.c.docs), 0))
        .where(
            LEXICAL_SCOPES.c.org_id == b["org_id"],
            LEXICAL_SCOPES.c.agent_config_id == b["agent_config_id"],
            LEXICAL_SCOPES.c.owner_key == any_(b["owner_keys"]),
        )
        .scalar_subquery()
    )
    return select(cue_terms.c.lexeme, containing, documents).select_from(cue_terms)


_CUE_STATISTICS = Template(_cue_statistics_statement)


async def cue_statistics(db: Database, scope: Scope, cue: str) -> tuple[int, dict[str, int]]:
    """For hybrid's lexical leg in the vector store (shared/text/lexical.py): how many active entries
    the scope's owners hold, and for each of the cue's lexemes how many of them contain it — from
    the per-owner statistics, one index lookup per lexeme whatever the corpus size."""
    words = _words(cue)
    if not words:  # nothing to look up ("x", "C++", "?"), as in the Postgres leg
        return 0, {}
    # The cue's words, not the cue: what Postgres cannot store (NUL) never reaches it, and the
    # terms are those the Postgres leg scores.
    values = {
        "org_id": scope.org_id,
        "agent_config_id": scope.agent_config_id,
        "owner_keys": list(dict.fromkeys(scope.owner_keys)),
        "words": " ".join(words),
    }
    rows = await db.fetch(_CUE_STATISTICS.compiled(values), values)
    if not rows:
        return 0, {}
    return int(rows[0][2]), {row[0]: int(row[1]) for row in rows}


def _unindexed_statement(b: Binds) -> Select[Any]:
    query = func.to_tsquery("english", b["tsquery"])
    waiting = (
        select(ENTRIES.c.id, ENTRIES.c.search)
        .where(
            ENTRIES.c.embedding_status.in_(("pending", "failed")),
            scope_predicate(b),
            ENTRIES.c.search.op("@@")(query),
        )
        .limit(_BM25_MAX_DOCS)
        .cte("waiting")
    )
    lexemes = func.unnest(waiting.c.search).table_valued("lexeme", "positions", "weights").alias("u")
    cue_terms = func.tsvector_to_array(func.to_tsvector("english", b["words"]))
    return (
        select(
            waiting.c.id,
            lexemes.c.lexeme,
            func.coalesce(func.cardinality(lexemes.c.positions), 1),
            func.greatest(func.length(waiting.c.search), 1),
        )
        .select_from(waiting.join(lexemes, true()))
        .where(lexemes.c.lexeme == any_(cue_terms))
    )


_UNINDEXED = Template(_unindexed_statement)


async def unindexed_lexical_scores(
    db: Database, scope: Scope, cue: str, documents: int, containing: dict[str, int]
) -> dict[UUID, float]:
    """BM25 scores, with the index leg's IDF, of the scope's entries that match the cue but whose
    lexical vector is not in the vector store yet (``embedding_status`` pending or failed: just
    saved, or edited and waiting to be re-indexed). Without this leg a memory saved a moment ago
    would be missing from hybrid until the embed service caught up, where the Postgres leg found
    it at once. Cheap: the ``(embedding_status, created_at)`` index narrows it to the backlog."""
    words = _words(cue)
    if not words or not any(containing.values()):
        return {}
    tsquery = " | ".join(f"'{w}'" for w in words)
    rows = await _run(db, _UNINDEXED, scope, tsquery=tsquery, words=" ".join(words))
    if not rows:
        return {}
    _, avg_len = await _corpus(db, scope)
    scores: dict[UUID, float] = {}
    for entry_id, lexeme, tf, length in rows:
        count = containing.get(lexeme, 0)
        if count <= 0:
            continue
        norm = _BM25_K1 * (1 - _BM25_B + _BM25_B * length / max(avg_len, 1.0))
        weight = idf(max(documents, count), count) * tf * (_BM25_K1 + 1) / (tf + norm)
        scores[entry_id] = scores.get(entry_id, 0.0) + weight
    return scores


async def lexical_ids(db: Database, scope: Scope, cue: str, limit: int) -> list[UUID]:
    return [entry_id for entry_id, _ in await lexical_scores(db, scope, cue, limit)]


async def lexical_scores(db: Database, scope: Scope, cue: str, limit: int) -> list[tuple[UUID, float]]:
    """Okapi BM25 over Postgres full-text lexemes (English stemming, stop words removed): ids
    whose text shares a cue term, best first. hybrid's lexical leg was this until it moved into
    the vector store (shared/text/lexical.py); it stays as the reference the index's rankings are
    tested against, and for benchmarks.

    Postgres finds the entries that contain any cue lexeme (GIN index), unnests their lexemes and
    scores them in the same statement: only ``(id, score)`` pairs come back. Every entry of the
    scope that contains a cue term is among those matches, so document frequencies counted over
    them are exact (up to ``_BM25_MAX_DOCS`` matches). IDF down-weights words that occur
    everywhere (a speaker's name, say), which plain ``ts_rank`` cannot. Document length is the
    number of distinct lexemes (``length(tsvector)``); a term's frequency is its position count.
    """
    words = _words(cue)
    if not words:  # no word to look up ("x", "C++", "?"): the lexical leg finds nothing
        return []
    query = func.to_tsquery("english", " | ".join(f"'{w}'" for w in words))
    total, avg_len = await _corpus(db, scope)
    matches = (
        select(ENTRIES.c.id, ENTRIES.c.search)
        .where(scope.predicate(), ENTRIES.c.search.op("@@")(query))
        .order_by(func.ts_rank_cd(ENTRIES.c.search, query, text("1|32")).desc(), ENTRIES.c.id)
        .limit(_BM25_MAX_DOCS)
        .cte("matches")
    )
    lexemes = func.unnest(matches.c.search).table_valued("lexeme", "positions", "weights").alias("u")
    # The cue's words, not the cue: what Postgres cannot store (NUL) never reaches it.
    cue_terms = func.tsvector_to_array(func.to_tsvector("english", " ".join(words)))
    terms = (
        select(
            matches.c.id,
            lexemes.c.lexeme,
            func.coalesce(func.cardinality(lexemes.c.positions), 1).label("tf"),
            func.greatest(func.length(matches.c.search), 1).label("len"),
        )
        .select_from(matches.join(lexemes, true()))
        .where(lexemes.c.lexeme == any_(cue_terms))
        .cte("terms")
    )
    df = select(terms.c.lexeme, func.count().label("n")).group_by(terms.c.lexeme).cte("df")
    matched = select(func.count()).select_from(matches).scalar_subquery()
    n_docs = func.greatest(bindparam("total", float(total), Float), matched)
    idf = func.ln(1 + (n_docs - df.c.n + 0.5) / (df.c.n + 0.5))
    avg = bindparam("avg_len", max(avg_len, 1.0), Float)
    norm = _BM25_K1 * (1 - _BM25_B + _BM25_B * terms.c.len / avg)
    score = func.sum(idf * terms.c.tf * (_BM25_K1 + 1) / (terms.c.tf + norm))
    stmt = (
        select(terms.c.id, score.label("score"))
        .select_from(terms.join(df, df.c.lexeme == terms.c.lexeme))
        .group_by(terms.c.id)
        .order_by(score.desc(), func.cast(terms.c.id, Text))
        .limit(limit)
    )
    async with db.read() as session:
        return [(row[0], float(row[1])) for row in (await session.execute(stmt)).all()]


async def _corpus(db: Database, scope: Scope) -> tuple[int, float]:
    """Entries in scope and their average lexeme count, cached briefly (BM25 needs both; both
    change slowly)."""
    key = (scope.org_id, scope.agent_config_id, scope.owner_keys, scope.layer, scope.session_only)
    hit = _corpus_stats.get(key)
    if hit is not None:
        return hit
    async with db.read() as session:
        row = (
            await session.execute(
                select(func.count(), func.avg(func.length(ENTRIES.c.search))).where(scope.predicate())
            )
        ).one()
    total, avg_len = int(row[0]), float(row[1] or 1.0)
    _corpus_stats[key] = (total, avg_len)
    return total, avg_len


def _words(cue: str) -> list[str]:
    """The cue's distinct words of two or more letters or digits, lower-cased: each becomes a
    quoted plain lexeme of a ``to_tsquery`` OR, so no operator from user input reaches the query
    parser. Empty for a cue like "x", "C++" or "?" (``to_tsquery`` rejects the empty query ``''``)."""
    words = "".join(c if c.isalnum() else " " for c in cue.lower()).split()
    return list(dict.fromkeys(w for w in words if len(w) > 1))
