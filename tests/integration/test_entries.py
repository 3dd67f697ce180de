"""The memory-entry table's gateway (``shared.storage.entries``) against real Postgres: the tenancy
predicate every reader starts from, and writes that commit with their ``memory.written`` events."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from uuid import UUID, uuid4

import pytest
from sqlalchemy import select

from shared.runtime.time import utcnow
from shared.storage.db.engine import Database
from shared.storage.db.models import ENTRIES, OUTBOX
from shared.storage.entries import EntryStore, NewEntry, in_scope
from shared.text.policy import fingerprint

pytestmark = pytest.mark.integration


def _row(org: UUID, agent: UUID, owner: str, text: str, **over: Any) -> dict[str, Any]:
    kind, _, ident = owner.partition(":")
    now = utcnow()
    return {
        "id": uuid4(),
        "org_id": org,
        "agent_config_id": agent,
        "owner_key": owner,
        "owner_kind": kind or None,
        "owner_id": ident or None,
        "session_id": "s1",
        "text": text,
        "fingerprint": fingerprint(text),
        "importance": 0.5,
        "reinforcement_count": 0,
        "memory_type": "fact",
        "layer": "memory",
        "source": "elective",
        "source_agent": None,
        "confidence": 1.0,
        "reliability": 1.0,
        "lifecycle": "active",
        "pinned": False,
        "category": None,
        "confirmation": None,
        "sensitivity": None,
        "consent": None,
        "redaction": [],
        "quarantined": False,
        "quarantine_reasons": [],
        "provenance": {},
        "expires_at": None,
        "created_at": now,
        "updated_at": now,
        "last_accessed_at": None,
        "access_count": 0,
        "version": 1,
        "supersedes": None,
        "superseded_by": None,
        "derived_from": [],
        "embedding_status": "pending",
        "embedding_model": None,
        "embedding_dimension": None,
        "metadata": {},
        **over,
    }


async def _announced(db: Database, org: UUID) -> list[dict[str, Any]]:
    """The organization's ``memory.written`` events still in the outbox, in commit order."""
    async with db.read() as s:
        payloads = (
            await s.execute(
                select(OUTBOX.c.payload)
                .where(OUTBOX.c.subject == "engram.memory.written")
                .order_by(OUTBOX.c.id)
            )
        ).scalars()
        events = [json.loads(p) for p in payloads]
    return [e for e in events if e["org_id"] == str(org)]


async def _ids(db: Database, *where: Any) -> set[UUID]:
    async with db.read() as s:
        return set((await s.execute(select(ENTRIES.c.id).where(*where))).scalars())


async def test_upsert_folds_a_batch_and_announces_every_occurrence(
    db: Database, org: UUID, agent: UUID
) -> None:
    """One row per owner and text: the first occurrence is saved, the others reinforce it (the
    highest importance kept, counted), another owner's same text is its own row; each occurrence
    is one ``memory.written`` with its outcome, committed with the rows."""
    batch = [
        NewEntry(_row(org, agent, "end_user:alice", "Ships on Tuesday.", importance=0.4)),
        NewEntry(_row(org, agent, "end_user:alice", "Ships on Tuesday.", importance=0.9)),
        NewEntry(_row(org, agent, "end_user:bob", "Ships on Tuesday.")),
    ]
    async with db.transaction() as s:
        first = await EntryStore(s).upsert(batch)
    assert [u.saved for u in first] == [True, False, True]
    assert first[0].entry_id == first[1].entry_id != first[2].entry_id
    async with db.read() as s:
        alice = (await s.execute(select(ENTRIES).where(ENTRIES.c.id == first[0].entry_id))).one()
    assert (alice.importance, alice.reinforcement_count) == (0.9, 1)

    async with db.transaction() as s:
        (again,) = await EntryStore(s).upsert(
            [NewEntry(_row(org, agent, "end_user:alice", "Ships on Tuesday."))]
        )
    assert again.entry_id == first[0].entry_id
    assert not again.saved
    events = await _announced(db, org)
    assert [(e["entry_id"], e["outcome"]) for e in events] == [
        (str(first[0].entry_id), "saved"),
        (str(first[0].entry_id), "reinforced"),
        (str(first[2].entry_id), "saved"),
        (str(first[0].entry_id), "reinforced"),
    ]
    assert events[0]["owner"] == {"kind": "end_user", "id": "alice"}
    assert events[1]["importance"] == 0.9
    assert all("text" not in e for e in events)


async def test_a_write_and_its_event_commit_together(db: Database, org: UUID, agent: UUID) -> None:
    """A transaction that rolls back leaves neither the entry nor its event."""

    class Abort(Exception):
        pass

    async def write_then_fail() -> None:
        async with db.transaction() as s:
            await EntryStore(s).upsert([NewEntry(_row(org, agent, "", "Never stored."))])
            raise Abort

    with pytest.raises(Abort):
        await write_then_fail()
    assert await _ids(db, ENTRIES.c.org_id == org) == set()
    assert await _announced(db, org) == []


async def test_insert_and_update_announce_what_changed(db: Database, org: UUID, agent: UUID) -> None:
    """An inserted entry is announced; an update that changes what it says is announced as the
    entry now is; one that does not (a pin) is not."""
    row = _row(org, agent, "actor:carol", "Old words.")
    async with db.transaction() as s:
        entries = EntryStore(s)
        await entries.insert(row)
        await entries.update(row["id"], pinned=True)
        await entries.update(row["id"], announce=True, text="New words.", version=2, quarantined=True)
    events = await _announced(db, org)
    assert [(e["entry_id"], e["version"], e["quarantined"]) for e in events] == [
        (str(row["id"]), 1, False),
        (str(row["id"]), 2, True),
    ]
    async with db.read() as s:
        got = await EntryStore(s).get(org, agent, row["id"])
        assert (got.text, got.pinned) == ("New words.", True)
        assert await EntryStore(s).get(org, uuid4(), row["id"]) is None
        assert await EntryStore(s).holding((org, agent, "actor:carol", fingerprint("New words."))) == []
        assert await EntryStore(s).holding((org, agent, "actor:carol", fingerprint("Old words."))) == [
            row["id"]
        ]


@pytest.mark.parametrize(
    ("agent_config", "keys", "session", "expected"),
    [
        ("a1", ["end_user:alice"], None, {"alice-a1-s1", "alice-a1-s2"}),
        ("a1", ["end_user:alice"], "s2", {"alice-a1-s2"}),
        ("a1", ["actor:carol", ""], None, {"carol-a1", "pool-a1"}),
        (None, ["end_user:alice"], None, {"alice-a1-s1", "alice-a1-s2", "alice-a2"}),
        ("a1", [], None, set()),
        ("a1", ["end_user:al"], None, set()),
    ],
)
async def test_the_tenancy_predicate(
    db: Database,
    org: UUID,
    agent_config: str | None,
    keys: Sequence[str],
    session: str | None,
    expected: set[str],
) -> None:
    """Only the organization, the agent config (or all of its own), the owner keys (exactly) and
    the session; no owner keys sees nothing. Another organization's identical rows never show."""
    configs = {"a1": uuid4(), "a2": uuid4()}
    other_org = uuid4()
    named: dict[UUID, str] = {}
    rows = []
    for name, org_id, cfg, owner, sess in (
        ("alice-a1-s1", org, "a1", "end_user:alice", "s1"),
        ("alice-a1-s2", org, "a1", "end_user:alice", "s2"),
        ("alice-a2", org, "a2", "end_user:alice", "s1"),
        ("carol-a1", org, "a1", "actor:carol", "s1"),
        ("pool-a1", org, "a1", "", "s1"),
        ("other-org", other_org, "a1", "end_user:alice", "s1"),
    ):
        row = _row(org_id, configs[cfg], owner, f"Entry {name}.", session_id=sess)
        named[row["id"]] = name
        rows.append(NewEntry(row))
    async with db.transaction() as s:
        await EntryStore(s).upsert(rows)
    agent_config_id = configs[agent_config] if agent_config else None
    found = await _ids(db, in_scope(org, agent_config_id, keys, session_id=session))
    assert {named[i] for i in found} == expected
