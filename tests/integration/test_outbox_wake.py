"""The outbox relay wakes on commit: a transaction that enqueued events wakes it (a commit hook of
``Database.transaction()``), so they are published at once, without a writer calling anything and
without waiting for the relay's poll. No services run in this module: the relay here is the only
one, and it polls once an hour."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from uuid import UUID, uuid4

import pytest
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy
from sqlalchemy import func, select, text

from contracts.events import DeadLetter
from contracts.subjects import dead_letter_subject
from shared.messaging.bus import ensure_streams
from shared.security.provenance import MessageSigner
from shared.storage.db.engine import Database
from shared.storage.db.models import OUTBOX
from shared.storage.outbox import OutboxRelay, enqueue
from tests.conftest import TEST_KID, TEST_SECRET
from tests.platform import eventually

pytestmark = pytest.mark.integration

#: Far longer than any test waits: only a wake can make the relay publish in time.
HOUR_S = 3600.0


def _letter() -> DeadLetter:
    return DeadLetter(
        source_subject="test.wake",
        original_event_id=None,
        code="INVALID_REQUEST",
        reason="test",
        original_b64="",
    )


async def _enqueue_one(db: Database, subject: str) -> UUID:
    letter = _letter()
    async with db.transaction() as session:
        await enqueue(session, subject, letter, letter.event_id)
    return letter.event_id


@pytest.fixture
async def relay(db: Database, observer_nc: Client) -> AsyncIterator[OutboxRelay]:
    """A relay on the test's own database connection, publishing with the observer's rights."""
    js = observer_nc.jetstream()
    await ensure_streams(js)
    relay = OutboxRelay(db, js, signer=MessageSigner({TEST_KID: TEST_SECRET}), poll_interval_s=HOUR_S)
    yield relay
    await relay.stop()


async def test_only_a_commit_that_enqueued_wakes_the_relay(db: Database, relay: OutboxRelay) -> None:
    """A committed enqueue wakes the relay once; a transaction without outbox rows, and one that
    enqueued but rolled back, do not."""
    subject = dead_letter_subject(f"w{uuid4().hex[:8]}")
    async with db.transaction() as session:
        await session.execute(text("SELECT 1"))
    assert relay.wakes == 0

    async def enqueue_then_fail() -> None:
        async with db.transaction() as session:
            await enqueue(session, subject, _letter(), uuid4())
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError, match="rolled back"):
        await enqueue_then_fail()
    assert relay.wakes == 0

    event_id = await _enqueue_one(db, subject)
    assert relay.wakes == 1
    async with db.transaction() as session:  # not published: this relay never started; tidy up
        await session.execute(OUTBOX.delete().where(OUTBOX.c.event_id == event_id))


async def test_a_committed_event_is_published_without_waiting_for_the_poll(
    db: Database, relay: OutboxRelay, observer_nc: Client
) -> None:
    """With an hour-long poll, an event enqueued by a plain transaction reaches its stream within
    the test's wait: the commit woke the relay."""
    await relay.start()
    source = f"w{uuid4().hex[:8]}"
    event_id = await _enqueue_one(db, dead_letter_subject(source))

    async def gone_from_outbox() -> bool:
        async with db.read() as session:
            left = await session.execute(select(func.count()).where(OUTBOX.c.event_id == event_id))
            return left.scalar_one() == 0

    await eventually(gone_from_outbox, timeout=30, what="the relay to publish the event")
    assert relay.wakes >= 1
    sub = await observer_nc.jetstream().pull_subscribe(
        dead_letter_subject(source),
        stream="ENGRAM_DLQ",
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    try:
        [msg] = await sub.fetch(1, timeout=10)
    finally:
        await sub.unsubscribe()
    assert json.loads(msg.data)["event_id"] == str(event_id)
    assert msg.headers is not None
    assert msg.headers["Nats-Msg-Id"] == str(event_id)
