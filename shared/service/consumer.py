"""JetStream batch consumers: one place settles what a durable pulled.

Every stream consumer (ingest's ``session.ended``, distill's ``session.validated`` and
``save.accepted``, embed's ``memory.written`` and ``memory.purged``) is registered with
:func:`batch_consumer` and handed a :class:`Batch`. The batch owns the messages' fate so that no
handler touches ``Msg`` acks (STYLE 16):

- while it is worked on, its unsettled messages are kept from redelivery (``+WPI`` every third of
  ``ack_wait``), so a slow model call does not hand them to another worker;
- internal streams are checked for a producer signature first (``shared.security.provenance``);
- bad input is dead-lettered (``Batch.parse``, ``Batch.dead_letter``) and acked: dead-lettered on
  its first delivery, never retried;
- when the handler returns — its transactions committed — every message it left is acked;
- when it raises, the failure decides (:meth:`Batch.run`, STYLE 23):
  - an outage (Postgres, NATS, the model or vector store away) naks every unsettled message with
    the deployment's backoff, without limit: they come back when it may be over;
  - anything else is a message's own failure: a batch of several is tried again one message at a
    time, so the others take effect, and a message that fails alone is nakked with backoff until
    its ``max_deliver``-th delivery, then dead-lettered (``INTERNAL``, with the failure's kind) and
    acked — no message is redelivered without bound because of what it holds;
  the steps before an ack are idempotent (inbox rows, ``Nats-Msg-Id``, dead-letter keys), so a
  redelivery or a second try takes effect once.

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

from contracts.errors import Unavailable, VectorUnavailable
from contracts.operations import Consumer
from shared.messaging.bus import durable_config
from shared.messaging.raw_message import as_message, whole_message
from shared.messaging.wire import dependency_down
from shared.storage.deadletter import Rejection, dead_letter_all, refuse_forged

if TYPE_CHECKING:
    from shared.service.infra import Infra

__all__ = ["Batch", "BatchHandler", "batch_consumer", "consume", "describe_failure", "is_outage"]

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
        genuine = {
            id(m)
            for m in await refuse_forged(
                self._infra.signer, self._infra.db, self.msgs, consumer=self.consumer
            )
        }
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

    async def run(self, work: BatchHandler) -> bool:
        """Run ``work`` on this batch; True when it returned (what it left is the caller's to
        ack). When it raises, every message it left is settled by the kind of failure (see the
        module's docstring) and False is returned: nothing escapes to the subscriber."""
        try:
            await work(self)
        except Exception as exc:
            try:
                await self._failed(work, exc)
            except Exception:  # settling needs Postgres or NATS: redelivered after ack_wait
                log.warning("%s: settling a failed batch failed", self.consumer, exc_info=True)
                await self.close()
            return False
        return True

    async def _failed(self, work: BatchHandler, exc: Exception) -> None:
        pending = self.pending()
        if is_outage(exc):
            # No traceback: the same outage meets every batch until it ends.
            log.warning(
                "%s: %d message(s) met an outage (%s); retried after the backoff",
                self.consumer,
                len(pending),
                describe_failure(exc),
            )
            await self.retry_later()
            return
        if len(pending) > 1:
            log.warning(
                "%s: a batch of %d failed (%s); each message is tried alone",
                self.consumer,
                len(pending),
                describe_failure(exc),
                exc_info=exc,
            )
            for msg in pending:
                self._settled.add(id(msg))  # the single message's batch settles it now
                alone = Batch(self._infra, [msg], consumer=self.consumer, source=self.source)
                alone.start()
                if await alone.run(work) and not alone.handed_over:
                    await alone.finish()
            await self.close()
            return
        for msg in pending:
            reason = f"failed {msg.metadata.num_delivered} times: {describe_failure(exc)}"
            await self.retry_or_dead_letter(msg, Rejection("INTERNAL", reason), cause=exc)
        await self.close()

    async def retry_or_dead_letter(
        self, msg: Msg, rejection: Rejection, *, cause: BaseException | None = None
    ) -> None:
        """A message that failed on its own: nakked with backoff until its ``max_deliver``-th
        delivery has failed too, then dead-lettered with ``rejection`` and acked."""
        deliveries, limit = msg.metadata.num_delivered, self._infra.settings.max_deliver
        if deliveries < limit:
            log.warning(
                "%s: %s, delivery %d of %d; retried after the backoff",
                self.consumer,
                rejection.reason,
                deliveries,
                limit,
                exc_info=cause,
            )
            await self.nak(msg)
            return
        log.error(
            "%s: %s, delivery %d of %d; dead-lettered", self.consumer, rejection.reason, deliveries, limit
        )
        await self.dead_letter([(msg, rejection)])

    async def settle(self, work: BatchHandler) -> bool:
        """Run ``work`` on this batch and settle it (:meth:`run`, then ack what is left): for a
        batch :meth:`hand_over`-ed to a worker; the subscriber settles the others itself."""
        if not await self.run(work):
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
    """Run ``handler`` on ``batch`` and settle it: ack after the handler's commits; when it
    raises, settle by the kind of failure (:meth:`Batch.run`). Nothing is raised to the broker."""
    batch.start()

    async def work(each: Batch) -> None:
        if signed:
            await each.refuse_forged()
        if each.msgs:
            await handler(each)

    if await batch.run(work) and not batch.handed_over:
        try:
            await batch.finish()
        except Exception:  # NATS away: redelivered after ack_wait, and absorbed (idempotent work)
            log.warning("%s: acking a batch failed", batch.consumer, exc_info=True)


def is_outage(exc: BaseException) -> bool:
    """Whether a consumer's failure is a dependency being away — Postgres, NATS, or the model or
    vector store answering ``UNAVAILABLE`` — retried until it returns, rather than the message's own."""
    return dependency_down(exc) or isinstance(exc, (Unavailable, VectorUnavailable))


def describe_failure(exc: BaseException) -> str:
    """The kinds of ``exc`` and its causes (``DBAPIError <- CharacterNotInRepertoireError
    (SQLSTATE 22021)``) for logs and dead letters — never their messages, which can quote the
    statement's parameters, i.e. memory text."""
    kinds: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(kinds) < 4:
        kind = type(seen).__name__
        if isinstance(getattr(seen, "sqlstate", None), str):
            kind += f" (SQLSTATE {seen.sqlstate})"  # type: ignore[attr-defined]
        kinds.append(kind)
        seen = getattr(seen, "orig", None) or seen.__cause__ or seen.__context__
    return " <- ".join(kinds)


def batch_consumer(
    router: NatsRouter, infra: Infra, consumer: Consumer
) -> Callable[[BatchHandler], BatchHandler]:
    """Register the decorated handler as ``consumer`` (a row of the operation table: its durable,
    stream, batch, signing and dead-letter source), settled by :func:`consume`.

    ``batch_size`` messages are pulled at once, waiting at most ``timeout_s`` for company (latency
    at low load); ``batched=False`` hands them to the handler one at a time. ``signed``: the
    subject is internal, and messages without a producer signature are dead-lettered first.
    Manual acks, redelivered ``ack_wait`` after a crash, outages retried without limit
    (``shared.messaging.bus.durable_config``)."""
    durable, source = consumer.durable, consumer.dead_letter_source

    def register(handler: BatchHandler) -> BatchHandler:
        subscriber = router.subscriber(
            consumer.stream.subject,
            stream=JStream(consumer.stream.jetstream, declare=False),
            durable=durable,
            inbox_prefix=infra.inbox_prefix,
            pull_sub=PullSub(
                batch_size=consumer.batch_size, timeout=consumer.timeout_s, batch=consumer.batched
            ),
            ack_policy=AckPolicy.MANUAL,
            config=durable_config(infra.settings.ack_wait_s),
            title=consumer.title,
            description=consumer.summary,
        )

        def run(raw: Sequence[Msg]) -> Awaitable[None]:
            return consume(
                Batch(infra, raw, consumer=durable, source=source), handler, signed=consumer.signed
            )

        if consumer.batched:

            async def on_batch(msg: Annotated[NatsBatchMessage, Context("message")]) -> None:
                await run(msg.raw_message)

            subscriber(on_batch)
        else:

            async def on_message(body: object) -> None:
                await run([as_message(body).raw_message])

            subscriber(on_message, decoder=whole_message)
        return handler

    return register
