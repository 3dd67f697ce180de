"""What a request-reply costs before Engram's own work: the subscriber's plumbing and one read.

Two interleaved comparisons, each on a fresh nats-server / throwaway database:

- **subscriber**: a core-NATS echo answered by raw nats-py (the yardstick), by a FastStream
  subscriber taking the message as a ``NatsMessage`` parameter (resolved by fast_depends in a
  worker thread), by one taking it through a decoder (``shared.messaging.raw_message``, what the streams'
  single-message consumers do; the edge did until it moved onto nats-py) and by one taking the body
  only; then what the services' broker adds (FastStream's OpenTelemetry middleware where spans are
  exported, the trace propagation alone by default), what replying through the raw message instead
  of FastStream's reply publisher (``no_reply=True``) would save, and the edge itself
  (``shared.service.edge.Edge`` on nats-py: ``config.get`` answered by a constant handler, so its token
  check, parse, authorization and encoding, without a database);
- **read**: recall's ``last_k`` statement at 10k entries through an ORM session (how recall read
  before), through SQLAlchemy Core, and compiled once and run by ``Database.fetch``
  (``shared.storage.db.compiled``, what recall does now).

    .venv/bin/python -m tests.bench.hot_path
"""

from __future__ import annotations

import argparse
import json
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import uuid4

import asyncpg
import nats
from faststream.nats import NatsBroker
from faststream.nats.annotations import NatsMessage
from nats.aio.msg import Msg
from sqlalchemy import select

from contracts.common import Principal
from contracts.config import MemoryConfig
from contracts.operations import CONFIG_GET
from contracts.requests import ConfigGet, ConfigReply
from shared.messaging.raw_message import as_message, whole_message
from shared.observability.telemetry import broker_middleware, nats_telemetry_middleware
from shared.runtime.time import utcnow
from shared.security.access import Caller
from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.service.edge import Edge
from shared.storage.db.engine import Database
from shared.storage.db.models import ENTRIES
from shared.storage.entries import recall as queries
from tests.bench import measure
from tests.bench.recall import _copy, _dsn, _rows

Call = Callable[[], Awaitable[Any]]


async def interleaved(calls: dict[str, Call], rounds: int) -> dict[str, dict[str, float]]:
    """Each call once per round, in turn (a busy machine slows them alike), after a warm-up."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for round_no in range(rounds + 50):
        for name, call in calls.items():
            ms, _ = await measure.time_each([None], lambda _, call=call: call(), warmup=0)
            if round_no >= 50:
                samples[name].extend(ms)
    return {name: measure.summary(ms) for name, ms in samples.items()}


def _serve_echoes(broker: NatsBroker, prefix: str) -> None:
    """Echo responders on ``broker``: ``prefix.decoded`` as the edge answered through FastStream
    (the decoder, the reply returned to FastStream) and ``prefix.respond`` replying through the raw
    message."""

    @broker.subscriber(f"{prefix}.decoded", decoder=whole_message)
    async def decoded(body: object) -> bytes:
        return bytes(as_message(body).body)

    @broker.subscriber(f"{prefix}.respond", decoder=whole_message, no_reply=True)
    async def respond(body: object) -> None:
        msg = as_message(body)
        await msg.raw_message.respond(bytes(msg.body))


def _constant_edge() -> tuple[Edge, str]:
    """An edge answering ``config.get`` with a constant reply, and a token it accepts."""
    tokens = TokenService({"bench": "b" * 48})
    token = tokens.mint(
        org_id=uuid4(), principal=Principal(kind="service", id="bench"), permissions=ALL_PERMISSIONS
    )

    async def config_get(_: Caller, request: ConfigGet) -> ConfigReply:
        return ConfigReply(agent_config_id=request.agent_config_id, version=1, config=MemoryConfig())

    edge = Edge(tokens)
    edge.serve(CONFIG_GET, config_get)
    return edge, token


def _echo_broker(url: str, prefix: str, middleware: Any) -> NatsBroker:
    broker = NatsBroker(
        url, middlewares=[middleware], log_level=logging.DEBUG, logger=logging.getLogger("bench")
    )
    _serve_echoes(broker, prefix)
    return broker


async def subscribers(rounds: int) -> dict[str, dict[str, float]]:
    async with measure.running_stack() as stack:
        broker = NatsBroker(stack.nats.url, log_level=logging.DEBUG, logger=logging.getLogger("bench"))

        @broker.subscriber("bench.annotated")
        async def annotated(msg: NatsMessage) -> bytes:
            return bytes(msg.body)

        @broker.subscriber("bench.body")
        async def body_only(body: bytes) -> bytes:
            return body

        # As services.runtime builds the services' broker: FastStream's telemetry middleware
        # where spans are exported, the trace propagation alone by default.
        traced = _echo_broker(stack.nats.url, "bench.traced", nats_telemetry_middleware(None))
        propagating = _echo_broker(stack.nats.url, "bench.propagating", broker_middleware(None))
        _serve_echoes(broker, "bench.plain")

        await broker.start()
        await traced.start()
        await propagating.start()
        responder, client = await nats.connect(stack.nats.url), await nats.connect(stack.nats.url)

        async def echo(msg: Msg) -> None:
            await msg.respond(msg.data)

        await responder.subscribe("bench.echo", cb=echo)
        edge, token = _constant_edge()
        await edge.start(responder)
        edge_request = json.dumps({"agent_config_id": str(uuid4())}).encode()
        edge_headers = {"Authorization": f"Bearer {token}"}
        # The server has every subscription before the first request (else: no responders).
        await responder.flush()
        await broker.connection.flush()
        await traced.connection.flush()
        await propagating.connection.flush()
        payload = b"x" * 256
        try:
            calls: dict[str, Call] = {
                label: lambda subject=subject: client.request(subject, payload, timeout=5)
                for label, subject in (
                    ("raw nats-py responder (yardstick)", "bench.echo"),
                    ("FastStream, NatsMessage parameter", "bench.annotated"),
                    ("FastStream, whole_message decoder (the edge before)", "bench.plain.decoded"),
                    ("FastStream, body only", "bench.body"),
                    ("FastStream, decoder, reply by the raw message", "bench.plain.respond"),
                    (
                        "+ telemetry middleware, decoder (services exporting spans)",
                        "bench.traced.decoded",
                    ),
                    ("+ telemetry middleware, reply by the raw message", "bench.traced.respond"),
                    (
                        "+ trace propagation only, decoder (services by default)",
                        "bench.propagating.decoded",
                    ),
                    ("+ trace propagation only, reply by the raw message", "bench.propagating.respond"),
                )
            }
            calls["the edge on nats-py: config.get, constant handler"] = lambda: client.request(
                CONFIG_GET.subject, edge_request, timeout=5, headers=edge_headers
            )
            return await interleaved(calls, rounds)
        finally:
            await client.close()
            await responder.close()
            await broker.stop()
            await traced.stop()
            await propagating.stop()


async def reads(rounds: int, entries: int) -> dict[str, dict[str, float]]:
    async with measure.running_stack() as stack:
        url = stack.settings.database_url
        org, agent = uuid4(), uuid4()
        conn = await asyncpg.connect(_dsn(url))
        await _copy(conn, _rows(random.Random(1), org, agent, entries, 0, utcnow(), 0.9))
        await conn.execute("ANALYZE memory_entries")
        await conn.close()
        db = Database(url, pool_size=4)
        scope = queries.Scope(org_id=org, agent_config_id=agent, owner_keys=("",), now=utcnow())
        order = (ENTRIES.c.pinned.desc(), ENTRIES.c.created_at.desc(), ENTRIES.c.id)
        autocommit = db.engine.execution_options(isolation_level="AUTOCOMMIT")

        async def orm() -> Any:
            async with db.read() as session:
                stmt = select(*queries._COLUMNS).where(scope.predicate()).order_by(*order).limit(10)
                return (await session.execute(stmt)).all()

        async def core() -> Any:
            async with autocommit.connect() as c:
                stmt = select(*queries._COLUMNS).where(scope.predicate()).order_by(*order).limit(10)
                return (await c.execute(stmt)).all()

        try:
            return await interleaved(
                {
                    "ORM session, statement built per call": orm,
                    "SQLAlchemy Core, statement built per call": core,
                    "compiled template, Database.fetch (recall now)": lambda: queries.newest(db, scope, 10),
                },
                rounds,
            )
        finally:
            await db.close()


async def main(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "machine": measure.machine(),
        "load_avg_before": measure.load_average(),
        "subscriber": await subscribers(args.rounds),
        "read": await reads(args.rounds, args.entries),
        "load_avg_after": measure.load_average(),
    }


def render(results: dict[str, Any]) -> str:
    rows = ["| part | how | n | p50 ms | p99 ms |", "|---|---|---:|---:|---:|"]
    for part in ("subscriber", "read"):
        for how, s in results[part].items():
            rows.append(f"| {part} | {how} | {s['n']} | {s['p50_ms']} | {s['p99_ms']} |")
    rows.append("")
    rows.append(
        f"{results['machine']['cpus']} CPUs; 1/5/15-min load average before / after: "
        f"{results['load_avg_before']} / {results['load_avg_after']}"
    )
    return "\n".join(rows)


if __name__ == "__main__":
    parser = measure.bench_parser(__doc__, "bench-results/hot_path.json")
    parser.add_argument("--rounds", type=int, default=2_000)
    parser.add_argument("--entries", type=int, default=10_000)
    measure.run_bench(parser, main, render)
