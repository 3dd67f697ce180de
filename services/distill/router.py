"""distill's subscribers: validated sessions and accepted saves, both on the one save path."""

from __future__ import annotations

from faststream.nats import NatsRouter

from contracts.operations import DISTILL_SAVES, DISTILL_SESSIONS
from services.distill import saves, sessions
from shared.ports import Distiller, SupersessionJudge
from shared.service.consumer import Batch, batch_consumer
from shared.service.infra import Infra

__all__ = ["build_router"]


def build_router(infra: Infra, distiller: Distiller, judge: SupersessionJudge | None = None) -> NatsRouter:
    router = NatsRouter()
    # Model failures are counted in code (settings.max_deliver, then dead-letter); outages of
    # NATS or Postgres are retried without limit, so they never drop a session. A model call per
    # session can outlast ack_wait: the batch's heartbeat keeps it ours meanwhile.

    # Batches amortize the transaction, inbox, audit and outbox work across sessions. The
    # timeout bounds what a lone session waits for company (latency at low load).
    @batch_consumer(router, infra, DISTILL_SESSIONS)
    async def on_sessions(batch: Batch) -> None:
        await sessions.handle_validated_sessions(infra, distiller, batch, judge)

    @batch_consumer(router, infra, DISTILL_SAVES)
    async def on_save(batch: Batch) -> None:
        await saves.handle_accepted_saves(infra, batch, judge)

    return router
