"""Knowledge updates (SPEC 7.2, docs/adr/0103-knowledge-updates.md) on the save path against real
Postgres: what supersedes what, the audit record, erasure of either end, and the model judge
(a local HTTP server speaking the OpenAI protocol)."""

from __future__ import annotations

from uuid import UUID

import pytest
from sqlalchemy import select

from contracts.common import Principal
from contracts.config import MemoryConfig, merge_config
from services.distill.save_path import Draft, SaveContext, SaveResult, save_entries
from shared.adapters.judges import OpenAICompatJudge
from shared.ports import SupersessionJudge
from shared.storage.db.engine import Database
from shared.storage.db.models import AuditRecord, MemoryEntry
from shared.storage.entries import with_ids
from shared.storage.erasure import erase
from tests.support.fake_openai import FakeOpenAI

pytestmark = pytest.mark.integration

ALICE = Principal(kind="end_user", id="alice")
BOB = Principal(kind="end_user", id="bob")


def _ctx(org: UUID, agent: UUID, owner: Principal | None = ALICE) -> SaveContext:
    return SaveContext(
        org_id=org, agent_config_id=agent, owner=owner, session_id=None, source="elective", requested_by="t"
    )


async def _save(
    db: Database,
    org: UUID,
    agent: UUID,
    text: str,
    *,
    owner: Principal | None = ALICE,
    memory_type: str = "fact",
    config: MemoryConfig | None = None,
    judge: SupersessionJudge | None = None,
) -> SaveResult:
    async with db.transaction() as s:
        return await save_entries(
            s, _ctx(org, agent, owner), [Draft(text, 0.5, memory_type)], config or MemoryConfig(), judge=judge
        )


async def _rows(db: Database, org: UUID) -> dict[str, MemoryEntry]:
    async with db.read() as s:
        rows = (await s.execute(select(MemoryEntry).where(MemoryEntry.org_id == org))).scalars()
        return {r.text: r for r in rows}


async def test_a_changed_place_supersedes_the_old_one(db: Database, org: UUID, agent: UUID) -> None:
    """The older entry becomes superseded with valid_until; the new one points back with
    valid_from; both ends link; one audit record names the pair."""
    await _save(db, org, agent, "Alice lives in Boston.")
    result = await _save(db, org, agent, "Alice moved to Seattle.")
    rows = await _rows(db, org)
    old, new = rows["Alice lives in Boston."], rows["Alice moved to Seattle."]
    assert result.superseded == [(old.id, new.id, "changed:residence", "rules")]
    assert (old.lifecycle, old.superseded_by, old.valid_until) == ("superseded", new.id, new.created_at)
    assert (new.lifecycle, new.supersedes, new.valid_from) == ("active", old.id, new.created_at)
    async with db.read() as s:
        records = (
            await s.execute(
                select(AuditRecord).where(AuditRecord.org_id == org, AuditRecord.kind == "memory.superseded")
            )
        ).scalars()
        (record,) = list(records)
    assert record.entry_ids == [str(old.id), str(new.id)]
    assert record.details["by"] == "rules"


async def test_look_alikes_and_other_owners_stay_current(db: Database, org: UUID, agent: UUID) -> None:
    """Another owner's entry, another subject, an addition, an episode and an exact repeat supersede
    nothing; the exact repeat reinforces as before."""
    await _save(db, org, agent, "Alice lives in Boston.", owner=BOB)
    await _save(db, org, agent, "Alice lives in Boston.")
    await _save(db, org, agent, "Alice's sister moved to Denver.")
    await _save(db, org, agent, "Alice lives in Boston with a dog named Rex.")
    await _save(db, org, agent, "Alice talked about moving to Oslo.", memory_type="episodic")
    await _save(db, org, agent, "Alice moved to Oslo.", memory_type="episodic")
    repeat = await _save(db, org, agent, "alice lives in boston")
    assert (repeat.reinforced, repeat.superseded) == (1, [])
    rows = await _rows(db, org)
    assert {r.lifecycle for r in rows.values()} == {"active"}


async def test_switched_off_by_the_agent_config(db: Database, org: UUID, agent: UUID) -> None:
    """``knowledge_updates: false`` keeps every entry current."""
    off = merge_config(MemoryConfig(), {"knowledge_updates": False})
    await _save(db, org, agent, "Alice works at Acme.", config=off)
    result = await _save(db, org, agent, "Alice now works at Globex.", config=off)
    assert result.superseded == []
    assert {r.lifecycle for r in (await _rows(db, org)).values()} == {"active"}


async def test_a_chain_of_updates(db: Database, org: UUID, agent: UUID) -> None:
    """Boston → Seattle → Boston again: the repeated old text is a new entry (the superseded one
    left the dedupe index) and supersedes Seattle; each link points one step."""
    await _save(db, org, agent, "Alice lives in Boston.")
    await _save(db, org, agent, "Alice moved to Seattle.")
    again = await _save(db, org, agent, "Alice lives in Boston.")
    assert again.saved == 1
    async with db.read() as s:
        rows = list((await s.execute(select(MemoryEntry).where(MemoryEntry.org_id == org))).scalars())
    current = [r for r in rows if r.lifecycle == "active"]
    assert [r.text for r in current] == ["Alice lives in Boston."]
    seattle = next(r for r in rows if r.text == "Alice moved to Seattle.")
    assert (seattle.lifecycle, seattle.superseded_by, current[0].supersedes) == (
        "superseded",
        current[0].id,
        seattle.id,
    )


async def _erase(db: Database, org: UUID, entry_id: UUID) -> list[UUID]:
    async with db.transaction() as s:
        erased = await erase(s, org_id=org, where=with_ids([entry_id]), reason="delete", requested_by="t")
    return erased.ids


async def test_erasing_the_new_entry_does_not_make_the_old_one_current(
    db: Database, org: UUID, agent: UUID
) -> None:
    """Erasing the newer knowledge erases it alone: the old entry stays superseded (history), its
    link to the erased entry cleared."""
    await _save(db, org, agent, "Alice works at Acme.")
    await _save(db, org, agent, "Alice now works at Globex.")
    rows = await _rows(db, org)
    new = rows["Alice now works at Globex."]
    assert await _erase(db, org, new.id) == [new.id]
    (old,) = (await _rows(db, org)).values()
    assert (old.text, old.lifecycle, old.superseded_by) == ("Alice works at Acme.", "superseded", None)
    assert old.valid_until is not None


async def test_erasing_the_old_entry_leaves_the_chain(db: Database, org: UUID, agent: UUID) -> None:
    """Erasing the superseded entry erases it alone: the current one stays, no longer pointing back."""
    await _save(db, org, agent, "Alice works at Acme.")
    await _save(db, org, agent, "Alice now works at Globex.")
    rows = await _rows(db, org)
    old = rows["Alice works at Acme."]
    assert await _erase(db, org, old.id) == [old.id]
    (new,) = (await _rows(db, org)).values()
    assert (new.text, new.lifecycle, new.supersedes) == ("Alice now works at Globex.", "active", None)


class _Counting:
    def __init__(self, inner: OpenAICompatJudge) -> None:
        self.inner = inner
        self.pairs: list[tuple[str, str]] = []

    async def supersedes(self, old: str, new: str) -> bool | None:
        self.pairs.append((old, new))
        return await self.inner.supersedes(old, new)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_the_model_judges_what_the_rules_leave_open(db: Database, org: UUID, agent: UUID) -> None:
    """A related pair the rules do not call an update goes to the model; its yes supersedes (audited
    as the model's); a pair the rules decide is never sent."""
    async with FakeOpenAI(content='{"supersedes": true}') as server:
        judge = _Counting(OpenAICompatJudge(server.base_url, "fake-model", timeout_s=5.0, retries=0))
        try:
            await _save(db, org, agent, "Alice prefers window seats.")
            result = await _save(db, org, agent, "Alice prefers aisle seats.", judge=judge)
            await _save(db, org, agent, "Alice works at Acme.", judge=judge)
            await _save(db, org, agent, "Alice now works at Globex.", judge=judge)
        finally:
            await judge.aclose()
    rows = await _rows(db, org)
    window, aisle = rows["Alice prefers window seats."], rows["Alice prefers aisle seats."]
    assert result.superseded == [(window.id, aisle.id, "model", "model")]
    assert window.lifecycle == "superseded"
    assert rows["Alice works at Acme."].lifecycle == "superseded"
    assert ("Alice works at Acme.", "Alice now works at Globex.") not in judge.pairs


async def test_a_model_that_cannot_answer_changes_nothing(db: Database, org: UUID, agent: UUID) -> None:
    """A model that is down (or answers nonsense) leaves the rules' "no": the save goes on."""
    for fake in (FakeOpenAI(mode="fail"), FakeOpenAI(content="maybe?")):
        async with fake as server:
            judge = OpenAICompatJudge(server.base_url, "fake-model", timeout_s=5.0, retries=0)
            try:
                await _save(db, org, agent, f"Alice prefers window seats ({fake.mode}).")
                result = await _save(db, org, agent, f"Alice prefers aisle seats ({fake.mode}).", judge=judge)
            finally:
                await judge.aclose()
        assert (result.saved, result.superseded) == (1, [])


async def test_within_one_batch_the_later_entry_supersedes(db: Database, org: UUID, agent: UUID) -> None:
    """Two saves of one owner stored in one batch (one transaction): the later one supersedes the
    earlier, as if saved a moment after it."""
    async with db.transaction() as s:
        result = await save_entries(
            s,
            _ctx(org, agent),
            [Draft("Alice works at Acme.", 0.5, "fact"), Draft("Alice now works at Globex.", 0.5, "fact")],
            MemoryConfig(),
        )
    rows = await _rows(db, org)
    old, new = rows["Alice works at Acme."], rows["Alice now works at Globex."]
    assert result.superseded == [(old.id, new.id, "changed:employer", "rules")]
    assert (old.lifecycle, new.lifecycle) == ("superseded", "active")
