"""The JetStream batch helper (``shared.service.consumer``) on a real durable: bad input is dead-lettered
and acked once, an outage naks with backoff and the redelivery takes effect once, a batch that
fails after acking part of itself naks only the rest, and a message that fails on its own is
isolated from its batch and dead-lettered after ``max_deliver`` deliveries. The outages are real
(a Postgres that is not there), and so is the failure (a text Postgres refuses)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from uuid import uuid4

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from pydantic import BaseModel, ConfigDict
from sqlalchemy import func, select

from contracts.subjects import dead_letter_subject
from shared.embedded.nats_server import free_port
from shared.service.consumer import Batch, BatchHandler, consume
from shared.service.infra import Infra
from shared.storage import audit
from shared.storage.db.engine import Database
from shared.storage.db.models import INBOX, AuditRecord
from shared.storage.deadletter import Rejection, dead_letter_all, delivery_key
from shared.storage.outbox import claim_inbox
from tests.platform import eventually

pytestmark = pytest.mark.integration

#: The redelivery delay of these tests' outages: long enough that an immediate redelivery (a nak
#: without the backoff) is told apart, short enough to wait for.
BACKOFF_S = 2.0


class Ping(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int


@dataclass
class Durable:
    """A stream and a durable pull consumer of the test's own, as the services' are configured."""

    js: JetStreamContext
    stream: str
    subject: str
    name: str
    sub: JetStreamContext.PullSubscription

    async def fetch(self, count: int, *, timeout: float = 20.0) -> list[Msg]:
        """``count`` deliveries, waiting for them as long as ``timeout`` (a bound, not a claim)."""
        got: list[Msg] = []
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            try:
                got += await self.sub.fetch(count - len(got), timeout=max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                break
        assert len(got) == count, f"{len(got)} of {count} deliveries"
        return got

    async def outstanding(self) -> tuple[int, int]:
        """(delivered and unacked, not yet delivered)."""
        info = await self.js.consumer_info(self.stream, self.name)
        return info.num_ack_pending, info.num_pending

    async def all_acked(self) -> None:
        """Wait until nothing is unacked or undelivered (acks are fire-and-forget publishes, which
        the server applies after a consumer-info request sent right behind them may be answered)."""

        async def settled() -> bool:
            return await self.outstanding() == (0, 0)

        await eventually(settled, timeout=20, what="every message acked")


@pytest.fixture
async def durable(observer_nc: Client) -> AsyncIterator[Durable]:
    js = observer_nc.jetstream()
    tag = uuid4().hex[:8]
    stream, subject, name = f"CONSUMER_{tag}", f"test.consumer.{tag}", f"test-{tag}"
    await js.add_stream(name=stream, subjects=[subject])
    sub = await js.pull_subscribe(
        subject, durable=name, stream=stream, config=ConsumerConfig(ack_wait=30, max_deliver=-1)
    )
    try:
        yield Durable(js, stream, subject, name, sub)
    finally:
        await js.delete_stream(stream)


@pytest.fixture
def infra(engram: Infra) -> Infra:
    """The services' infrastructure, with the outage backoff these tests wait out."""
    return dataclasses.replace(
        engram, settings=engram.settings.model_copy(update={"redeliver_backoff_s": (BACKOFF_S,)})
    )


@pytest.fixture
async def postgres_away() -> AsyncIterator[Database]:
    """A database nobody listens for: every transaction fails as in a Postgres outage."""
    away = Database(f"postgresql://engram@127.0.0.1:{free_port()}/engram", pool_size=1)
    yield away
    await away.close()


def _batch(infra: Infra, durable: Durable, msgs: list[Msg]) -> Batch:
    return Batch(infra, msgs, consumer=durable.name, source=durable.name.replace("-", ""))


def _claiming(db: Database, consumer: str, effects: list[int]) -> BatchHandler:
    """A handler whose effect is an inbox row per ping (what a consumer commits before its ack);
    ``effects`` records each ping that took effect for the first time."""

    async def handle(batch: Batch) -> None:
        parsed = await batch.parse(Ping, what="ping")
        async with db.transaction() as session:
            fresh = [p.n for _, p in parsed if await claim_inbox(session, consumer, str(p.n))]
        effects.extend(fresh)

    return handle


async def _inbox_rows(db: Database, consumer: str) -> int:
    async with db.read() as session:
        rows = await session.execute(select(func.count()).where(INBOX.c.consumer == consumer))
        return int(rows.scalar_one())


async def _rejections(db: Database, kind: str) -> list[AuditRecord]:
    async with db.read() as session:
        rows = await session.execute(
            select(AuditRecord).where(AuditRecord.org_id == audit.SYSTEM_ORG, AuditRecord.kind == kind)
        )
        return list(rows.scalars())


async def _letters(nc: Client, subject: str, want: int) -> list[dict[str, object]]:
    sub = await nc.jetstream().pull_subscribe(
        subject, stream="ENGRAM_DLQ", config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    )
    try:
        return [json.loads(m.data) for m in await sub.fetch(want, timeout=20)]
    finally:
        await sub.unsubscribe()


async def test_a_malformed_message_is_dead_lettered_and_acked_once(
    infra: Infra, durable: Durable, db: Database, observer_nc: Client
) -> None:
    """An unreadable message beside a good one is dead-lettered (code, reason, hash, system org)
    and acked; the good one takes effect; nothing is left to redeliver; and settling the same
    delivery again (as after a crash before the ack) writes no second letter."""
    bad = b'{"n": "not a number"}'
    await durable.js.publish(durable.subject, bad)
    await durable.js.publish(durable.subject, Ping(n=1).model_dump_json().encode())
    msgs = await durable.fetch(2)
    batch = _batch(infra, durable, msgs)
    effects: list[int] = []

    await consume(batch, _claiming(db, durable.name, effects))

    assert effects == [1]
    await durable.all_acked()
    assert batch.pending() == []
    kind = f"{batch.source}.rejected"
    [record] = await _rejections(db, kind)
    assert record.details["code"] == "INVALID_REQUEST"
    assert record.details["delivery"] == delivery_key(msgs[0])
    [letter] = await _letters(observer_nc, dead_letter_subject(batch.source), 1)
    assert letter["code"] == "INVALID_REQUEST"
    assert letter["reason"] == "unreadable ping: 1 errors"
    assert letter["org_id"] == str(audit.SYSTEM_ORG)
    assert letter["original_sha256"]
    assert letter["source_subject"] == durable.subject

    # The same stored message dead-lettered again (as when a crash loses the ack): keyed by its
    # delivery, so nothing is written twice.
    rejection = Rejection("INVALID_REQUEST", "again")
    await dead_letter_all(db, [(msgs[0], rejection)], consumer=batch.consumer, source=batch.source)
    assert len(await _rejections(db, kind)) == 1


async def test_an_outage_naks_with_backoff_and_the_redelivery_takes_effect_once(
    infra: Infra, durable: Durable, db: Database, postgres_away: Database
) -> None:
    """The handler's Postgres is away: the batch is nakked with the backoff (not redelivered
    before it), comes back, and takes effect once when Postgres is there."""
    await durable.js.publish(durable.subject, Ping(n=7).model_dump_json().encode())
    [first] = await durable.fetch(1)
    effects: list[int] = []

    await consume(_batch(infra, durable, [first]), _claiming(postgres_away, durable.name, effects))
    nakked_at = time.monotonic()

    [again] = await durable.fetch(1)
    assert time.monotonic() - nakked_at >= BACKOFF_S * 0.9, "redelivered before the backoff"
    assert again.metadata.num_delivered == 2
    await consume(_batch(infra, durable, [again]), _claiming(db, durable.name, effects))
    assert effects == [7]
    assert await _inbox_rows(db, durable.name) == 1
    await durable.all_acked()


async def test_a_batch_failing_after_a_partial_ack_naks_only_the_rest(
    infra: Infra, durable: Durable, db: Database, postgres_away: Database
) -> None:
    """The handler acks the first of three, then meets an outage: only the other two come back,
    and they take effect once."""
    for n in (1, 2, 3):
        await durable.js.publish(durable.subject, Ping(n=n).model_dump_json().encode())
    msgs = await durable.fetch(3)
    claim = _claiming(postgres_away, durable.name, [])

    async def ack_one_then_fail(batch: Batch) -> None:
        await batch.ack(batch.msgs[:1])
        await claim(batch)

    await consume(_batch(infra, durable, msgs), ack_one_then_fail)

    back = await durable.fetch(2)
    assert sorted(Ping.model_validate_json(m.data).n for m in back) == [2, 3]
    assert all(m.metadata.num_delivered == 2 for m in back)
    # Those two are all that is out: the first is acked, not waiting anywhere to come back.
    assert await durable.outstanding() == (2, 0)
    effects: list[int] = []
    await consume(_batch(infra, durable, back), _claiming(db, durable.name, effects))
    assert sorted(effects) == [2, 3]
    await durable.all_acked()


async def test_a_message_failing_on_its_own_is_isolated_then_dead_lettered_after_max_deliver(
    infra: Infra, durable: Durable, db: Database, observer_nc: Client
) -> None:
    """One ping Postgres refuses (its key holds U+0000) in a batch of three: the other two take
    effect on the first delivery; the bad one alone is nakked with backoff, redelivered, and on
    its ``max_deliver``-th delivery dead-lettered (INTERNAL, the failure's kind, never its text)
    and acked: nothing is left to redeliver."""
    quick = dataclasses.replace(
        infra, settings=infra.settings.model_copy(update={"redeliver_backoff_s": (0.1,), "max_deliver": 3})
    )
    for key in ("one", "bad\x00key", "two"):
        await durable.js.publish(durable.subject, json.dumps({"key": key}).encode())
    effects: list[str] = []

    async def claim_keys(batch: Batch) -> None:
        keys = [(m, json.loads(m.data)["key"]) for m in batch.msgs]
        async with db.transaction() as session:
            fresh = [k for _, k in keys if await claim_inbox(session, durable.name, k)]
        effects.extend(fresh)

    msgs = await durable.fetch(3)
    await consume(_batch(quick, durable, msgs), claim_keys)
    assert sorted(effects) == ["one", "two"]

    for delivery in (2, 3):
        [again] = await durable.fetch(1)
        assert json.loads(again.data)["key"] == "bad\x00key"
        assert again.metadata.num_delivered == delivery
        await consume(_batch(quick, durable, [again]), claim_keys)
    await durable.all_acked()
    assert sorted(effects) == ["one", "two"]

    source = durable.name.replace("-", "")
    [record] = await _rejections(db, f"{source}.rejected")
    assert record.details["code"] == "INTERNAL"
    assert record.details["deliveries"] == 3
    assert "CharacterNotInRepertoireError" in record.details["reason"]
    [letter] = await _letters(observer_nc, dead_letter_subject(source), 1)
    assert letter["code"] == "INTERNAL"
    assert letter["deliveries"] == 3
