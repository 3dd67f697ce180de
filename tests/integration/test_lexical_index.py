"""hybrid's lexical leg as sparse vectors in the vector store (shared/text/lexical.py): its rankings
equal the Postgres Okapi BM25 leg's (``queries.lexical_scores``) up to ties, its tenant filter is
the dense leg's, and the per-owner term statistics Postgres keeps by trigger always equal a
recount of the entries — through inserts, supersedes, owner moves and erasures."""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from sqlalchemy import delete, insert, text, update

from services.embed.indexer import index_entries
from shared.adapters.embedders import HashingEmbedder
from shared.adapters.vectors.qdrant_edge import QdrantEdgeIndex
from shared.ports import TenantFilter
from shared.runtime.time import utcnow
from shared.storage.db.engine import Database
from shared.storage.db.models import ENTRIES
from shared.storage.entries import recall as queries
from shared.text.lexical import query_weights

pytestmark = pytest.mark.integration

OWNERS = ("", "end_user:alice", "end_user:bob")
_WORDS = [
    "deploy",
    "billing",
    "service",
    "staging",
    "production",
    "rollback",
    "database",
    "migration",
    "timeout",
    "retry",
    "queue",
    "worker",
    "backup",
    "disk",
    "full",
    "node",
    "alert",
    "pager",
    "refund",
    "credit",
    "card",
    "customer",
    "invoice",
    "approval",
    "friday",
    "cache",
    "redis",
    "latency",
    "spike",
    "memory",
    "leak",
    "restart",
    "kubernetes",
    "pod",
    "crash",
    "loop",
    "certificate",
    "expiry",
]
CUES = (
    "billing deploy failed on friday",
    "database migration timeout",
    "disk full on the backup node",
    "refund to the customer's card",
    "redis latency spikes after restart",
    "certificate expiry alert",
    "why does the worker crash loop",
    "rollback production",
    "queue retry",
    "pager alert for memory leak in kubernetes pods",
)


def _text(rng: random.Random) -> str:
    """Sentences of 3-30 corpus words, some repeated (term frequency > 1)."""
    words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 30))]
    return " ".join(words).capitalize() + "."


def _row(org: UUID, agent: UUID, owner: str, body: str, serial: int) -> dict[str, Any]:
    now = utcnow() - timedelta(seconds=serial)
    return {
        "id": uuid4(), "org_id": org, "agent_config_id": agent, "owner_key": owner, "text": body,
        "fingerprint": hashlib.sha256(f"{serial}:{body}".encode()).hexdigest(), "importance": 0.5,
        "memory_type": "fact", "layer": "memory", "source": "api", "lifecycle": "active",
        "redaction": [], "quarantine_reasons": [], "provenance": {}, "derived_from": [], "metadata": {},
        "created_at": now, "updated_at": now,
    }  # fmt: skip


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url, pool_size=2)
    yield database
    await database.close()


async def _seed(db: Database, org: UUID, agent: UUID, count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = [_row(org, agent, OWNERS[i % 3], _text(rng), i) for i in range(count)]
    async with db.transaction() as session:
        await session.execute(insert(ENTRIES), rows)
    return rows


async def _stats(db: Database, org: UUID) -> tuple[set[tuple[Any, ...]], set[tuple[Any, ...]]]:
    """(kept statistics, a recount from the entries) for one organization: scopes and terms."""
    async with db.read() as session:
        kept_scopes = await session.execute(
            text("SELECT agent_config_id, owner_key, docs, lexemes FROM lexical_scopes WHERE org_id = :o"),
            {"o": org},
        )
        kept_terms = await session.execute(
            text("SELECT agent_config_id, owner_key, lexeme, docs FROM lexical_terms WHERE org_id = :o"),
            {"o": org},
        )
        recount_scopes = await session.execute(
            text(
                "SELECT agent_config_id, owner_key, count(*), sum(length(search)) FROM memory_entries "
                "WHERE org_id = :o AND lifecycle = 'active' GROUP BY 1, 2"
            ),
            {"o": org},
        )
        recount_terms = await session.execute(
            text(
                "SELECT e.agent_config_id, e.owner_key, u.lexeme, count(*) FROM memory_entries e, "
                "unnest(e.search) u WHERE e.org_id = :o AND e.lifecycle = 'active' GROUP BY 1, 2, 3"
            ),
            {"o": org},
        )
        kept = {tuple(r) for r in kept_scopes} | {tuple(r) for r in kept_terms}
        recount = {tuple(r) for r in recount_scopes} | {tuple(r) for r in recount_terms}
    return kept, recount


async def test_rankings_equal_postgres_bm25(db: Database, tmp_path: Path) -> None:
    """For every cue and owner scope, the index's lexical hits are the Postgres BM25 leg's: the
    same entries with the same scores (so the same order up to ties). A second agent config with
    the same words (other statistics) and another organization never leak in."""
    org, agent = uuid4(), uuid4()
    rows = await _seed(db, org, agent, 240, seed=1)
    decoys = [*await _seed(db, org, uuid4(), 60, seed=2), *await _seed(db, uuid4(), agent, 60, seed=3)]
    index = QdrantEdgeIndex(tmp_path / "edge", 384)
    try:
        await index_entries(db, HashingEmbedder(), index, [r["id"] for r in [*rows, *decoys]])
        compared = 0
        for owner in OWNERS:
            scope = queries.Scope(org_id=org, agent_config_id=agent, owner_keys=(owner,), now=utcnow())
            tenant = TenantFilter(org, agent, (owner,))
            for cue in CUES:
                expected = await queries.lexical_scores(db, scope, cue, 1000)
                documents, containing = await queries.cue_statistics(db, scope, cue)
                hits = await index.search_lexical(query_weights(documents, containing), tenant, 1000)
                assert expected, cue
                assert {h.id for h in hits} == {i for i, _ in expected}, cue
                by_id = dict(expected)
                for hit in hits:
                    assert hit.score == pytest.approx(by_id[hit.id], rel=1e-4), cue
                ranked = [round(h.score, 3) for h in hits]
                assert ranked == sorted(ranked, reverse=True)
                compared += len(hits)
        assert compared > 500
    finally:
        await index.close()


async def test_entries_not_indexed_yet_score_as_the_postgres_leg(db: Database) -> None:
    """Read-your-writes: entries the embed service has not indexed (``pending``) have no lexical
    vector yet; hybrid scores them in Postgres with the index leg's IDF — the same scores as the
    Postgres BM25 leg. Once indexed they leave this leg (the vector store has them)."""
    org, agent = uuid4(), uuid4()
    rows = await _seed(db, org, agent, 120, seed=5)
    compared = 0
    for owner in OWNERS:
        scope = queries.Scope(org_id=org, agent_config_id=agent, owner_keys=(owner,), now=utcnow())
        for cue in CUES:
            expected = dict(await queries.lexical_scores(db, scope, cue, 1000))
            documents, containing = await queries.cue_statistics(db, scope, cue)
            fresh = await queries.unindexed_lexical_scores(db, scope, cue, documents, containing)
            assert set(fresh) == set(expected), cue
            for entry_id, score in fresh.items():
                assert score == pytest.approx(expected[entry_id], rel=1e-4), cue
            compared += len(fresh)
    assert compared > 200
    async with db.transaction() as session:
        await session.execute(
            update(ENTRIES)
            .where(ENTRIES.c.id.in_([r["id"] for r in rows]))
            .values(embedding_status="indexed")
        )
    scope = queries.Scope(org_id=org, agent_config_id=agent, owner_keys=OWNERS, now=utcnow())
    documents, containing = await queries.cue_statistics(db, scope, CUES[0])
    assert await queries.unindexed_lexical_scores(db, scope, CUES[0], documents, containing) == {}
    # Rows marked indexed by no embedder would read as another model's vectors to every recall of
    # this database (semantic_index_incomplete): they go.
    async with db.transaction() as session:
        await session.execute(delete(ENTRIES).where(ENTRIES.c.org_id == org))


async def test_statistics_follow_every_change(db: Database) -> None:
    """After inserts, a supersede, an owner move, a text edit, deletes and a bulk erase, the kept
    statistics equal a recount; an erased word leaves no row behind."""
    org, agent = uuid4(), uuid4()
    rows = await _seed(db, org, agent, 90, seed=4)
    kept, recount = await _stats(db, org)
    assert kept == recount
    assert kept
    async with db.transaction() as session:
        await session.execute(
            update(ENTRIES).where(ENTRIES.c.id == rows[0]["id"]).values(lifecycle="superseded")
        )
        await session.execute(
            update(ENTRIES).where(ENTRIES.c.id == rows[1]["id"]).values(owner_key="end_user:carol")
        )
        await session.execute(
            update(ENTRIES).where(ENTRIES.c.id == rows[2]["id"]).values(text="zanzibar quokka")
        )
        await session.execute(update(ENTRIES).where(ENTRIES.c.id == rows[3]["id"]).values(access_count=5))
        await session.execute(update(ENTRIES).where(ENTRIES.c.id == rows[0]["id"]).values(lifecycle="active"))
    kept, recount = await _stats(db, org)
    assert kept == recount
    assert any(row[2] == "quokka" for row in kept if len(row) == 4 and isinstance(row[2], str))
    async with db.transaction() as session:
        await session.execute(delete(ENTRIES).where(ENTRIES.c.id == rows[2]["id"]))
        await session.execute(delete(ENTRIES).where(ENTRIES.c.id.in_([r["id"] for r in rows[10:40]])))
    kept, recount = await _stats(db, org)
    assert kept == recount
    assert not any("quokka" in row for row in kept)
    async with db.transaction() as session:
        await session.execute(delete(ENTRIES).where(ENTRIES.c.org_id == org))
    assert await _stats(db, org) == (set(), set())
