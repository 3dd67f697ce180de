"""Transactional outbox and inbox (STYLE habit 8).

An event is written as an ``outbox`` row in the same transaction as its effect; the relay then
publishes it with ``Nats-Msg-Id = event_id`` (so JetStream drops a re-publish after a crash
between publish and delete) and deletes the row. A consumer records ``(consumer, event_id)``
in ``inbox`` in the same transaction as its effect, so a redelivered event takes effect once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar
from uuid import UUID

from nats.js import JetStreamContext
from pydantic import BaseModel
from sqlalchemy import delete, func, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import col

from shared.messaging.feed import feed_copy_subject
from shared.observability.metrics import OUTBOX_BACKLOG, OUTBOX_PUBLISHED
from shared.observability.telemetry import inject_trace_headers
from shared.runtime.background import PeriodicWorker
from shared.runtime.time import utcnow
from shared.security.provenance import MessageSigner
from shared.storage.db.engine import Database
from shared.storage.db.models import INBOX, OUTBOX, OutboxMessage

__all__ = [
    "OutboxRelay",
    "claim_inbox",
    "claim_inbox_many",
    "enqueue",
    "enqueue_many",
    "enqueue_raw",
    "first_of_each",
    "processed_of",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Set in a session's ``info`` by every enqueue: the commit hook wakes the relay only then.
_WROTE_OUTBOX = "engram.wrote_outbox"

# Built once: these run several times per message.
_OUTBOX_INSERT = insert(OUTBOX)
_INBOX_CLAIM = pg_insert(INBOX).on_conflict_do_nothing().returning(INBOX.c.event_id)


async def enqueue(session: AsyncSession, subject: str, event: BaseModel, event_id: UUID) -> None:
    """Add an event to the outbox of the current transaction."""
    await enqueue_raw(session, subject, event.model_dump_json().encode(), event_id)


async def enqueue_many(
    session: AsyncSession, events: Sequence[tuple[str, BaseModel, UUID, dict[str, str] | None]]
) -> None:
    """Add several events in one statement: ``(subject, event, event_id, trace headers)``, where
    ``None`` headers mean the current span's (a batch carries each session's own trace)."""
    if not events:
        return
    session.info[_WROTE_OUTBOX] = True
    current = inject_trace_headers({})
    now = utcnow()
    await session.execute(
        _OUTBOX_INSERT,
        [
            {
                "event_id": event_id,
                "subject": subject,
                "payload": event.model_dump_json().encode(),
                "headers": current if headers is None else headers,
                "created_at": now,
            }
            for subject, event, event_id, headers in events
        ],
    )


async def enqueue_raw(session: AsyncSession, subject: str, payload: bytes, event_id: UUID) -> None:
    session.info[_WROTE_OUTBOX] = True
    await session.execute(
        _OUTBOX_INSERT,
        {
            "event_id": event_id,
            "subject": subject,
            "payload": payload,
            "headers": inject_trace_headers({}),
            "created_at": utcnow(),
        },
    )


async def claim_inbox(session: AsyncSession, consumer: str, event_id: str) -> bool:
    """Record that ``consumer`` takes effect for ``event_id``; False if it already has.

    Concurrent claimants of the same id serialize on the primary key: the loser waits for the
    winner's transaction and then sees the conflict, so exactly one takes effect.
    """
    result = await session.execute(
        _INBOX_CLAIM, {"consumer": consumer, "event_id": event_id, "processed_at": utcnow()}
    )
    return result.first() is not None


async def claim_inbox_many(session: AsyncSession, consumer: str, event_ids: Sequence[str]) -> set[str]:
    """:func:`claim_inbox` for a batch in one statement; returns the ids this call claimed."""
    if not event_ids:
        return set()
    now = utcnow()
    result = await session.execute(
        _INBOX_CLAIM, [{"consumer": consumer, "event_id": e, "processed_at": now} for e in event_ids]
    )
    return {str(row[0]) for row in result}


def first_of_each(items: Iterable[T], key: Callable[[T], str]) -> list[T]:
    """The first item of each inbox key, in order. One event twice in a batch (a redelivery next
    to its original, a platform's retry) must take effect once; claiming both in one transaction
    would let both through, since neither sees the other's row."""
    seen: set[str] = set()
    first: list[T] = []
    for item in items:
        k = key(item)
        if k not in seen:
            seen.add(k)
            first.append(item)
    return first


async def processed_of(session: AsyncSession, consumer: str, event_ids: Sequence[str]) -> set[str]:
    """Which of ``event_ids`` the consumer has already taken effect for."""
    if not event_ids:
        return set()
    result = await session.execute(
        select(INBOX.c.event_id).where(INBOX.c.consumer == consumer, INBOX.c.event_id.in_(list(event_ids)))
    )
    return {str(row[0]) for row in result}


class OutboxRelay(PeriodicWorker):
    """Publishes committed outbox rows, signed as a service's (``shared.security.provenance``). Runs
    beside every writer; several may run at once (rows are claimed with ``FOR UPDATE SKIP LOCKED``).

    A commit of ``db`` that enqueued rows wakes it (a commit hook), so they go out at once rather
    than at the next poll; the poll only catches rows other processes committed, or a relay that
    was down, so it is slow (an idle process does not wake for it twice a second)."""

    name = "outbox-relay"

    def __init__(
        self,
        db: Database,
        js: JetStreamContext,
        *,
        signer: MessageSigner,
        batch: int = 200,
        poll_interval_s: float = 5.0,
    ) -> None:
        super().__init__(poll_interval_s)
        self._db = db
        self._js = js
        self._signer = signer
        self._batch = batch
        self.published = 0
        #: Commits that woke it (they had enqueued rows).
        self.wakes = 0
        db.on_commit(self._committed)

    def _committed(self, info: Mapping[str, object]) -> None:
        if info.get(_WROTE_OUTBOX):
            self.wakes += 1
            self.wake()

    async def tick(self) -> None:
        # NATS or Postgres away: the rows stay and are retried; nothing is lost.
        await self.flush()

    async def finished(self) -> None:
        # One last pass so a clean shutdown leaves nothing behind that a poll would have sent.
        try:
            await self.flush()
        except Exception:  # the next start will publish it; never block shutdown on NATS
            log.warning("outbox flush at shutdown failed; rows stay for the next relay")

    async def flush(self) -> int:
        """Publish everything pending now; returns how many were published."""
        total = 0
        while True:
            sent = await self._publish_batch()
            total += sent
            if sent < self._batch:
                return total

    async def _publish_batch(self) -> int:
        async with self._db.transaction() as session:
            rows = (
                (
                    await session.execute(
                        select(OutboxMessage)
                        .order_by(col(OutboxMessage.id))
                        .limit(self._batch)
                        .with_for_update(skip_locked=True)
                    )
                )
                .scalars()
                .all()
            )
            if not rows:
                return 0
            publishes = [(row.subject, row.payload, row.headers, str(row.event_id)) for row in rows]
            # Each organization's copy of its memory and audit events (shared.messaging.feed): the same
            # bytes and message id, on its own subject in ENGRAM_FEED (a stream of its own, so
            # the id is no duplicate there).
            for row in rows:
                feed = feed_copy_subject(row.subject, row.payload)
                if feed is not None:
                    publishes.append((feed, row.payload, {}, str(row.event_id)))
            await asyncio.gather(
                *(
                    self._js.publish(
                        subject,
                        payload,
                        headers=self._signer.sign(subject, payload, {**headers, "Nats-Msg-Id": msg_id}),
                    )
                    for subject, payload, headers, msg_id in publishes
                )
            )
            await session.execute(
                delete(OutboxMessage).where(col(OutboxMessage.id).in_([r.id for r in rows]))
            )
        self.published += len(rows)
        OUTBOX_PUBLISHED.inc(len(rows))
        return len(rows)

    async def refresh_backlog(self) -> None:
        """Set ``engram_outbox_backlog_messages`` to the rows waiting now (a metrics refresher)."""
        async with self._db.read() as session:
            waiting = (await session.execute(select(func.count()).select_from(OUTBOX))).scalar_one()
        OUTBOX_BACKLOG.set(waiting)
