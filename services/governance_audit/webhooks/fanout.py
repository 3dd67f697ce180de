"""Each feed event becomes one delivery per webhook of its organization that wants it: a durable
consumer of ``ENGRAM_FEED`` (``WEBHOOKS_FANOUT``) inserts the rows, idempotently (one per webhook
and event id), and wakes the delivery worker. Records about webhooks themselves
(``audit.webhook.*``: registered, deleted, replayed, rejected) are not delivered to webhooks: a
receiver that fails would otherwise be sent the record of its own failure, and fail again."""

from __future__ import annotations

import json
from collections.abc import Callable
from uuid import UUID

from faststream.nats import NatsRouter
from nats.aio.msg import Msg
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from contracts.operations import WEBHOOKS_FANOUT
from shared.messaging.feed import org_of_feed_subject
from shared.runtime.time import utcnow
from shared.service.consumer import Batch, batch_consumer
from shared.service.infra import Infra
from shared.storage.db.models import WEBHOOK_DELIVERIES as D
from shared.storage.db.models import WEBHOOKS as W
from shared.storage.deadletter import Rejection

__all__ = ["subscribe_fanout", "wanted"]


def wanted(events: list[str] | None, event: str) -> bool:
    """Whether a webhook subscribed to ``events`` (None: all) gets ``event``."""
    if event.startswith("audit.webhook."):
        return False
    if events is None:
        return True
    return event in events or ("audit" in events and event.startswith("audit."))


def subscribe_fanout(router: NatsRouter, infra: Infra, wake: Callable[[], None]) -> None:
    @batch_consumer(router, infra, WEBHOOKS_FANOUT)
    async def fan_out(batch: Batch) -> None:
        events: list[tuple[UUID, str, UUID, Msg]] = []
        unreadable: list[tuple[Msg, Rejection]] = []
        for msg in batch.msgs:
            try:
                org, event = org_of_feed_subject(msg.subject)
                event_id = UUID(str(json.loads(msg.data)["event_id"]))
            except (ValueError, KeyError, TypeError):
                unreadable.append((msg, Rejection("INVALID_REQUEST", "unreadable feed event")))
                continue
            events.append((org, event, event_id, msg))
        if unreadable:
            await batch.dead_letter(unreadable)
        if not events:
            return
        now = utcnow()
        async with infra.db.transaction() as session:
            hooks = (
                await session.execute(
                    select(W.c.id, W.c.org_id, W.c.events).where(W.c.org_id.in_({e[0] for e in events}))
                )
            ).all()
            rows = [
                {
                    "webhook_id": hook.id,
                    "org_id": org,
                    "event_id": event_id,
                    "event": event,
                    "subject": msg.subject,
                    "payload": msg.data,
                    "state": "pending",
                    "attempts": 0,
                    "next_attempt_at": now,
                    "created_at": now,
                }
                for org, event, event_id, msg in events
                for hook in hooks
                if hook.org_id == org and wanted(hook.events, event)
            ]
            if rows:
                await session.execute(
                    pg_insert(D).values(rows).on_conflict_do_nothing(constraint="uq_webhook_deliveries_event")
                )
        if rows:
            wake()
