"""distill's subscribers: validated sessions and accepted saves, both on the one save path."""

from __future__ import annotations

from typing import Annotated

from faststream import AckPolicy, Context
from faststream.nats import JStream, NatsRouter, PullSub
from faststream.nats.annotations import NatsMessage
from faststream.nats.message import NatsBatchMessage
from nats.aio.msg import Msg

from contracts.subjects import MEMORY_SAVE_ACCEPTED, SESSION_VALIDATED
from services.distill import saves, sessions
from shared.bus import durable_config, heartbeat
from shared.infra import Infra
from shared.ports import Distiller
from shared.provenance import refuse_forged

__all__ = ["build_router"]


def build_router(infra: Infra, distiller: Distiller) -> NatsRouter:
    router = NatsRouter()
    stream = JStream("ENGRAM_SESSIONS", declare=False)
    # Model failures are counted in code (settings.max_deliver, then dead-letter); outages of
    # NATS or Postgres are retried without limit, so they never drop a session.
    consumer = durable_config(infra.settings.ack_wait_s)
    ack_wait_s = infra.settings.ack_wait_s

    @router.subscriber(
        SESSION_VALIDATED,
        stream=stream,
        durable=sessions.CONSUMER,
        # Batches amortize the transaction, inbox, audit and outbox work across sessions. The
        # timeout bounds what a lone session waits for company (latency at low load).
        inbox_prefix=infra.inbox_prefix,
        pull_sub=PullSub(batch_size=100, timeout=0.02, batch=True),
        ack_policy=AckPolicy.MANUAL,
        config=consumer,
        title="distill:session.validated",
    )
    async def on_sessions(msg: Annotated[NatsBatchMessage, Context("message")]) -> None:
        """Distill lessons from verified sessions and save them, a batch per transaction."""
        raw: list[Msg] = msg.raw_message
        try:
            # A model call per session can outlast ack_wait: the heartbeat keeps the batch ours.
            async with heartbeat(raw, ack_wait_s):
                genuine = await refuse_forged(infra, raw, consumer=sessions.CONSUMER)
                await sessions.handle_validated_sessions(infra, distiller, genuine)
        except Exception:
            # An outage (Postgres, NATS) mid-batch: everything not yet acked comes back later.
            for m in raw:
                if not m._ackd:
                    await m.nak(delay=infra.backoff(m.metadata.num_delivered))
            raise

    @router.subscriber(
        MEMORY_SAVE_ACCEPTED,
        stream=stream,
        durable=saves.CONSUMER,
        inbox_prefix=infra.inbox_prefix,
        pull_sub=PullSub(batch_size=32, timeout=1.0),
        ack_policy=AckPolicy.MANUAL,
        config=consumer,
        title="distill:save.accepted",
    )
    async def on_save(msg: NatsMessage) -> None:
        """Run an accepted elective save through the save path."""
        try:
            async with heartbeat([msg.raw_message], ack_wait_s):
                if await refuse_forged(infra, [msg.raw_message], consumer=saves.CONSUMER):
                    await saves.handle_accepted_save(infra, msg.raw_message)
        except Exception:
            await msg.nack(delay=infra.backoff(msg.raw_message.metadata.num_delivered))
            raise

    return router
