"""JetStream batch consumers: one place settles what a durable pulled.

Every stream consumer (ingest's ``session.ended``, distill's ``session.validated`` and
``save.accepted``, embed's ``memory.written`` and ``memory.purged``) is registered with
:func:`batch_consumer` and handed a :class:`Batch`. The batch owns the messages' fate so that no
handler touches ``Msg`` acks (STYLE 16):

- while it is worked on, its unsettled messages are kept from redelivery (``+WPI`` every third of
  ``ack_wait``), so a slow model call does not hand them to another worker;
- internal streams are checked for a producer signature first (``shared.provenance``);
- bad input is dead-lettered (``Batch.parse``, ``Batch.dead_letter``) and acked: dead-lettered on
  its first delivery, never retried;
- when the handler returns — its transactions committed — every message it left is acked;
- when it raises (Postgres or NATS away), every message not yet settled is nakked with the
  deployment's backoff and comes back later; the steps before an ack are idempotent (inbox rows,
  ``Nats-Msg-Id``, dead-letter keys), so a redelivery takes effect once.

The batch keeps its own record of what it settled: nats-py's flag is private (``Msg._ackd``) and
counts a nak as "acked" too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Annotated, TypeVar

from faststream import AckPolicy, Context
from faststream.nats import JStream, NatsRouter, PullSub
from faststream.nats.message import NatsBatchMessage
from nats.aio.msg import Msg
from pydantic import BaseModel, ValidationError

from contracts.operations import stream_by_subject
from shared.bus import durable_config
from shared.deadletter import Rejection, dead_letter_all
from shared.provenance import refuse_forged
from shared.raw_message import as_message, whole_message

if TYPE_CHECKING:
    from shared.infra import Infra

__all__ = ["Batch", "BatchHandler", "batch_consumer", "consume"]

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


class Batch:
    """Messages pulled together from one durable, and which of them are settled.

    ``msgs`` are the messages the handler works on (forged ones already refused). A handler acks
    early only what it will not touch again (:meth:`ack`), naks one message with backoff
    (:meth:`nak`), dead-letters (:meth:`dead_letter`); everything else is settled for it.
    """

    def __init__(self, infra: Infra, msgs: Sequence[Msg], *, consumer: str, source: str) -> None:
        self._infra = infra
        #: The durable's name: it keys the dead letters (``<consumer>:dlq``), so each is written once.
        self.consumer = consumer
        #: The dead letters' source: ``engram.dlq.<source>``, audited as ``<source>.rejected``.
        self.source = source
        self.msgs = list(msgs)
        self._all = list(msgs)
        self._settled: set[int] = set()
        self._handed_over = False
        self._beat: asyncio.Task[None] | None = None

    # -- settling ---------------------------------------------------------------------------------

    def pending(self) -> list[Msg]:
        """The messages nobody has acked, nakked or dead-lettered yet."""
        return [m for m in self._all if id(m) not in self._settled]

    async def ack(self, msgs: Iterable[Msg]) -> None:
        """Ack each of ``msgs`` not settled yet: only after what it caused has committed."""
        for m in msgs:
            if id(m) not in self._settled:
                await m.ack()
                self._settled.add(id(m))

    async def nak(self, msg: Msg, *, delay: float | None = None) -> None:
        """Have ``msg`` redelivered after ``delay`` (default: the backoff for its deliveries)."""
        if id(msg) in self._settled:
            return
        await msg.nak(delay=self._backoff(msg) if delay is None else delay)
        self._settled.add(id(msg))

    async def dead_letter(self, rejected: Sequence[tuple[Msg, Rejection]], *, ack: bool = True) -> None:
        """Dead-letter each message with its rejection in one transaction, then ack them — or,
        with ``ack=False``, leave their ack to the end of the batch (after a reply, say)."""
        await dead_letter_all(self._infra.db, rejected, consumer=self.consumer, source=self.source)
        done = {id(m) for m, _ in rejected}
        self.msgs = [m for m in self.msgs if id(m) not in done]
        if ack:
            await self.ack(m for m, _ in rejected)

    async def parse(self, model: type[M], *, what: str) -> list[tuple[Msg, M]]:
        """Each message of ``msgs`` read as ``model``; the unreadable ones are dead-lettered
        (``INVALID_REQUEST``, system organization: nothing in them can be believed)."""
        parsed: list[tuple[Msg, M]] = []
        unreadable: list[tuple[Msg, Rejection]] = []
        for msg in self.msgs:
            try:
                parsed.append((msg, model.model_validate_json(msg.data)))
            except ValidationError as exc:
                reason = f"unreadable {what}: {exc.error_count()} errors"
                unreadable.append((msg, Rejection("INVALID_REQUEST", reason)))
        if unreadable:
            log.warning("%s: dead-lettered %d unreadable %s", self.consumer, len(unreadable), what)
            await self.dead_letter(unreadable)
        return parsed

    async def refuse_forged(self) -> None:
        """Dead-letter and ack what no Engram service signed; ``msgs`` keeps the rest."""
        genuine = {id(m) for m in await refuse_forged(self._infra, self.msgs, consumer=self.consumer)}
        forged = [m for m in self.msgs if id(m) not in genuine]
        self.msgs = [m for m in self.msgs if id(m) in genuine]
        await self.ack(forged)

    async def retry_later(self) -> None:
        """Nak every unsettled message with backoff (an outage: they come back when it may be
        over). A nak that cannot be sent is left to ``ack_wait``'s redelivery."""
        for m in self.pending():
            try:
                await self.nak(m)
            except Exception:
                self._settled.add(id(m))
                log.debug("%s: nak failed; redelivered after ack_wait", self.consumer, exc_info=True)
        await self.close()

    async def settle(self, work: Awaitable[object]) -> bool:
        """Run ``work``; then ack what is left, or — if it raised — retry it later. For a batch
        :meth:`hand_over`-ed to a worker; the subscriber settles the others itself."""
        try:
            await work
        except Exception:
            log.warning("%s: %d messages failed; retried later", self.consumer, len(self._all), exc_info=True)
            await self.retry_later()
            return False
        try:
            await self.finish()
        except Exception:  # NATS away: redelivered after ack_wait, and absorbed (idempotent work)
            log.warning("%s: acking a batch failed", self.consumer, exc_info=True)
            return False
        return True

    async def finish(self) -> None:
        """Ack every message still unsettled (the work for them has committed) and stop the
        heartbeat."""
        try:
            await self.ack(self.pending())
        finally:
            await self.close()

    @property
    def handed_over(self) -> bool:
        return self._handed_over

    def hand_over(self) -> Batch:
        """Settling this batch is now the caller's (:meth:`settle`), after the subscriber returns
        (embed's pipeline embeds batch N while the subscriber loads N+1). The heartbeat goes on."""
        self._handed_over = True
        return self

    # -- the heartbeat ---------------------------------------------------------------------------

    def start(self) -> None:
        """Keep the unsettled messages from redelivery until the batch is settled or closed."""
        if self._beat is None:
            self._beat = asyncio.create_task(self._keep_alive(), name=f"{self.consumer}-heartbeat")

    async def close(self) -> None:
        """Stop the heartbeat (what is still unsettled is redelivered after ``ack_wait``)."""
        task, self._beat = self._beat, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _keep_alive(self) -> None:
        interval = self._infra.settings.ack_wait_s / 3
        while True:
            await asyncio.sleep(interval)
            for m in self.pending():
                with contextlib.suppress(Exception):  # NATS away: redelivery is the fallback
                    await m.in_progress()

    def _backoff(self, msg: Msg) -> float:
        return self._infra.backoff(msg.metadata.num_delivered)


#: What a consumer does with a batch: take effect (committed) for ``batch.msgs`` and return, or
#: raise to have whatever it has not settled redelivered with backoff.
BatchHandler = Callable[[Batch], Awaitable[None]]


async def consume(batch: Batch, handler: BatchHandler, *, signed: bool = False) -> None:
    """Run ``handler`` on ``batch`` and settle it: ack after the handler's commits, nak the
    unsettled with backoff when it raises (re-raised, so the broker logs it)."""
    batch.start()
    try:
        if signed:
            await batch.refuse_forged()
        if batch.msgs:
            await handler(batch)
    except Exception:
        await batch.retry_later()
        raise
    if not batch.handed_over:
        await batch.finish()


def batch_consumer(
    router: NatsRouter,
    infra: Infra,
    subject: str,
    *,
    durable: str,
    source: str,
    batch_size: int,
    timeout: float,
    title: str,
    signed: bool = False,
    batched: bool = True,
) -> Callable[[BatchHandler], BatchHandler]:
    """Register the decorated handler as the pull consumer ``durable`` of ``subject`` (on the
    JetStream stream the operation table names), settled by :func:`consume`.

    ``batch_size`` messages are pulled at once, waiting at most ``timeout`` for company (latency
    at low load); ``batched=False`` hands them to the handler one at a time. ``signed``: the
    subject is internal, and messages without a producer signature are dead-lettered first.
    ``title`` and the handler's docstring document it (AsyncAPI). Manual acks, redelivered ``ack_wait``
    after a crash, outages retried without limit (``shared.bus.durable_config``)."""

    def register(handler: BatchHandler) -> BatchHandler:
        subscriber = router.subscriber(
            subject,
            stream=JStream(stream_by_subject(subject).jetstream, declare=False),
            durable=durable,
            inbox_prefix=infra.inbox_prefix,
            pull_sub=PullSub(batch_size=batch_size, timeout=timeout, batch=batched),
            ack_policy=AckPolicy.MANUAL,
            config=durable_config(infra.settings.ack_wait_s),
            title=title,
            description=handler.__doc__,
        )

        def run(raw: Sequence[Msg]) -> Awaitable[None]:
            return consume(Batch(infra, raw, consumer=durable, source=source), handler, signed=signed)

        if batched:

            async def on_batch(msg: Annotated[NatsBatchMessage, Context("message")]) -> None:
                await run(msg.raw_message)

            subscriber(on_batch)
        else:

            async def on_message(body: object) -> None:
                await run([as_message(body).raw_message])

            subscriber(on_message, decoder=whole_message)
        return handler

    return register
