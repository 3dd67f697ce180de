"""The gateway's readiness on a real nats-server: a service busy answering the gateway's
requests counts as answering (a probe queued behind its work would time out), and one that
stopped answering is not ready."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from contracts.errors import Unavailable
from contracts.operations import RECALL
from services.gateway.bridge import Bridge
from tests.support.servers import nats_server

pytestmark = pytest.mark.integration


@pytest.fixture
async def server_url(tmp_path: Path) -> AsyncIterator[str]:
    async with nats_server(tmp_path / "nats") as server:
        yield server.url


@pytest.fixture
async def bridge(server_url: str) -> AsyncIterator[Bridge]:
    nc = await nats.connect(server_url)
    yield Bridge(nc, timeout_s=30)
    await nc.close()


async def _busy_recall(nc: Client, release: asyncio.Event) -> asyncio.Event:
    """A recall service answering its first request at once and holding every later one until
    ``release`` (one at a time, as the edge does); the event returned is set once it holds one."""
    holding = asyncio.Event()
    answered = 0

    async def serve(msg: Msg) -> None:
        nonlocal answered
        if answered:
            holding.set()
            await release.wait()
        answered += 1
        await msg.respond(json.dumps({"results": []}).encode())

    await nc.subscribe(RECALL.subject, queue=RECALL.queue_group, cb=serve)
    await nc.flush()
    return holding


async def test_a_service_busy_answering_the_gateway_is_ready(server_url: str, bridge: Bridge) -> None:
    """Right after the recall service answered a request, the gateway counts it as answering
    even while it is busy with the next one: no probe waits behind the work."""
    release = asyncio.Event()
    service = await nats.connect(server_url)
    holding = await _busy_recall(service, release)
    try:
        await bridge.request(RECALL, b"{}", "Bearer x")
        busy = asyncio.ensure_future(bridge.request(RECALL, b"{}", "Bearer x"))
        await asyncio.wait_for(holding.wait(), 20)  # a bound, not a speed claim
        checks = await bridge.services_running()
        assert checks["recall"] is True, checks
    finally:
        release.set()
        with contextlib.suppress(Exception):
            await busy
        await service.close()


async def test_a_service_that_stopped_answering_is_not_ready(server_url: str, bridge: Bridge) -> None:
    """A service that answered, then went away (a request found no responders), is probed again
    and reported not answering."""
    service = await nats.connect(server_url)
    await _busy_recall(service, asyncio.Event())
    await bridge.request(RECALL, b"{}", "Bearer x")
    await service.close()
    with pytest.raises(Unavailable):
        await bridge.request(RECALL, b"{}", "Bearer x")
    assert (await bridge.services_running())["recall"] is False
