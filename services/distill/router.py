"""distill's subscribers: validated sessions and accepted saves, both on the one save path."""

from __future__ import annotations

from faststream import AckPolicy
from faststream.nats import ConsumerConfig, JStream, NatsRouter, PullSub
from faststream.nats.annotations import NatsMessage

from contracts.subjects import MEMORY_SAVE_ACCEPTED, SESSION_VALIDATED
from services.distill import saves, sessions
from shared.infra import Infra
from shared.ports import Distiller

__all__ = ["build_router"]


def build_router(infra: Infra, distiller: Distiller) -> NatsRouter:
    router = NatsRouter()
    stream = JStream("ENGRAM_SESSIONS", declare=False)
    # Model failures are counted in code (settings.max_deliver, then dead-letter); outages of
    # NATS or Postgres are retried without limit, so they never drop a session.
    consumer = ConsumerConfig(ack_wait=infra.settings.ack_wait_s, max_deliver=-1)

    @router.subscriber(
        SESSION_VALIDATED,
        stream=stream,
        durable=sessions.CONSUMER,
        pull_sub=PullSub(batch_size=32, timeout=1.0),
        ack_policy=AckPolicy.MANUAL,
        config=consumer,
        title="distill:session.validated",
    )
    async def on_session(msg: NatsMessage) -> None:
        """Distill lessons from a verified session and save them."""
        try:
            await sessions.handle_validated_session(infra, distiller, msg.raw_message)
        except Exception:
            await msg.nack(delay=infra.backoff(msg.raw_message.metadata.num_delivered))
            raise

    @router.subscriber(
        MEMORY_SAVE_ACCEPTED,
        stream=stream,
        durable=saves.CONSUMER,
        pull_sub=PullSub(batch_size=32, timeout=1.0),
        ack_policy=AckPolicy.MANUAL,
        config=consumer,
        title="distill:save.accepted",
    )
    async def on_save(msg: NatsMessage) -> None:
        """Run an accepted elective save through the save path."""
        try:
            await saves.handle_accepted_save(infra, msg.raw_message)
        except Exception:
            await msg.nack(delay=infra.backoff(msg.raw_message.metadata.num_delivered))
            raise

    return router
