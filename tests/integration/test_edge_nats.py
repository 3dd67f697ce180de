"""The request-reply edge on a real nats-server: instances share an operation's queue group, a
stopping edge answers what it was delivered and takes nothing more, and each request is handled
in its caller's trace. (What the edge answers is tested in memory in tests/router/test_edge.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from contracts.config import MemoryConfig
from contracts.operations import CONFIG_GET
from contracts.requests import ConfigGet, ConfigReply
from shared.access import Caller
from shared.auth import TokenService
from shared.edge import Edge
from shared.testing.servers import nats_server
from tests.platform import eventually

pytestmark = pytest.mark.integration


@pytest.fixture
async def server_url(tmp_path: Path) -> AsyncIterator[str]:
    async with nats_server(tmp_path / "nats") as server:
        yield server.url


@pytest.fixture
async def client(server_url: str) -> AsyncIterator[Client]:
    nc = await nats.connect(server_url)
    yield nc
    await nc.close()


def _reply(request: ConfigGet) -> ConfigReply:
    return ConfigReply(agent_config_id=request.agent_config_id, version=1, config=MemoryConfig())


def _body() -> bytes:
    return json.dumps({"agent_config_id": "00000000-0000-4000-8000-000000000001"}).encode()


async def test_instances_share_the_queue_group_and_answer_each_request_once(
    server_url: str, client: Client, tokens: TokenService, service_token: str
) -> None:
    handled: Counter[str] = Counter()
    edges, connections = [], []
    for name in ("a", "b"):

        async def config_get(_: Caller, request: ConfigGet, name: str = name) -> ConfigReply:
            handled[name] += 1
            return _reply(request)

        edge = Edge(tokens)
        edge.serve(CONFIG_GET, config_get)
        nc = await nats.connect(server_url)
        await edge.start(nc)
        await nc.flush()
        edges.append(edge)
        connections.append(nc)
    headers = {"Authorization": f"Bearer {service_token}"}
    try:
        replies = await asyncio.gather(
            *(client.request(CONFIG_GET.subject, _body(), timeout=10, headers=headers) for _ in range(40))
        )
    finally:
        for edge, nc in zip(edges, connections, strict=True):
            await edge.stop()
            await nc.close()
    assert all(json.loads(r.data)["version"] == 1 for r in replies)
    assert sum(handled.values()) == 40  # once each: a queue group, not two plain subscriptions
    assert set(handled) == {"a", "b"}  # both instances took a share


async def test_a_stopping_edge_answers_what_it_was_delivered_and_takes_nothing_more(
    server_url: str, client: Client, tokens: TokenService, service_token: str
) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def config_get(_: Caller, request: ConfigGet) -> ConfigReply:
        entered.set()
        await release.wait()
        return _reply(request)

    edge = Edge(tokens)
    edge.serve(CONFIG_GET, config_get)
    nc = await nats.connect(server_url)
    await edge.start(nc)
    await nc.flush()
    headers = {"Authorization": f"Bearer {service_token}"}
    asked = client.request(CONFIG_GET.subject, _body(), timeout=30, headers=headers)
    in_flight = asyncio.ensure_future(asked)
    await asyncio.wait_for(entered.wait(), 10)
    stopping = asyncio.ensure_future(edge.stop())

    async def nobody_serves() -> bool:
        try:
            await client.request(CONFIG_GET.subject, _body(), timeout=0.5, headers=headers)
        except NoRespondersError:
            return True
        except TimeoutError:  # delivered before the unsubscribe: queued behind the held request
            return False
        return False

    try:
        await eventually(nobody_serves, timeout=20, what="the subscription gone from the server")
        assert not stopping.done()  # the drain waits for the held request
        release.set()
        reply = await asyncio.wait_for(in_flight, 10)
        await asyncio.wait_for(stopping, 10)
    finally:
        release.set()
        await nc.close()
    assert json.loads(reply.data)["version"] == 1


async def test_an_edge_stopping_while_nats_is_away_leaves_without_waiting_for_it(
    tmp_path: Path, tokens: TokenService
) -> None:
    """NATS gone at shutdown: nothing more can arrive and no answer could leave, so the edge
    unsubscribes instead of draining (a drain's flush would wait out its timeout, 10 s)."""

    async def config_get(_: Caller, request: ConfigGet) -> ConfigReply:
        return _reply(request)

    edge = Edge(tokens)
    edge.serve(CONFIG_GET, config_get)
    async with nats_server(tmp_path / "nats") as server:
        nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        await edge.start(nc)
        await nc.flush()
        await server.stop()

        async def disconnected() -> bool:
            return not nc.is_connected

        await eventually(disconnected, timeout=20, what="the client noticing the server gone")
        try:
            await asyncio.wait_for(edge.stop(), 5)  # a bound, not a speed claim: 10 s would be the flush's
        finally:
            with contextlib.suppress(ConnectionError):  # the server is gone: not under test
                await nc.close()


async def test_the_consume_span_continues_the_callers_trace(
    client: Client, tokens: TokenService, service_token: str
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def config_get(_: Caller, request: ConfigGet) -> ConfigReply:
        return _reply(request)

    edge = Edge(tokens)
    edge.serve(CONFIG_GET, config_get)
    await edge.start(client, tracer_provider=provider)
    await client.flush()
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    try:
        await client.request(
            CONFIG_GET.subject,
            _body(),
            timeout=10,
            headers={
                "Authorization": f"Bearer {service_token}",
                "traceparent": f"00-{trace_id}-{parent_id}-01",
            },
        )
        await client.request(CONFIG_GET.subject, b"{", timeout=10, headers={"Authorization": "Bearer x"})
    finally:
        await edge.stop()
        provider.shutdown()
    answered, refused = exporter.get_finished_spans()
    assert answered.name == f"{CONFIG_GET.subject} process"
    assert answered.kind == SpanKind.CONSUMER
    assert format(answered.context.trace_id, "032x") == trace_id
    assert answered.parent is not None
    assert format(answered.parent.span_id, "016x") == parent_id
    assert "error.type" not in (answered.attributes or {})
    assert refused.parent is None  # no traceparent: a trace of its own
    assert (refused.attributes or {})["error.type"] == "UNAUTHENTICATED"


async def test_without_a_tracer_the_handler_runs_in_the_callers_trace(
    client: Client, tokens: TokenService, service_token: str
) -> None:
    """No spans are made (nothing exports them), but logs and what the handler publishes carry the
    caller's trace: its context is current while the handler runs."""
    seen: list[int] = []

    async def config_get(_: Caller, request: ConfigGet) -> ConfigReply:
        seen.append(trace.get_current_span().get_span_context().trace_id)
        return _reply(request)

    edge = Edge(tokens)
    edge.serve(CONFIG_GET, config_get)
    await edge.start(client)
    await client.flush()
    trace_id = secrets.token_hex(16)
    headers = {"Authorization": f"Bearer {service_token}"}
    try:
        await client.request(
            CONFIG_GET.subject,
            _body(),
            timeout=10,
            headers={**headers, "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"},
        )
        await client.request(CONFIG_GET.subject, _body(), timeout=10, headers=headers)
    finally:
        await edge.stop()
    assert [format(t, "032x") for t in seen] == [trace_id, "0" * 32]
