"""The request-reply edge on a real nats-server: instances share an operation's queue group, a
stopping edge answers what it was delivered and takes nothing more, a request that outwaited its
caller is left, and each request is handled in its caller's trace. (What the edge answers is
tested in memory in tests/router/test_edge.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from contracts.config import MemoryConfig
from contracts.operations import CONFIG_GET
from contracts.requests import ConfigGet, ConfigReply
from shared.security.access import Caller
from shared.security.auth import TokenService
from shared.service.edge import Edge, Handler, Observer
from tests.platform import eventually
from tests.support.servers import nats_server

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


async def _serving(
    nc: Client,
    tokens: TokenService,
    config_get: Handler[ConfigGet, ConfigReply],
    *,
    observe: Observer[ConfigReply] | None = None,
    tracer_provider: TracerProvider | None = None,
    edge: Edge | None = None,
) -> Edge:
    """An edge answering ``config.get`` by ``config_get`` on ``nc``, its subscription flushed."""
    edge = edge or Edge(tokens)
    edge.serve(CONFIG_GET, config_get, observe=observe)
    await edge.start(nc, tracer_provider=tracer_provider)
    await nc.flush()
    return edge


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _held(client: Client, entered: asyncio.Event, headers: dict[str, str]) -> asyncio.Future[Msg]:
    """A request the handler is now holding (``entered``), as a pending future of its reply.

    Asked again while the server answers "no responders": on a busy machine a queue subscription
    flushed from one connection was seen to miss a request published from another just after
    (the next one reached it), so the test waits on the handler holding one, not on the first."""
    for _ in range(100):
        asked = asyncio.ensure_future(
            client.request(CONFIG_GET.subject, _body(), timeout=30, headers=headers)
        )
        waiting = asyncio.ensure_future(entered.wait())
        done, _ = await asyncio.wait({waiting, asked}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
        if waiting in done:
            return asked
        waiting.cancel()
        if asked in done and isinstance(asked.exception(), NoRespondersError):
            continue
        asked.cancel()
        raise AssertionError(f"the handler never held the request: {asked}")
    raise AssertionError("no responders, 100 times")


async def test_instances_share_the_queue_group_and_answer_each_request_once(
    server_url: str, client: Client, tokens: TokenService, service_token: str
) -> None:
    handled: Counter[str] = Counter()
    edges, connections = [], []
    for name in ("a", "b"):

        async def config_get(_: Caller, request: ConfigGet, name: str = name) -> ConfigReply:
            handled[name] += 1
            return _reply(request)

        nc = await nats.connect(server_url)
        edge = await _serving(nc, tokens, config_get)
        edges.append(edge)
        connections.append(nc)
    headers = _auth(service_token)
    replies = []
    try:
        # Rounds of 20 until both instances took a share (the server picks a member at random;
        # 20 rounds all to one would be a queue group of one).
        for _ in range(20):
            replies += await asyncio.gather(
                *(client.request(CONFIG_GET.subject, _body(), timeout=10, headers=headers) for _ in range(20))
            )
            if set(handled) == {"a", "b"}:
                break
    finally:
        for edge, nc in zip(edges, connections, strict=True):
            await edge.stop()
            await nc.close()
    assert all(json.loads(r.data)["version"] == 1 for r in replies)
    assert sum(handled.values()) == len(replies)  # once each: a queue group, not two plain subscriptions
    assert set(handled) == {"a", "b"}, handled  # both instances took a share


async def test_a_request_that_outwaited_its_caller_is_left_and_fresh_ones_are_answered(
    server_url: str, client: Client, tokens: TokenService, service_token: str
) -> None:
    """A request queued behind a slow one until longer than its caller waits is not worked on
    (no one would read the answer), so a backlog clears and the next request is answered."""
    now = [0.0]
    entered, release = asyncio.Event(), asyncio.Event()
    handled: list[str] = []

    async def config_get(_: Caller, request: ConfigGet) -> ConfigReply:
        handled.append(str(request.agent_config_id))
        if len(handled) == 1:
            entered.set()
            await release.wait()
        return _reply(request)

    nc = await nats.connect(server_url)
    edge = Edge(tokens, default_wait_s=10.0, clock=lambda: now[0])
    await _serving(nc, tokens, config_get, edge=edge)
    headers = _auth(service_token)
    held = await _held(client, entered, headers)
    stale = asyncio.ensure_future(client.request(CONFIG_GET.subject, _body(), timeout=60, headers=headers))
    try:

        async def queued() -> bool:
            return edge.waiting == 1

        await eventually(queued, timeout=20, what="the second request queued behind the held one")
        now[0] = 10.5  # the queued request has now waited longer than its caller waits
        release.set()
        await asyncio.wait_for(held, 10)
        fresh = await client.request(CONFIG_GET.subject, _body(), timeout=10, headers=headers)
    finally:
        release.set()
        stale.cancel()
        await edge.stop()
        await nc.close()
    assert json.loads(fresh.data)["version"] == 1
    assert len(handled) == 2, "the request whose caller had given up was worked on"


async def test_an_operation_with_concurrency_answers_beside_a_held_request(
    server_url: str, client: Client, tokens: TokenService, service_token: str
) -> None:
    """``Operation.concurrency`` > 1 (``memory.save``): a request is answered while an earlier
    one is still being worked on, and a stop waits for the held one too."""
    entered, release = asyncio.Event(), asyncio.Event()
    handled: list[str] = []

    async def config_get(_: Caller, request: ConfigGet) -> ConfigReply:
        handled.append(str(request.agent_config_id))
        if len(handled) == 1:
            entered.set()
            await release.wait()
        return _reply(request)

    nc = await nats.connect(server_url)
    edge = Edge(tokens)
    edge.serve(replace(CONFIG_GET, concurrency=4), config_get)
    await edge.start(nc)
    await nc.flush()
    headers = _auth(service_token)
    held = await _held(client, entered, headers)
    try:
        beside = await client.request(CONFIG_GET.subject, _body(), timeout=10, headers=headers)
        assert json.loads(beside.data)["version"] == 1
        assert not held.done()
        stopping = asyncio.ensure_future(edge.stop())

        async def nobody_serves() -> bool:
            try:
                await client.request(CONFIG_GET.subject, _body(), timeout=0.5, headers=headers)
            except NoRespondersError:
                return True
            except TimeoutError:
                return False
            return False

        await eventually(nobody_serves, timeout=20, what="the subscription gone from the server")
        assert not stopping.done()  # the stop waits for the held request
        release.set()
        assert json.loads((await asyncio.wait_for(held, 10)).data)["version"] == 1
        await asyncio.wait_for(stopping, 10)
    finally:
        release.set()
        await nc.close()


async def test_a_stopping_edge_answers_what_it_was_delivered_and_takes_nothing_more(
    server_url: str, client: Client, tokens: TokenService, service_token: str
) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def config_get(_: Caller, request: ConfigGet) -> ConfigReply:
        entered.set()
        await release.wait()
        return _reply(request)

    nc = await nats.connect(server_url)
    edge = await _serving(nc, tokens, config_get)
    headers = _auth(service_token)
    in_flight = await _held(client, entered, headers)
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


async def test_an_edge_stopping_while_nats_is_away_lets_the_running_request_finish(
    tmp_path: Path, tokens: TokenService, service_token: str
) -> None:
    """NATS gone at shutdown: nothing more can arrive and no answer could leave, so the edge does
    not drain (a drain's flush would wait out its timeout for the missing server); but the request
    being handled finishes (it may be committing), not cancelled."""
    entered, release = asyncio.Event(), asyncio.Event()
    outcome: list[str] = []

    async def config_get(_: Caller, request: ConfigGet) -> ConfigReply:
        entered.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise
        outcome.append("finished")
        return _reply(request)

    async with nats_server(tmp_path / "nats") as server:
        nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        caller = await nats.connect(server.url, max_reconnect_attempts=0)
        edge = await _serving(nc, tokens, config_get)
        headers = _auth(service_token)
        asked = await _held(caller, entered, headers)
        await server.stop()

        async def disconnected() -> bool:
            return not nc.is_connected

        await eventually(disconnected, timeout=20, what="the client noticing the server gone")
        stopping = asyncio.ensure_future(edge.stop(grace_s=30))
        try:
            done, _ = await asyncio.wait({stopping}, timeout=0.5)
            assert not done, "stop returned while a request was still being handled"
            release.set()
            await asyncio.wait_for(stopping, 10)  # a bound, not a speed claim (grace is 30 s)
        finally:
            release.set()
            asked.cancel()
            for conn in (nc, caller):
                with contextlib.suppress(Exception):  # the server is gone: not under test
                    await conn.close()
    assert outcome == ["finished"]


async def test_a_stop_is_bounded_by_its_grace(
    server_url: str, client: Client, tokens: TokenService, service_token: str
) -> None:
    """A request that never ends does not hold the shutdown: after ``grace_s`` it is cancelled."""
    entered = asyncio.Event()
    outcome: list[str] = []

    async def config_get(_: Caller, request: ConfigGet) -> ConfigReply:
        entered.set()
        try:
            await asyncio.Event().wait()  # never set
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise
        return _reply(request)

    nc = await nats.connect(server_url)
    edge = await _serving(nc, tokens, config_get)
    headers = _auth(service_token)
    asked = await _held(client, entered, headers)
    try:
        await asyncio.wait_for(edge.stop(grace_s=0.5), 20)  # a bound on the grace, not a speed claim

        async def cancelled() -> bool:
            return outcome == ["cancelled"]

        await eventually(cancelled, timeout=10, what="the endless request cancelled")
    finally:
        asked.cancel()
        await nc.close()


async def test_odd_messages_get_an_answer_or_none_and_the_edge_keeps_serving(
    client: Client, tokens: TokenService, service_token: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No headers at all: UNAUTHENTICATED. A publish without a reply inbox: handled, answered to
    no one. A failing observer (a metric): logged, the caller still gets its reply."""
    handled: list[str] = []

    async def config_get(_: Caller, request: ConfigGet) -> ConfigReply:
        handled.append(str(request.agent_config_id))
        return _reply(request)

    def broken_metric(reply: ConfigReply, seconds: float) -> None:
        raise RuntimeError("metric backend gone")

    edge = await _serving(client, tokens, config_get, observe=broken_metric)
    headers = _auth(service_token)
    try:
        anonymous = await client.request(CONFIG_GET.subject, _body(), timeout=10)
        assert json.loads(anonymous.data)["error"]["code"] == "UNAUTHENTICATED"
        await client.publish(CONFIG_GET.subject, _body(), headers=headers)

        async def published_handled() -> bool:
            return len(handled) == 1

        await eventually(published_handled, timeout=10, what="the publish handled")
        answered = await client.request(CONFIG_GET.subject, _body(), timeout=10, headers=headers)
    finally:
        await edge.stop()
    assert json.loads(answered.data)["version"] == 1
    assert len(handled) == 2
    assert any("observer failed" in r.getMessage() for r in caplog.records)


async def test_the_consume_span_continues_the_callers_trace(
    client: Client, tokens: TokenService, service_token: str
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def config_get(_: Caller, request: ConfigGet) -> ConfigReply:
        return _reply(request)

    edge = await _serving(client, tokens, config_get, tracer_provider=provider)
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    try:
        await client.request(
            CONFIG_GET.subject,
            _body(),
            timeout=10,
            headers={**_auth(service_token), "traceparent": f"00-{trace_id}-{parent_id}-01"},
        )
        await client.request(CONFIG_GET.subject, b"{", timeout=10, headers=_auth("x"))
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

    edge = await _serving(client, tokens, config_get)
    trace_id = secrets.token_hex(16)
    headers = _auth(service_token)
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
