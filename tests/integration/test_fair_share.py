"""Fair share at the request-reply edge on a real nats-server (docs/adr/0100-fair-share.md): one
organization's backlog does not stand between another organization and its answer, an
organization with its queue full is refused RATE_LIMITED at once (not left to time out), and a
request over its budget is refused before it waits behind anything — all by order and count, not
by time. What fairness and quotas look like through HTTP, MCP and two gateway replicas is in
tests/integration/test_quotas.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from uuid import UUID, uuid4

import nats
import pytest
import redis.asyncio as redis_asyncio
from nats.aio.client import Client

from contracts.common import Principal
from contracts.config import MemoryConfig
from contracts.operations import CONFIG_GET
from contracts.requests import ConfigGet, ConfigReply
from shared.runtime.quotas import Quotas, QuotaSettings
from shared.security.access import Caller
from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.service.edge import Edge, FairQueue
from tests.conftest import TEST_REDIS_URL
from tests.platform import eventually
from tests.support.servers import nats_server

pytestmark = pytest.mark.integration


@pytest.fixture
async def nc(tmp_path: Path) -> AsyncIterator[Client]:
    async with nats_server(tmp_path / "nats") as server:
        conn = await nats.connect(server.url)
        yield conn
        await conn.close()


def _headers(tokens: TokenService, org: UUID) -> dict[str, str]:
    token = tokens.mint(
        org_id=org, principal=Principal(kind="service", id="runner"), permissions=ALL_PERMISSIONS
    )
    return {"Authorization": f"Bearer {token}"}


def _body(n: int) -> bytes:
    return json.dumps({"agent_config_id": str(UUID(int=n + 1))}).encode()


class Held:
    """A config.get handler that holds the first request of one organization until released,
    and records the order in which requests were handled (by their agent config's number)."""

    def __init__(self, holding: UUID) -> None:
        self.holding = holding
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.handled: list[tuple[UUID, int]] = []

    async def __call__(self, caller: Caller, request: ConfigGet) -> ConfigReply:
        org = caller.credential.org_id
        self.handled.append((org, request.agent_config_id.int - 1))
        if org == self.holding and not self.entered.is_set():
            self.entered.set()
            await self.release.wait()
        return ConfigReply(agent_config_id=request.agent_config_id, version=1, config=MemoryConfig())


async def _edge(nc: Client, tokens: TokenService, handler: Held, **kwargs: object) -> Edge:
    edge = Edge(tokens, **kwargs)  # type: ignore[arg-type]
    edge.serve(CONFIG_GET, handler)
    await edge.start(nc)
    await nc.flush()
    return edge


async def _ask(nc: Client, headers: dict[str, str], n: int) -> asyncio.Future[dict[str, object]]:
    async def one() -> dict[str, object]:
        reply = await nc.request(CONFIG_GET.subject, _body(n), timeout=30, headers=headers)
        data: dict[str, object] = json.loads(reply.data)
        return data

    return asyncio.ensure_future(one())


async def test_another_organizations_request_is_answered_while_one_organizations_backlog_waits(
    nc: Client, tokens: TokenService
) -> None:
    """A holds a worker with one request and queues ten more; B's request is answered while A's
    first is still held and before any of A's queued ones (one FIFO would answer B last)."""
    a, b = uuid4(), uuid4()
    handler = Held(holding=a)
    edge = await _edge(nc, tokens, handler)
    try:
        first = await _ask(nc, _headers(tokens, a), 0)
        await asyncio.wait_for(handler.entered.wait(), 20)
        backlog = [await _ask(nc, _headers(tokens, a), n) for n in range(1, 11)]

        async def queued() -> bool:
            return edge.waiting == 10

        await eventually(queued, timeout=20, what="A's ten requests queued behind its held one")
        answered = await asyncio.wait_for(await _ask(nc, _headers(tokens, b), 100), 20)
        assert answered["version"] == 1
        assert not first.done()  # A's first is still held: B did not wait for it
        assert handler.handled == [(a, 0), (b, 100)]  # nothing of A's backlog went before B
        handler.release.set()
        await asyncio.wait_for(asyncio.gather(first, *backlog), 20)
        # A's own requests are answered in the order it sent them.
        assert [n for org, n in handler.handled if org == a] == list(range(11))
    finally:
        handler.release.set()
        await edge.stop()


async def test_an_organization_with_its_queue_full_is_refused_at_once_and_another_is_not(
    nc: Client, tokens: TokenService
) -> None:
    a, b = uuid4(), uuid4()
    handler = Held(holding=a)
    edge = await _edge(nc, tokens, handler, org_queue=3)
    try:
        first = await _ask(nc, _headers(tokens, a), 0)
        await asyncio.wait_for(handler.entered.wait(), 20)
        queued = [await _ask(nc, _headers(tokens, a), n) for n in range(1, 4)]

        async def full() -> bool:
            return edge.waiting == 3

        await eventually(full, timeout=20, what="A's queue full")
        refused = await asyncio.wait_for(await _ask(nc, _headers(tokens, a), 4), 20)
        assert refused["error"]["code"] == "RATE_LIMITED"  # type: ignore[index]
        assert refused["error"]["details"]["retry_after_s"] == 1  # type: ignore[index]
        assert not first.done()  # refused while A's first is held: not queued behind it
        assert (await asyncio.wait_for(await _ask(nc, _headers(tokens, b), 100), 20))["version"] == 1
        handler.release.set()
        replies = await asyncio.wait_for(asyncio.gather(first, *queued), 20)
        assert all(r["version"] == 1 for r in replies)
        assert sorted(n for org, n in handler.handled if org == a) == [0, 1, 2, 3]  # 4 never ran
    finally:
        handler.release.set()
        await edge.stop()


async def test_a_request_over_its_budget_is_refused_before_it_waits_behind_its_own_backlog(
    nc: Client, tokens: TokenService
) -> None:
    """The budget is charged at admission: with A's only worker held and its next request
    queued, A's request over budget is answered RATE_LIMITED at once (charged after the queue,
    it would wait for the held one)."""
    a = uuid4()
    quotas = Quotas(QuotaSettings.model_validate({"org": {"read": {"rate": 0.01, "burst": 2}}}))
    handler = Held(holding=a)
    edge = await _edge(nc, tokens, handler, quotas=quotas)
    try:
        first = await _ask(nc, _headers(tokens, a), 0)
        await asyncio.wait_for(handler.entered.wait(), 20)
        second = await _ask(nc, _headers(tokens, a), 1)

        async def queued() -> bool:
            return edge.waiting == 1

        await eventually(queued, timeout=20, what="A's second request queued")
        refused = await asyncio.wait_for(await _ask(nc, _headers(tokens, a), 2), 20)
        assert refused["error"]["code"] == "RATE_LIMITED"  # type: ignore[index]
        assert not first.done()
        assert not second.done()
        handler.release.set()
        await asyncio.wait_for(asyncio.gather(first, second), 20)
        assert [n for _, n in handler.handled] == [0, 1]
    finally:
        handler.release.set()
        await edge.stop()


async def test_the_fair_queue_takes_keys_in_turn_within_each_keys_share() -> None:
    a, b, c = UUID(int=1), UUID(int=2), UUID(int=3)
    fair: FairQueue[str] = FairQueue(share=2, depth=4)
    for item in ("a1", "a2", "a3", "a4"):
        assert fair.put(a, item)
    assert not fair.put(a, "a5")  # a's depth is full
    fair.put(b, "b1")
    fair.put(c, "c1")
    fair.put(b, "b2")
    taken = [await fair.get() for _ in range(5)]
    assert [item for _, item in taken] == ["a1", "b1", "c1", "a2", "b2"]
    # a holds its share of two: a3 waits until one of a's is done.
    waiting = asyncio.ensure_future(fair.get())
    await asyncio.sleep(0)
    assert not waiting.done()
    fair.done(a)
    assert await asyncio.wait_for(waiting, 5) == (a, "a3")


async def test_two_replicas_spend_one_budget_and_answer_every_request(
    tmp_path: Path, tokens: TokenService
) -> None:
    """Two instances of a service (one queue group, their own connections, one Redis): an
    organization's budget is one budget across them — exactly its burst answered, every other
    request RATE_LIMITED, none left unanswered — and another organization has its own."""
    probe = redis_asyncio.from_url(TEST_REDIS_URL, socket_connect_timeout=1)
    try:
        await probe.ping()
    except Exception:
        pytest.skip("no Redis at 127.0.0.1:6379 (CI starts one): replicas cannot share a budget")
    finally:
        await probe.aclose()
    burst = 6
    settings = QuotaSettings.model_validate({"org": {"read": {"rate": 0.01, "burst": burst}}})
    a, b = uuid4(), uuid4()
    async with nats_server(tmp_path / "nats") as server:
        client = await nats.connect(server.url)
        edges: list[Edge] = []
        conns: list[Client] = []
        quotas = [Quotas(settings, redis_url=TEST_REDIS_URL) for _ in range(2)]
        handled: list[int] = []
        try:
            for i, q in enumerate(quotas):

                async def config_get(_: Caller, request: ConfigGet, i: int = i) -> ConfigReply:
                    handled.append(i)
                    return ConfigReply(
                        agent_config_id=request.agent_config_id, version=1, config=MemoryConfig()
                    )

                conn = await nats.connect(server.url)
                conns.append(conn)
                edge = Edge(tokens, quotas=q)
                edge.serve(CONFIG_GET, config_get)
                await edge.start(conn)
                await conn.flush()
                edges.append(edge)
            replies = [
                await asyncio.wait_for(await _ask(client, _headers(tokens, a), n), 20) for n in range(20)
            ]
            other = await asyncio.wait_for(await _ask(client, _headers(tokens, b), 100), 20)
        finally:
            for edge in edges:
                await edge.stop()
            for conn in conns:
                await conn.close()
            for q in quotas:
                await q.aclose()
            await client.close()
    codes = [r["error"]["code"] if "error" in r else "OK" for r in replies]  # type: ignore[index]
    assert codes.count("OK") == burst  # one budget, not one per replica
    assert codes.count("RATE_LIMITED") == 20 - burst
    assert other["version"] == 1
    assert set(handled) == {0, 1}, handled  # both replicas answered
