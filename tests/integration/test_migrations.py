"""Migrations go forward only, on an empty database and on one holding data written by the first
schema (decision record 0086): every row survives to the newest schema, derived state (the lexical
statistics) is built for the rows already there, today's code reads them, a second run changes
nothing, and a database of a newer schema is recognised as one this code cannot bring back."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import Row, select, text

from shared.storage.db.engine import Database, known_revision, migrate
from shared.storage.db.models import ENTRIES
from tests.support.servers import throwaway_database

pytestmark = pytest.mark.integration

MIGRATIONS = Path(__file__).resolve().parents[2] / "shared" / "storage" / "db" / "migrations"


#: A memory entry as the first schema's code wrote it (its columns, nothing added since).
FIRST_SCHEMA_ENTRY = text(
    """INSERT INTO memory_entries (id, org_id, agent_config_id, owner_key, owner_kind, owner_id,
    session_id, text, fingerprint, importance, reinforcement_count, memory_type, layer, source,
    confidence, reliability, lifecycle, pinned, redaction, quarantined, quarantine_reasons,
    provenance, created_at, updated_at, access_count, version, embedding_status, metadata)
    VALUES (:id, :org, :agent, :owner, 'end_user', :owner_id, 's-1', :text, :fp, 0.5, 0, 'fact',
    'observation', 'session', 0.9, 1.0, 'active', false, '{}', false, '[]', '{}', :now, :now,
    0, 1, 'pending', '{}')"""
)


def _revisions() -> list[str]:
    """Every revision, oldest first (one line: forward-only means no branches to merge)."""
    script = ScriptDirectory(str(MIGRATIONS))
    assert len(script.get_heads()) == 1, "one head: migrations form a single line"
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


@pytest.fixture
async def empty_url(tmp_path: Path) -> AsyncIterator[str]:
    async with throwaway_database(
        os.environ.get("ENGRAM_TEST_DATABASE_URL"), tmp_path, migrated=False
    ) as url:
        yield url


async def _fetch(url: str, sql: str, **values: object) -> list[Row]:  # type: ignore[type-arg]
    db = Database(url, pool_size=1)
    try:
        async with db.read() as s:
            return list((await s.execute(text(sql), values)).all())
    finally:
        await db.close()


async def test_an_empty_database_migrates_to_the_newest_schema_and_again_changes_nothing(
    empty_url: str,
) -> None:
    revisions = _revisions()
    await migrate(empty_url)
    assert [r[0] for r in await _fetch(empty_url, "SELECT version_num FROM alembic_version")] == [
        revisions[-1]
    ]
    tables = {
        r[0] for r in await _fetch(empty_url, "SELECT tablename FROM pg_tables WHERE schemaname='public'")
    }
    assert {"memory_entries", "erasures", "audit_log", "outbox", "lexical_scopes"} <= tables
    await migrate(empty_url)  # idempotent
    assert [r[0] for r in await _fetch(empty_url, "SELECT version_num FROM alembic_version")] == [
        revisions[-1]
    ]


async def test_data_written_by_the_first_schema_survives_every_migration(empty_url: str) -> None:
    revisions = _revisions()
    await migrate(empty_url, revisions[0])
    org, agent = uuid4(), uuid4()
    now = datetime.now(UTC)
    texts = {"end_user:alice": ["Alice prefers tea", "Alice lives in Lyon"], "end_user:bob": ["Bob uses vim"]}
    first = Database(empty_url, pool_size=1)
    try:
        async with first.transaction() as s:  # the first schema's columns, as its code wrote them
            for owner, owned in texts.items():
                for i, body in enumerate(owned):
                    values = {
                        "id": uuid4(),
                        "org": org,
                        "agent": agent,
                        "owner": owner,
                        "owner_id": owner.split(":")[1],
                        "text": body,
                        "fp": f"fp-{owner}-{i}",
                        "now": now,
                    }
                    await s.execute(FIRST_SCHEMA_ENTRY, values)
    finally:
        await first.close()

    for revision in revisions[1:]:  # one step at a time, as releases would apply them
        await migrate(empty_url, revision)
    await migrate(empty_url)

    db = Database(empty_url, pool_size=1)
    try:
        async with db.read() as s:  # today's table definition reads every row of the first schema
            rows = (await s.execute(select(ENTRIES).where(ENTRIES.c.org_id == org))).all()
    finally:
        await db.close()
    assert sorted(r.text for r in rows) == sorted(t for owned in texts.values() for t in owned)
    assert all(r.occurred_at is None and r.session_position is None for r in rows)  # unknown, not made up
    scopes = await _fetch(
        empty_url,
        "SELECT owner_key, docs FROM lexical_scopes WHERE org_id = :org ORDER BY owner_key",
        org=org,
    )
    assert [(r[0], r[1]) for r in scopes] == [("end_user:alice", 2), ("end_user:bob", 1)]


def test_a_newer_schema_is_not_one_this_code_can_reach() -> None:
    revisions = _revisions()
    assert all(known_revision(r) for r in revisions)
    assert known_revision(None)  # an empty database
    assert not known_revision("9999")  # written by a newer release: restore refuses it
