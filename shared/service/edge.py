"""The request-reply edge: every operation of the table (``contracts.operations``) is served here.

Per request: verify the token → charge the organization's and token's budget (:mod:`shared.runtime.quotas`)
→ parse the operation's request model → :func:`shared.security.access.authorize` → ``handler(caller,
request) -> reply`` → the reply's JSON, or any failure as the SPEC 9 envelope (a bad request never
crashes a service). Authentication comes before parsing, so an anonymous
caller learns nothing about the schema. Every answer is counted by operation and code
(``engram_requests_total``) and timed, and its consume span carries the messaging and GenAI
memory attributes (ids only, never memory text).

A process has one :class:`Edge` (``Infra.edge``). A service registers its operations with
:meth:`Edge.serve_group`, one :func:`route` per operation of its queue group, and the edge refuses
one missing or foreign, so the table stays the one place an operation is declared.

The edge serves on nats-py directly, one queue subscription per operation, not through FastStream:
FastStream's per-message chain cost ~0.2 ms a request here, most of what kept ``last_k`` above five
times the bare round trip (docs/adr/0003-request-reply-edge.md). Other instances of the queue group
share the load. The streams' consumers stay on FastStream.

Fair share between organizations (docs/adr/0100-fair-share.md): each operation admits its requests
in arrival order — token verified, budget charged (:mod:`shared.runtime.quotas`), a refusal answered at
once, before it waits behind anything — and queues what it admitted per organization. ``workers``
tasks answer those queues round-robin, and no organization holds more than half of them at once
(at least one), so one organization's backlog delays another's request by at most the requests
already running, never by its length. An organization with ``org_queue`` requests already waiting
for one operation is answered ``RATE_LIMITED`` (retry after 1 s) instead of queued behind them: a
flood without a budget is refused, not left to time out, and cannot fill the process's queue.
One organization's requests are answered one at a time, in arrival order (its share, with the
default two workers) — or, for an operation whose row asks for more workers
(``Operation.concurrency``: ``memory.save``, docs/adr/0101-write-path-throughput.md), up to half
of them at once.

A request that has waited here longer than its caller waits (the operation's ``timeout_s``, else
the edge's ``default_wait_s``) is left unanswered, not worked on: its caller has given up, and
NATS refuses a reply once the responder's permission for it has expired. Without this, a backlog
built by a stall (a NATS node lost, a CPU-starved host) is worked off request by request after
every caller has gone, so no caller is answered again while requests keep arriving as fast as
they are served (docs/adr/0079-edge-deadline.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from uuid import UUID

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Tracer
from pydantic import BaseModel

from contracts.errors import RateLimited
from contracts.operations import OPERATIONS, Operation
from shared.messaging.wire import error_reply, parse_model
from shared.observability.metrics import REQUEST_SECONDS, REQUESTS, REQUESTS_LEFT
from shared.observability.telemetry import annotate_consumer, annotate_memory_operation, extract_context
from shared.runtime.background import cancel
from shared.runtime.quotas import Quotas
from shared.security.access import AgentConfigs, Caller, authorize
from shared.security.auth import Credential, TokenService, TokenVerifier, bearer_from_headers

__all__ = [
    "DEFAULT_ORG_QUEUE",
    "DEFAULT_WAIT_S",
    "DEFAULT_WORKERS",
    "Edge",
    "FairQueue",
    "Handler",
    "Observer",
    "Route",
    "admit",
    "answer",
    "route",
]

log = logging.getLogger(__name__)

_TRACEPARENT = "traceparent"
#: How long a caller waits for an operation that names no ``timeout_s``, unless told otherwise.
DEFAULT_WAIT_S = 10.0
#: Requests left for want of a caller are logged at most this often (with how many).
_LEFT_LOG_EVERY_S = 10.0
#: Workers answering one operation's admitted requests (an organization holds at most half).
DEFAULT_WORKERS = 2
#: Admitted requests one organization may have waiting for one operation before it is refused.
DEFAULT_ORG_QUEUE = 64

Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)
T = TypeVar("T")

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


@dataclass(frozen=True)
class _Admitted:
    arrived: float
    msg: Msg
    credential: Credential


class FairQueue(Generic[T]):
    """Items queued per key (an organization), taken round-robin over the keys, at most ``share``
    of one key's items taken and not yet :meth:`done` at once, at most ``depth`` of one key's
    waiting. A key's items are taken in the order they were put."""

    def __init__(self, *, share: int, depth: int) -> None:
        self._share = share
        self._depth = depth
        self._waiting: dict[UUID, deque[T]] = {}
        self._taken: Counter[UUID] = Counter()
        #: The keys with something waiting, the next one's turn first.
        self._turns: deque[UUID] = deque()
        self._changed = asyncio.Event()
        self._unfinished = 0
        self._finished = asyncio.Event()
        self._finished.set()

    def qsize(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def put(self, key: UUID, item: T) -> bool:
        """Queue ``item`` under ``key``; False (not queued) when ``depth`` of its items wait."""
        waiting = self._waiting.get(key)
        if waiting is None:
            waiting = self._waiting[key] = deque()
            self._turns.append(key)
        elif len(waiting) >= self._depth:
            return False
        waiting.append(item)
        self._unfinished += 1
        self._finished.clear()
        self._changed.set()
        return True

    async def get(self) -> tuple[UUID, T]:
        """The next item: the first key in turn whose share is not taken; that key's turn moves
        to the back."""
        while True:
            for _ in range(len(self._turns)):
                key = self._turns[0]
                self._turns.rotate(-1)
                if self._taken[key] >= self._share:
                    continue
                waiting = self._waiting[key]
                item = waiting.popleft()
                if not waiting:
                    del self._waiting[key]
                    self._turns.remove(key)
                self._taken[key] += 1
                return key, item
            self._changed.clear()
            await self._changed.wait()

    def done(self, key: UUID) -> None:
        """An item of ``key`` taken by :meth:`get` is finished (its share is free again)."""
        self._taken[key] -= 1
        if self._taken[key] <= 0:
            del self._taken[key]
        self._unfinished -= 1
        if self._unfinished <= 0:
            self._finished.set()
        self._changed.set()

    async def join(self) -> None:
        """Until every item put is done."""
        await self._finished.wait()


class Edge:
    """This process's request-reply operations, served on a NATS connection once started."""

    def __init__(
        self,
        tokens: TokenService | TokenVerifier,
        *,
        agent_configs: AgentConfigs | None = None,
        default_wait_s: float = DEFAULT_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
        quotas: Quotas | None = None,
        workers: int = DEFAULT_WORKERS,
        org_queue: int = DEFAULT_ORG_QUEUE,
    ) -> None:
        """``agent_configs``: whose each agent config is, for the operations that check it
        (``Operation.agent_config``); ``default_wait_s``: how long callers wait for an operation
        that names no timeout (what a request may wait here before it is left); ``clock``:
        seconds, monotonic (tests); ``quotas``: the budgets a request spends once authorized
        (none: not limited); ``workers``: how many requests of one operation are answered at
        once (an organization holds at most half, at least one); ``org_queue``: how many of one
        organization's requests may wait for one operation before more are refused."""
        if workers < 1 or org_queue < 1:
            raise ValueError("an edge needs at least one worker and room for one request")
        self._workers_per_op = workers
        self._org_queue = org_queue
        self._tokens = TokenVerifier.of(tokens)
        self._agent_configs = agent_configs
        self._quotas = quotas
        self._default_wait_s = default_wait_s
        self._clock = clock
        self._routes: dict[str, Route[Any, Any]] = {}
        self._subscriptions: list[Subscription] = []
        #: Per operation, what its subscription delivered and is not admitted yet (with the time
        #: it arrived), what was admitted and no worker has taken yet (per organization), and the
        #: tasks admitting and answering them.
        self._queues: list[asyncio.Queue[tuple[float, Msg]]] = []
        self._fair: list[FairQueue[_Admitted]] = []
        self._workers: list[asyncio.Task[None]] = []
        self._tracer: Tracer | None = None
        self._nc: Client | None = None
        #: The tasks handling a request now, and whether there is none (what a stop waits for).
        self._running: set[asyncio.Task[Any]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        #: Set when a stop gives up draining: requests not yet started are left unanswered.
        self._stopping = False

    @property
    def routes(self) -> list[Route[Any, Any]]:
        """What is served, in registration order."""
        return list(self._routes.values())

    def serve_group(self, group: str, routes: list[Route[Any, Any]]) -> None:
        """Serve every operation of queue group ``group``, each by its route: all of them, once."""
        expected = {op.name for op in OPERATIONS if op.queue_group == group}
        given = [r.op.name for r in routes]
        if sorted(given) != sorted(expected):
            raise RuntimeError(f"{group} serves {sorted(given)}; the operation table says {sorted(expected)}")
        for r in routes:
            self.serve(r.op, r.handler, observe=r.observe)

    def serve(
        self, op: Operation[Req, Rep], handler: Handler[Req, Rep], *, observe: Observer[Rep] | None = None
    ) -> None:
        """Serve ``op`` by ``handler`` (in ``op``'s queue group, once :meth:`start` subscribes)."""
        if op.subject in self._routes:
            raise RuntimeError(f"{op.name} is served twice")
        if self._subscriptions:
            raise RuntimeError(f"{op.name} added after the edge started")
        if op.agent_config is not None and self._agent_configs is None:
            raise RuntimeError(
                f"{op.name} checks its agent config's organization: give the edge agent_configs"
            )
        self._routes[op.subject] = Route(op, handler, observe)

    async def start(self, nc: Client, *, tracer_provider: TracerProvider | None = None) -> None:
        """Subscribe every operation in its queue group on ``nc``. With ``tracer_provider`` each
        request gets a consume span (parented on the caller's ``traceparent``); without one, the
        caller's trace context is only carried through, as the streams' consumers do."""
        self._nc = nc
        if tracer_provider is not None:
            self._tracer = tracer_provider.get_tracer("engram.edge")
        for subject, r in self._routes.items():
            # An operation whose row asks for more (``Operation.concurrency``: ``memory.save``,
            # whose work is mostly waiting on JetStream) gets that many workers.
            workers = max(self._workers_per_op, r.op.concurrency)
            share = max(1, workers // 2)
            # The subscription's callback only notes the arrival: how long a request then waits
            # behind others is known, and one that outwaited its caller is left (``_work``).
            queue: asyncio.Queue[tuple[float, Msg]] = asyncio.Queue()
            fair: FairQueue[_Admitted] = FairQueue(share=share, depth=self._org_queue)

            async def on_request(msg: Msg, queue: asyncio.Queue[tuple[float, Msg]] = queue) -> None:
                queue.put_nowait((self._clock(), msg))

            self._queues.append(queue)
            self._fair.append(fair)
            self._workers.append(
                asyncio.create_task(self._admit(nc, r, queue, fair), name=f"edge {r.op.name} admission")
            )
            self._workers += [
                asyncio.create_task(self._work(nc, r, fair), name=f"edge {r.op.name} {i}")
                for i in range(workers)
            ]
            self._subscriptions.append(await nc.subscribe(subject, queue=r.op.queue_group, cb=on_request))

    @property
    def waiting(self) -> int:
        """Requests delivered and not yet taken up (a backlog shows here first)."""
        return sum(q.qsize() for q in self._queues) + sum(f.qsize() for f in self._fair)

    async def _admit(
        self,
        nc: Client,
        r: Route[Any, Any],
        queue: asyncio.Queue[tuple[float, Msg]],
        fair: FairQueue[_Admitted],
    ) -> None:
        """Admit ``r``'s requests in arrival order: the token verified and the budget charged,
        a refusal answered at once; what is admitted waits in its organization's queue."""
        while True:
            arrived, msg = await queue.get()
            try:
                if self._stopping:  # left for its caller's timeout, as a stopped FastStream did
                    continue
                started = time.perf_counter()
                try:
                    credential = await admit(self._tokens, r.op, msg.headers, self._quotas)
                    if not fair.put(credential.org_id, _Admitted(arrived, msg, credential)):
                        raise RateLimited(
                            f"{self._org_queue} requests of this organization already wait for "
                            f"{r.op.name}; retry after 1 s",
                            {"retry_after_s": 1},
                        )
                except Exception as exc:  # refused before any other work: answered at once
                    await self._send(nc, r, msg, self._refusal(r, msg.headers, exc, started))
            except Exception:  # nothing may end the admission of an operation
                log.exception("%s: request not admitted", r.op.name)
            finally:
                queue.task_done()

    def _refusal(
        self, r: Route[Any, Any], headers: Mapping[str, str] | None, exc: Exception, started: float
    ) -> bytes:
        """The envelope refusing a request at admission, counted, and traced as :meth:`reply`
        traces an answer (a consume span of its own when there is a tracer)."""
        envelope = error_reply(exc)
        code = str(envelope.get("error", {}).get("code", "INTERNAL"))
        if self._tracer is not None:
            parent = extract_context(headers) if headers and _TRACEPARENT in headers else None
            with self._tracer.start_as_current_span(
                f"{r.op.subject} process", context=parent or Context(), kind=SpanKind.CONSUMER
            ) as span:
                annotate_consumer(span, r.op.subject, r.op.queue_group)
                span.set_attribute("error.type", code)
        _count(r.op, started, code)
        return _json(envelope)

    async def _work(self, nc: Client, r: Route[Any, Any], fair: FairQueue[_Admitted]) -> None:
        """Answer ``r``'s admitted requests, the organizations in turn; leave those whose caller
        has stopped waiting, and (once a stop gave up draining) those not started yet."""
        patience = r.op.timeout_s or self._default_wait_s
        left, logged_at = 0, -_LEFT_LOG_EVERY_S  # logged at most every few seconds, with a count
        while True:
            org, admitted = await fair.get()
            arrived, msg = admitted.arrived, admitted.msg
            try:
                now = self._clock()
                if self._stopping:  # left for its caller's timeout, as a stopped FastStream did
                    continue
                if now - arrived > patience:
                    REQUESTS_LEFT.labels(r.op.subject).inc()
                    left += 1
                    if now - logged_at >= _LEFT_LOG_EVERY_S:
                        log.warning(
                            "%s: left %d request(s) that waited here longer than their callers wait "
                            "(%.0f s); %d queued",
                            r.op.name,
                            left,
                            patience,
                            fair.qsize(),
                        )
                        left, logged_at = 0, now
                    continue
                task = asyncio.current_task()
                assert task is not None
                self._running.add(task)
                self._idle.clear()
                try:
                    await self._serve(nc, r, msg, admitted.credential)
                finally:
                    self._running.discard(task)
                    if not self._running:
                        self._idle.set()
            finally:
                fair.done(org)

    async def _serve(self, nc: Client, r: Route[Any, Any], msg: Msg, credential: Credential) -> None:
        # Nothing may escape to nats-py: its error callback would drop it without a word.
        try:
            data = await self.reply(r, msg.headers, msg.data, credential=credential)
        except Exception as exc:  # answer() maps the handler's failures; this is the edge's own
            log.exception("%s: request not handled", r.op.name)
            data = _json(error_reply(exc))
        await self._send(nc, r, msg, data)

    async def _send(self, nc: Client, r: Route[Any, Any], msg: Msg, data: bytes) -> None:
        if not msg.reply:  # a publish without a reply inbox is answered to no one
            return
        try:
            await nc.publish(msg.reply, data)
        except Exception as exc:  # e.g. a reply over the server's max_payload
            log.exception("%s: reply of %d bytes not sent", r.op.name, len(data))
            with contextlib.suppress(Exception):
                await nc.publish(msg.reply, _json(error_reply(exc)))

    async def stop(self, grace_s: float = 10.0) -> None:
        """Take no more requests and answer those already delivered, within ``grace_s``.

        Connected, each subscription is drained (the server stops delivering and hands over what
        it had sent) and what was delivered is answered in turn. With NATS away (nothing more can
        arrive, and a drain's flush would wait out its timeout for a server that is not there),
        or once ``grace_s`` is spent, requests not yet started are left to their callers'
        timeouts and those being handled are let finish (up to ``grace_s`` in all) before the
        subscriptions are cut."""
        subscriptions, self._subscriptions = self._subscriptions, []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        answered = False
        if self._nc is not None and self._nc.is_connected:
            answered = await self._drain(subscriptions, deadline)
        if not answered:
            self._stopping = True
            try:
                await asyncio.wait_for(self._idle.wait(), max(deadline - loop.time(), 0.0))
            except TimeoutError:
                log.warning("%d request(s) still running at shutdown: cancelled", len(self._running))
                for task in self._running:
                    task.cancel()
            for sub in subscriptions:
                with contextlib.suppress(Exception):  # already drained, or the connection closed
                    await sub.unsubscribe()
        workers, self._workers = self._workers, []
        for worker in workers:
            await cancel(worker)

    async def _drain(self, subscriptions: list[Subscription], deadline: float) -> bool:
        """Drain ``subscriptions`` and answer what they delivered, by ``deadline``; whether done."""
        loop = asyncio.get_running_loop()
        drains = asyncio.gather(*(sub.drain() for sub in subscriptions), return_exceptions=True)  # type: ignore[no-untyped-call]
        try:
            results = await asyncio.wait_for(drains, max(deadline - loop.time(), 0.0))
            if any(isinstance(r, BaseException) for r in results):
                return False
            await asyncio.wait_for(
                asyncio.gather(*(q.join() for q in self._queues), *(f.join() for f in self._fair)),
                max(deadline - loop.time(), 0.0),
            )
        except TimeoutError:
            log.warning("requests still queued when the shutdown's grace ran out: left unanswered")
            return False
        return True

    async def request(self, subject: str, body: bytes, headers: Mapping[str, str] | None = None) -> bytes:
        """The reply the edge would send to a request on ``subject``, without NATS (router tests:
        the same code from the token check to the encoded reply, in memory)."""
        r = self._routes.get(subject)
        if r is None:
            raise NoRespondersError
        return await self.reply(r, headers, body)

    async def reply(
        self,
        r: Route[Any, Any],
        headers: Mapping[str, str] | None,
        body: bytes,
        *,
        credential: Credential | None = None,
    ) -> bytes:
        """:func:`answer`, inside the request's consume span or, without a tracer, its caller's
        trace context (so logs and what the handler publishes stay in the caller's trace).
        ``credential``: the request was admitted already (token and budget)."""
        parent = extract_context(headers) if headers and _TRACEPARENT in headers else None
        # Made here, run (and so traced) only when awaited below.
        answered = answer(
            self._tokens,
            r.op,
            r.handler,
            headers,
            body,
            observe=r.observe,
            agent_configs=self._agent_configs,
            quotas=self._quotas,
            credential=credential,
        )
        if self._tracer is not None:
            # A request without a traceparent starts a trace of its own (an empty context).
            with self._tracer.start_as_current_span(
                f"{r.op.subject} process", context=parent or Context(), kind=SpanKind.CONSUMER
            ):
                return await answered
        if parent is None:
            return await answered
        token = otel_context.attach(parent)
        try:
            return await answered
        finally:
            otel_context.detach(token)


async def admit(
    tokens: TokenVerifier, op: Operation[Any, Any], headers: Mapping[str, str] | None, quotas: Quotas | None
) -> Credential:
    """The caller of a request of ``op``, its token verified and its budget charged: before any
    other work, so a flood over its budget costs a token check and a bucket each."""
    credential = await tokens.verify(bearer_from_headers(headers))
    if quotas is not None and quotas.enabled:
        await quotas.charge(op.quota_class, credential.org_id, credential.token_id)
    return credential


async def answer(
    tokens: TokenVerifier,
    op: Operation[Req, Rep],
    handler: Handler[Req, Rep],
    headers: Mapping[str, str] | None,
    body: bytes,
    *,
    observe: Observer[Rep] | None = None,
    agent_configs: AgentConfigs | None = None,
    quotas: Quotas | None = None,
    credential: Credential | None = None,
) -> bytes:
    """The reply to one request of ``op``: its JSON, or the SPEC 9 envelope's. ``credential``:
    the request was :func:`admit`-ted already (not verified or charged again)."""
    started = time.perf_counter()
    span = trace.get_current_span()
    annotate_consumer(span, op.subject, op.queue_group)
    try:
        if credential is None:
            credential = await admit(tokens, op, headers, quotas)
        request = parse_model(op.request, body, max_bytes=op.max_request_bytes)
        annotate_memory_operation(span, op.subject, request)
        caller, request = await authorize(credential, op, request, agent_configs)
        reply = await handler(caller, request)
        # A reply omits what it did not set when the operation says so (recall's formats).
        data = reply.model_dump_json(exclude_unset=op.sparse_reply).encode()
    except Exception as exc:
        envelope = error_reply(exc)
        code = str(envelope.get("error", {}).get("code", "INTERNAL"))
        span.set_attribute("error.type", code)
        _count(op, started, code)
        return _json(envelope)
    seconds = _count(op, started, "OK")
    if observe is not None:
        try:
            observe(reply, seconds)
        except Exception:  # a metric's failure never costs the caller its answer
            log.exception("%s: observer failed", op.name)
    return data


def _count(op: Operation[Any, Any], started: float, code: str) -> float:
    seconds = time.perf_counter() - started
    REQUESTS.labels(op.subject, code).inc()
    REQUEST_SECONDS.labels(op.subject).observe(seconds)
    return seconds


def _json(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()
