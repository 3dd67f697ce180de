"""The durables' pull loop (``shared/messaging/pull.py``) on a real JetStream: an idle durable asks the server
for one message and lets the pull linger (not a 20 ms poll), and what is published then is taken."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from uuid import uuid4

import pytest
from faststream.nats import JStream, NatsBroker, PullSub
from faststream.nats.security import NatsNKey
from nats.aio.client import Client
from nats.aio.msg import Msg

from shared.embedded.nats_server import NatsServerProcess
from shared.messaging.pull import IDLE_PULL_S, patch_pull_loops
from tests.platform import eventually

pytestmark = pytest.mark.integration


@pytest.fixture
async def stream(observer_nc: Client) -> AsyncIterator[tuple[str, str]]:
    js = observer_nc.jetstream()
    tag = uuid4().hex[:8]
    name, subject = f"PULL_{tag}", f"test.pull.{tag}"
    await js.add_stream(name=name, subjects=[subject])
    try:
        yield name, subject
    finally:
        await js.delete_stream(name)


async def test_an_idle_durable_lingers_for_one_message_then_takes_what_is_published(
    nats_proc: NatsServerProcess, observer_nc: Client, stream: tuple[str, str]
) -> None:
    name, subject = stream
    pulls: list[dict[str, Any]] = []

    async def saw_pull(msg: Msg) -> None:
        pulls.append(json.loads(msg.data))

    watch = await observer_nc.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{name}.pull-test", cb=saw_pull)
    patch_pull_loops()
    # The test observer's identity (it may pull from any stream) where the server has users.
    observer = getattr(nats_proc, "observer", None)
    who: dict[str, Any] = {}
    if observer is not None:
        who = {"security": NatsNKey.from_seed(observer.seed), "inbox_prefix": observer.inbox_prefix}
    broker = NatsBroker(nats_proc.url, **who)
    got: list[int] = []

    @broker.subscriber(
        subject,
        stream=JStream(name, declare=False),
        durable="pull-test",
        pull_sub=PullSub(batch_size=10, timeout=0.02, batch=True),
    )
    async def handle(body: list[int]) -> None:
        got.extend(body)

    await broker.start()
    try:

        async def lingering() -> bool:
            return any("expires" in pull for pull in pulls)

        await eventually(lingering, timeout=30, what="the durable's first lingering pull")
        # FastStream's own loop asked for the whole batch with a 20 ms expiry, over and over.
        first = next(pull for pull in pulls if "expires" in pull)
        assert first["batch"] == 1
        assert first["expires"] >= (IDLE_PULL_S - 1) * 1_000_000_000
        for n in range(3):
            await observer_nc.jetstream().publish(subject, json.dumps(n).encode())

        async def taken() -> bool:
            return sorted(got) == [0, 1, 2]

        await eventually(taken, timeout=30, what="the published messages handled")
    finally:
        await broker.stop()
        await watch.unsubscribe()
