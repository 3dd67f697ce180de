"""Recall's reads as compiled statements (``shared.storage.db.compiled``, ``Database.fetch``): a template
run with one call's values finds exactly what the same query built with those values finds, over
random scopes of every shape — so the tenancy predicate means the same in both forms — and the
hot pool survives Postgres cutting its connections."""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
from sqlalchemy import func, insert, select, text

from contracts.recall import RecallFilters
from shared.messaging.wire import dependency_down
from shared.runtime.time import utcnow
from shared.storage.db.compiled import Compiled, Template
from shared.storage.db.engine import Database
from shared.storage.db.models import ENTRIES
from shared.storage.entries import recall as queries

pytestmark = pytest.mark.integration

OWNERS = ("", "end_user:alice", "end_user:bob", "agent:helper")
TYPES = ("fact", "preference", "procedure")
SOURCES = ("distill", "elective", "append")
SESSIONS = ("s1", "s2", None)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url, pool_size=2, hot_pool_size=2)
    yield database
    await database.close()


def _row(rng: random.Random, org: UUID, agent: UUID, serial: int) -> dict[str, Any]:
    now = utcnow()
    created = now - timedelta(minutes=rng.randint(0, 10_000))
    body = f"entry {serial} {rng.random()}"
    return {
        "id": uuid4(), "org_id": org, "agent_config_id": agent, "owner_key": rng.choice(OWNERS),
        "text": body, "fingerprint": hashlib.sha256(body.encode()).hexdigest(),
        "importance": rng.choice((0.1, 0.5, 0.5, 0.9)), "confidence": rng.choice((0.2, 0.8)),
        "memory_type": rng.choice(TYPES), "layer": rng.choice(("memory", "memory", "episodic")),
        "source": rng.choice(SOURCES), "source_agent": rng.choice(("a", "b")),
        "session_id": rng.choice(SESSIONS), "pinned": rng.random() < 0.1,
        "lifecycle": "active" if rng.random() < 0.9 else "deleted",
        "expires_at": None if rng.random() < 0.8 else now + timedelta(days=rng.choice((-1, 1))),
        "redaction": [], "quarantine_reasons": [], "provenance": {}, "derived_from": [],
        "metadata": {"n": serial}, "created_at": created, "updated_at": created,
    }  # fmt: skip


def _scope(rng: random.Random, org: UUID, agent: UUID) -> queries.Scope:
    """A scope of a random shape: one or several owners, and any of the optional parts."""
    now = utcnow()
    filters = None
    if rng.random() < 0.6:
        filters = RecallFilters(
            memory_types=rng.choice((None, list(rng.sample(TYPES, 2)))),
            min_importance=rng.choice((None, 0.5)),
            min_confidence=rng.choice((None, 0.5)),
            source=rng.choice((None, list(rng.sample(SOURCES, 2)))),
            source_agent=rng.choice((None, "a")),
            session_id=rng.choice((None, "s1")),
            created_after=rng.choice((None, now - timedelta(days=4))),
            created_before=rng.choice((None, now - timedelta(days=1))),
        )
    return queries.Scope(
        org_id=org,
        agent_config_id=agent,
        owner_keys=tuple(rng.sample(OWNERS, rng.randint(1, 3))),
        now=now,
        session_only=rng.choice((None, None, "s2")),
        layer=rng.choice((None, "memory")),
        memory_types=rng.choice((None, ("fact", "procedure"))),
        filters=filters,
    )


async def test_templates_find_what_the_built_query_finds(db: Database) -> None:
    rng = random.Random(7)
    org, agent = uuid4(), uuid4()
    rows = [_row(rng, org, agent, i) for i in range(240)]
    # Decoys: the same owners in another agent config and in another organization.
    decoys = [_row(rng, org, uuid4(), 1000 + i) for i in range(40)]
    decoys += [_row(rng, uuid4(), agent, 2000 + i) for i in range(40)]
    async with db.transaction() as session:
        await session.execute(insert(ENTRIES), rows + decoys)
    every_id = [r["id"] for r in rows + decoys]
    shapes: set[frozenset[str]] = set()
    compared = 0
    for _ in range(80):
        scope = _scope(rng, org, agent)
        shapes.add(frozenset(scope.values()))
        order = (ENTRIES.c.pinned.desc(), ENTRIES.c.created_at.desc(), ENTRIES.c.id)
        limit = rng.randint(1, 50)
        async with db.read() as session:  # the same query, built with this call's values
            built_newest = list(
                (
                    await session.execute(
                        select(ENTRIES.c.id).where(scope.predicate()).order_by(*order).limit(limit)
                    )
                ).scalars()
            )
            ids = rng.sample(every_id, 60)
            built_by_ids = set(
                (
                    await session.execute(
                        select(ENTRIES.c.id).where(scope.predicate(), ENTRIES.c.id.in_(ids))
                    )
                ).scalars()
            )
        assert [c.id for c in await queries.newest(db, scope, limit)] == built_newest
        found = await queries.by_ids(db, scope, ids)
        assert {c.id for c in found} == built_by_ids
        assert all(c.metadata == {"n": int(c.text.split()[1])} for c in found)  # JSON read as values
        assert not {c.id for c in found} & {d["id"] for d in decoys}
        compared += len(built_newest) + len(built_by_ids)
    assert compared > 300
    assert len(shapes) > 20  # many predicate shapes, each compiled once


def test_a_template_compiles_once_per_shape_and_binds_only_named_values() -> None:
    template = Template(
        lambda b: select(ENTRIES.c.id).where(ENTRIES.c.org_id == b["org_id"]).limit(b["limit"])
    )
    first = template.compiled({"org_id": uuid4(), "limit": 1})
    assert template.compiled({"org_id": uuid4(), "limit": 99}) is first  # values never baked in
    assert first.args({"org_id": "o", "limit": 5}) == ["o", 5]
    with pytest.raises(KeyError):  # a builder asking for a value the call does not bring
        Template(lambda b: select(ENTRIES.c.id).where(ENTRIES.c.org_id == b["org"])).compiled({"org_id": 1})
    constant = Template(lambda b: select(ENTRIES.c.id).where(ENTRIES.c.lifecycle.in_(("active", "deleted"))))
    sql = constant.compiled({}).sql
    # a constant IN list is plain binds for asyncpg
    assert "POSTCOMPILE" not in sql
    assert "$2" in sql


async def test_the_hot_pool_replaces_connections_postgres_cut(db: Database) -> None:
    backend = Compiled.of(select(func.pg_backend_pid()), frozenset())
    (first,) = await db.fetch(backend, {})
    async with db.read() as session:
        await session.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first[0]})
    outcome: BaseException | None = None
    try:
        await db.fetch(backend, {})
    except Exception as exc:  # the cut connection, if the pool had not noticed yet
        outcome = exc
    assert outcome is None or dependency_down(outcome), outcome  # answered as an outage (503)
    (again,) = await db.fetch(backend, {})
    assert again[0] != first[0]
