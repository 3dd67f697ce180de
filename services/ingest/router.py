"""ingest's subscribers: the front door for platforms."""

from __future__ import annotations

from typing import Any

from faststream import AckPolicy
from faststream.nats import ConsumerConfig, JStream, NatsRouter, PullSub
from faststream.nats.annotations import NatsMessage

from contracts.requests import SaveRequest
from contracts.subjects import MEMORY_SAVE, SESSION_ENDED
from services.ingest.saves import handle_save
from services.ingest.sessions import CONSUMER, handle_session_ended
from shared.handlers import answer
from shared.infra import Infra

__all__ = ["build_router"]


def build_router(infra: Infra) -> NatsRouter:
    router = NatsRouter()
    settings = infra.settings

    @router.subscriber(
        SESSION_ENDED,
        stream=JStream("ENGRAM_SESSIONS", declare=False),
        durable=CONSUMER,
        pull_sub=PullSub(batch_size=32, timeout=1.0),
        ack_policy=AckPolicy.MANUAL,
        # Bad input is dead-lettered on its first delivery; what is redelivered failed on an
        # outage (NATS, Postgres), so it is retried until the outage ends rather than dropped.
        config=ConsumerConfig(ack_wait=settings.ack_wait_s, max_deliver=-1),
        title="ingest:session.ended",
    )
    async def on_session_ended(msg: NatsMessage) -> None:
        """Verify, validate and dedupe a platform's session, then hand it to distill."""
        try:
            await handle_session_ended(infra, msg.raw_message)
        except Exception:
            # Postgres or NATS away: try again later; the steps before the ack are idempotent.
            await msg.nack(delay=infra.backoff(msg.raw_message.metadata.num_delivered))
            raise

    @router.subscriber(MEMORY_SAVE, queue="ingest", title="ingest:memory.save")
    async def on_save(msg: NatsMessage) -> dict[str, Any]:
        """Elective save: answered 202 once durably accepted."""
        return await answer(
            infra.tokens, msg.headers, msg.body, SaveRequest, lambda cred, req: handle_save(infra, cred, req)
        )

    return router
