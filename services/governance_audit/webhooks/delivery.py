"""Delivering webhook events: at least once, signed, with backoff, then dead-lettered.

A :class:`WebhookDelivery` worker takes the deliveries that are due (``FOR UPDATE SKIP LOCKED``:
several instances share them, and a claimed row is leased for the attempt's timeout, so an
instance that dies mid-attempt leaves it to another), POSTs each to its webhook, and records the
outcome:

- a 2xx answer: ``delivered``;
- anything else (another status, a redirect, a timeout, a refused connection, a target the SSRF
  rule refuses now): the attempt is counted and the delivery is due again after
  ``ENGRAM_WEBHOOK_BACKOFF_S`` for that attempt; after ``ENGRAM_WEBHOOK_ATTEMPTS`` it is ``dead``
  and dead-lettered (``engram.dlq.webhook``, audited ``webhook.rejected``, shown by
  ``engram dlq``) until the organization replays it.

A request per Standard Webhooks: ``webhook-id`` (the event id: the same on every attempt, so a
receiver drops repeats), ``webhook-timestamp`` (this attempt's), ``webhook-signature``
(``v1,<base64 HMAC-SHA256 of "id.timestamp.body">`` with the webhook's secret), and the body
``{"type": <event>, "timestamp": <occurred_at>, "data": <the feed event>}``. Neither the secret
nor the URL is logged (a URL may hold a receiver's token): the webhook's id and host are.

It wakes when the fan-out inserted deliveries or a replay re-queued some, and otherwise sleeps
until the next retry is due (at most ``poll_s``: deliveries another instance inserted).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlsplit
from uuid import UUID, uuid4

import httpx
from sqlalchemy import and_, delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from standardwebhooks.webhooks import Webhook

from contracts.errors import EngramError
from contracts.operations import FEED, JETSTREAMS
from services.governance_audit.webhooks.targets import check_target
from shared.runtime.background import PeriodicWorker
from shared.runtime.time import utcnow
from shared.storage.db.engine import Database
from shared.storage.db.models import WEBHOOK_DELIVERIES as D
from shared.storage.db.models import WEBHOOKS as W
from shared.storage.deadletter import Rejection, record_dead_letter

__all__ = ["Attempt", "WebhookDelivery", "signed_request"]

log = logging.getLogger(__name__)

#: The dead letters' source (``engram.dlq.webhook``) and the consumer name of their keys.
SOURCE = "webhook"
_CONSUMER = "webhook-delivery"
#: Delivered rows are kept as long as the feed stream keeps the events, pruned this often.
FEED_RETENTION_S = next(d.max_age_seconds for d in JETSTREAMS if d.name == FEED.jetstream)
_PRUNE_EVERY_S = 3600.0


@dataclass(frozen=True)
class Attempt:
    delivery_id: int
    webhook_id: UUID
    org_id: UUID
    event_id: UUID
    event: str
    subject: str
    payload: bytes
    attempts: int
    url: str
    secret: str


def signed_request(attempt: Attempt, now: datetime) -> tuple[bytes, dict[str, str]]:
    """The body and headers of one attempt (Standard Webhooks)."""
    occurred = json.loads(attempt.payload).get("occurred_at") or now.isoformat()
    body = b'{"type":%s,"timestamp":%s,"data":%s}' % (
        json.dumps(attempt.event).encode(),
        json.dumps(occurred).encode(),
        attempt.payload,
    )
    msg_id = str(attempt.event_id)
    signature = Webhook(attempt.secret).sign(msg_id, now, body.decode())
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
        "user-agent": "Engram-Webhooks/1",
    }
    return body, headers


class WebhookDelivery(PeriodicWorker):
    name = "webhook-delivery"

    def __init__(
        self,
        db: Database,
        *,
        attempts: int,
        backoff_s: tuple[float, ...],
        timeout_s: float,
        allow_private: bool,
        batch: int = 50,
        poll_s: float = 30.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(poll_s)
        self._db = db
        self._attempts = attempts
        self._backoff_s = backoff_s or (30.0,)
        self._timeout_s = timeout_s
        self._allow_private = allow_private
        self._batch = batch
        self._poll_s = poll_s
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(follow_redirects=False, timeout=timeout_s)
        self.delivered = 0
        self._next_prune = 0.0

    async def finished(self) -> None:
        if self._own_client:
            await self._client.aclose()

    async def tick(self) -> None:
        while await self._round() == self._batch and not self.stopping:
            pass
        if time.monotonic() >= self._next_prune:
            await self._prune_delivered()
        self.interval_s = await self._until_next_due()

    async def _prune_delivered(self) -> None:
        """Delivered rows older than the feed keeps its events go (the bytes of an event need not
        outlive the stream's copy); dead ones stay until replayed or their webhook is deleted."""
        self._next_prune = time.monotonic() + _PRUNE_EVERY_S
        cutoff = utcnow() - timedelta(seconds=FEED_RETENTION_S)
        async with self._db.transaction() as session:
            await session.execute(delete(D).where(D.c.state == "delivered", D.c.delivered_at < cutoff))

    async def _round(self) -> int:
        """Claim what is due, attempt it, record the outcomes; how many were claimed."""
        claimed = await self._claim()
        if claimed:
            outcomes = await asyncio.gather(*(self._attempt(a) for a in claimed))
            await self._record(list(zip(claimed, outcomes, strict=True)))
        return len(claimed)

    async def _claim(self) -> list[Attempt]:
        now = utcnow()
        async with self._db.transaction() as session:
            rows = (
                await session.execute(
                    select(
                        D.c.id.label("delivery_id"),
                        D.c.webhook_id,
                        D.c.org_id,
                        D.c.event_id,
                        D.c.event,
                        D.c.subject,
                        D.c.payload,
                        D.c.attempts,
                        W.c.url,
                        W.c.secret,
                    )
                    .join(W, W.c.id == D.c.webhook_id)
                    .where(D.c.state == "pending", D.c.next_attempt_at <= now)
                    .order_by(D.c.next_attempt_at, D.c.id)
                    .limit(self._batch)
                    .with_for_update(of=D, skip_locked=True)
                )
            ).all()
            if rows:
                # Leased for the attempt: another instance takes it only if this one died.
                lease = now + timedelta(seconds=self._timeout_s * 3 + 5)
                await session.execute(
                    update(D).where(D.c.id.in_([r.delivery_id for r in rows])).values(next_attempt_at=lease)
                )
        return [Attempt(**dict(row._mapping)) for row in rows]

    async def _attempt(self, attempt: Attempt) -> str | None:
        """None when delivered, else why not (no secret, no URL in it)."""
        try:
            await check_target(attempt.url, allow_private=self._allow_private)
        except EngramError as exc:
            return f"refused target: {exc.message}"[:300]
        body, headers = signed_request(attempt, utcnow())
        try:
            response = await self._client.post(attempt.url, content=body, headers=headers)
        except httpx.TimeoutException:
            return "timed out"
        except httpx.HTTPError as exc:
            return f"request failed: {type(exc).__name__}"
        if 200 <= response.status_code < 300:
            return None
        return f"answered HTTP {response.status_code}"

    async def _record(self, outcomes: list[tuple[Attempt, str | None]]) -> None:
        now = utcnow()
        async with self._db.transaction() as session:
            for attempt, failure in outcomes:
                done = attempt.attempts + 1
                if failure is None:
                    values: dict[str, object] = {"state": "delivered", "attempts": done, "delivered_at": now}
                    self.delivered += 1
                elif done < self._attempts:
                    step = self._backoff_s[min(done, len(self._backoff_s)) - 1]
                    values = {
                        "attempts": done,
                        "last_error": failure,
                        "next_attempt_at": now + timedelta(seconds=step),
                    }
                    log.info(
                        "webhook %s (%s): attempt %d of %d failed (%s); next in %.0f s",
                        attempt.webhook_id,
                        urlsplit(attempt.url).hostname,
                        done,
                        self._attempts,
                        failure,
                        step,
                    )
                else:
                    values = {"state": "dead", "attempts": done, "last_error": failure}
                # Only if still claimed as pending (a delete or replay meanwhile wins).
                changed = await session.scalar(
                    update(D)
                    .where(and_(D.c.id == attempt.delivery_id, D.c.state == "pending"))
                    .values(**values)
                    .returning(D.c.id)
                )
                if changed is not None and values.get("state") == "dead":
                    await self._dead_letter(session, attempt, done, failure or "")

    async def _dead_letter(self, session: AsyncSession, attempt: Attempt, done: int, failure: str) -> None:
        log.warning(
            "webhook %s (%s): %d attempts failed (%s); dead-lettered",
            attempt.webhook_id,
            urlsplit(attempt.url).hostname,
            done,
            failure,
        )
        await record_dead_letter(
            session,
            key=f"{attempt.delivery_id}:{uuid4()}",
            subject=attempt.subject,
            data=attempt.payload,
            deliveries=done,
            rejection=Rejection(
                "UNAVAILABLE",
                f"webhook {attempt.webhook_id}: {failure}",
                org_id=attempt.org_id,
                original_event_id=str(attempt.event_id),
                details={"webhook_id": str(attempt.webhook_id)},
            ),
            consumer=_CONSUMER,
            source=SOURCE,
        )

    async def _until_next_due(self) -> float:
        async with self._db.read() as session:
            due = await session.scalar(select(func.min(D.c.next_attempt_at)).where(D.c.state == "pending"))
        if due is None:
            return self._poll_s
        wait: float = (due - utcnow()).total_seconds()
        return max(0.0, min(self._poll_s, wait))
