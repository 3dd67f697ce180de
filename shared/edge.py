"""The request-reply edge: every operation of the table (``contracts.operations``) is served here.

Per request: verify the token → parse the operation's request model → :func:`shared.access.authorize`
→ ``handler(caller, request) -> reply`` → the reply's JSON, or any failure as the SPEC 9 envelope
(a bad request never crashes a service). Authentication comes before parsing, so an anonymous
caller learns nothing about the schema. Every answer is counted by operation and code
(``engram_requests_total``) and timed, and FastStream's consume span is annotated with the
messaging and GenAI memory attributes (ids only, never memory text).

A service's router is a table lookup: :func:`serve_group` takes one :func:`route` per operation of
the service's queue group and refuses to start with one missing or foreign, so the table stays
the one place an operation is declared.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from faststream.nats import NatsRouter
from opentelemetry import trace
from pydantic import BaseModel

from contracts.operations import OPERATIONS, Operation
from shared.access import Caller, authorize
from shared.auth import TokenService, bearer_from_headers
from shared.metrics import REQUEST_SECONDS, REQUESTS
from shared.raw_message import as_message, whole_message
from shared.telemetry import annotate_consumer, annotate_memory_operation
from shared.wire import error_reply, parse_model

__all__ = ["Handler", "Route", "answer", "route", "serve", "serve_group"]

Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)

#: What an operation's handler is: the authorized caller and the parsed request in, a reply out.
Handler = Callable[[Caller, Req], Awaitable[Rep]]
#: Told each successful reply and its seconds (e.g. recall's latency per strategy that ran).
Observer = Callable[[Rep, float], None]


@dataclass(frozen=True)
class Route(Generic[Req, Rep]):
    """One operation and its handler (typed together: mypy refuses another operation's handler)."""

    op: Operation[Req, Rep]
    handler: Handler[Req, Rep]
    observe: Observer[Rep] | None = None


def route(
    op: Operation[Req, Rep], handler: Handler[Req, Rep], *, observe: Observer[Rep] | None = None
) -> Route[Req, Rep]:
    return Route(op, handler, observe)


def serve_group(router: NatsRouter, tokens: TokenService, group: str, routes: list[Route[Any, Any]]) -> None:
    """Serve every operation of queue group ``group``, each by its route: all of them, once."""
    expected = {op.name for op in OPERATIONS if op.queue_group == group}
    given = [r.op.name for r in routes]
    if sorted(given) != sorted(expected):
        raise RuntimeError(f"{group} serves {sorted(given)}; the operation table says {sorted(expected)}")
    for r in routes:
        serve(router, tokens, r.op, r.handler, observe=r.observe)


def serve(
    router: NatsRouter,
    tokens: TokenService,
    op: Operation[Req, Rep],
    handler: Handler[Req, Rep],
    *,
    observe: Observer[Rep] | None = None,
) -> None:
    """Subscribe ``handler`` to ``op``'s subject in ``op``'s queue group (instances share load)."""

    @router.subscriber(
        op.subject,
        queue=op.queue_group,
        title=f"{op.queue_group}:{op.name}",
        description=op.summary,
        decoder=whole_message,
    )
    async def on_request(body: object) -> bytes:
        msg = as_message(body)
        return await answer(tokens, op, handler, msg.headers, msg.body, observe=observe)


async def answer(
    tokens: TokenService,
    op: Operation[Req, Rep],
    handler: Handler[Req, Rep],
    headers: Mapping[str, str] | None,
    body: bytes,
    *,
    observe: Observer[Rep] | None = None,
) -> bytes:
    """The reply to one request of ``op``: its JSON, or the SPEC 9 envelope's."""
    started = time.perf_counter()
    span = trace.get_current_span()
    annotate_consumer(span, op.subject, op.queue_group)
    try:
        credential = tokens.verify(bearer_from_headers(headers))
        request = parse_model(op.request, body)
        annotate_memory_operation(span, op.subject, request)
        caller, request = authorize(credential, op.permission, request)
        reply = await handler(caller, request)
        # A reply omits what it did not set when the operation says so (recall's formats).
        data = reply.model_dump_json(exclude_unset=op.sparse_reply).encode()
    except Exception as exc:
        envelope = error_reply(exc)
        _count(op, started, str(envelope.get("error", {}).get("code", "INTERNAL")))
        return _json(envelope)
    seconds = _count(op, started, "OK")
    if observe is not None:
        observe(reply, seconds)
    return data


def _count(op: Operation[Any, Any], started: float, code: str) -> float:
    seconds = time.perf_counter() - started
    REQUESTS.labels(op.subject, code).inc()
    REQUEST_SECONDS.labels(op.subject).observe(seconds)
    return seconds


def _json(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()
