"""Elective saves a batch at a time (docs/adr/0101-write-path-throughput.md): one transaction for
the batch, yet each save takes effect once, is audited on its own and its waiting caller gets its
own outcome — and a save that cannot be saved is refused alone."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from uuid import UUID, uuid4

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from sqlalchemy import func, select

from contracts.common import Principal
from contracts.internal import AcceptedSave
from contracts.requests import SaveEntry
from contracts.subjects import save_result_subject
from services.distill.saves import CONSUMER, handle_accepted_saves
from shared.service.consumer import Batch, consume
from shared.service.infra import Infra
from shared.storage.config_store import claim_agent_config
from shared.storage.db.engine import Database
from shared.storage.db.models import AuditRecord, MemoryEntry

pytestmark = pytest.mark.integration

OWNER = Principal.model_validate({"kind": "end_user", "id": "alice"})


def _save(
    org: UUID, agent: UUID, text: str, *, wait: bool = True, request_id: UUID | None = None
) -> AcceptedSave:
    return AcceptedSave(
        request_id=request_id or uuid4(),
        org_id=org,
        agent_config_id=agent,
        owner=OWNER,
        entries=[SaveEntry(text=text, importance=0.5)],
        wait=wait,
        requested_by="service:platform",
    )


async def _count(db: Database, model: Any, *where: Any) -> int:
    async with db.read() as s:
        return int((await s.execute(select(func.count()).select_from(model).where(*where))).scalar_one())


async def _one_batch(observer_nc: Client, saves: list[AcceptedSave]) -> tuple[list[Msg], Any, str, str]:
    """The saves as one pulled batch of a stream of their own (as distill-saves would get them)."""
    js = observer_nc.jetstream()
    stream, subject = f"SAVES_{uuid4().hex[:8]}", f"test.saves.{uuid4().hex[:8]}"
    await js.add_stream(name=stream, subjects=[subject])
    for save in saves:
        await js.publish(subject, save.model_dump_json().encode())
    sub = await js.pull_subscribe(subject, stream=stream)
    msgs = await sub.fetch(len(saves), timeout=5)
    assert len(msgs) == len(saves)
    return msgs, sub, stream, subject


async def test_a_batch_of_saves_takes_effect_once_each_with_its_own_outcome(
    engram: Infra, observer_nc: Client, db: Database, org: UUID, agent: UUID
) -> None:
    other_org = uuid4()
    foreign = uuid4()  # an agent config of another organization
    async with db.transaction() as s:
        await claim_agent_config(s, other_org, foreign, by="test")
    saves = [_save(org, agent, f"Fact number {i}: the staging cluster is in region {i}.") for i in range(20)]
    refused = _save(org, foreign, "This one names an agent config of another organization.")
    batch_saves = [*saves[:10], saves[3], refused, *saves[10:]]  # save 3 twice, as after a retry
    outcomes: dict[str, list[dict[str, Any]]] = {str(s.request_id): [] for s in [*saves, refused]}
    got_all = asyncio.Event()

    async def on_outcome(msg: Msg) -> None:
        outcomes[msg.subject.rsplit(".", 1)[-1]].append(json.loads(msg.data))
        if all(outcomes.values()):
            got_all.set()

    subs = [
        await engram.nc.subscribe(save_result_subject(str(s.request_id)), cb=on_outcome)
        for s in [*saves, refused]
    ]
    await engram.nc.flush()
    msgs, sub, stream, _ = await _one_batch(observer_nc, batch_saves)
    try:
        batch = Batch(engram, msgs, consumer=CONSUMER, source="save")
        await consume(batch, lambda b: handle_accepted_saves(engram, b))
        await asyncio.wait_for(got_all.wait(), 10)

        # Each save stored its entry once, with one memory.saved record of its own.
        assert await _count(db, MemoryEntry, MemoryEntry.org_id == org) == 20  # type: ignore[arg-type]
        assert (
            await _count(db, AuditRecord, AuditRecord.org_id == org, AuditRecord.kind == "memory.saved") == 20
        )  # type: ignore[arg-type]
        ids = set()
        for save in saves:
            (outcome,) = outcomes[str(save.request_id)]
            assert (outcome["saved"], outcome["reinforced"], outcome["skipped"]) == (1, 0, 0)
            ids.update(outcome["ids"])
        assert len(ids) == 20
        # The agent config came into being with this batch: its first save is told, once.
        warned = [o for s in saves for o in outcomes[str(s.request_id)] if o["warnings"]]
        assert [o["warnings"] for o in warned] == [["agent_config_created"]]
        # The foreign one is refused alone (and dead-lettered), the others unaffected.
        (answer,) = outcomes[str(refused.request_id)]
        assert answer["error"]["code"] == "FORBIDDEN"
        info = await observer_nc.jetstream().consumer_info(stream, sub._consumer)
        assert info.num_ack_pending == 0

        # Delivered again (a redelivery after a lost ack): nothing changes.
        msgs, sub, stream2, _ = await _one_batch(observer_nc, saves)
        try:
            await consume(
                Batch(engram, msgs, consumer=CONSUMER, source="save"),
                lambda b: handle_accepted_saves(engram, b),
            )
            assert await _count(db, MemoryEntry, MemoryEntry.org_id == org) == 20  # type: ignore[arg-type]
            assert (
                await _count(db, MemoryEntry, MemoryEntry.org_id == org, MemoryEntry.reinforcement_count > 0)
                == 0
            )  # type: ignore[arg-type]
        finally:
            await observer_nc.jetstream().delete_stream(stream2)
    finally:
        for s in subs:
            await s.unsubscribe()
        await observer_nc.jetstream().delete_stream(stream)


async def test_a_batch_that_fails_is_saved_one_save_at_a_time(
    engram: Infra, observer_nc: Client, db: Database, org: UUID, agent: UUID
) -> None:
    """A save the save path cannot store (text Postgres refuses) fails the batch's transaction;
    tried alone, each other save is stored and that one alone is retried, then dead-lettered."""
    good = [_save(org, agent, f"Deploys to region {i} need the VPN.", wait=False) for i in range(5)]
    bad = _save(org, agent, "a NUL byte \x00 Postgres will not store", wait=False)
    msgs, _, stream, _ = await _one_batch(observer_nc, [*good[:2], bad, *good[2:]])
    try:
        await consume(
            Batch(engram, msgs, consumer=CONSUMER, source="save"), lambda b: handle_accepted_saves(engram, b)
        )
        assert await _count(db, MemoryEntry, MemoryEntry.org_id == org) == 5  # type: ignore[arg-type]
    finally:
        await observer_nc.jetstream().delete_stream(stream)
