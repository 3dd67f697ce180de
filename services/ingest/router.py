"""ingest's subscribers: the front door for platforms."""

from __future__ import annotations

import contextlib
from typing import Annotated

from faststream import AckPolicy, Context
from faststream.nats import JStream, NatsRouter, PullSub
from faststream.nats.message import NatsBatchMessage
from nats.aio.msg import Msg
from nats.errors import MsgAlreadyAckdError

from contracts.operations import MEMORY_SAVE
from contracts.requests import Accepted, SaveOutcome, SaveRequest
from contracts.subjects import SESSION_ENDED
from services.ingest.saves import handle_save
from services.ingest.sessions import CONSUMER, handle_sessions_ended
from shared.access import Caller
from shared.bus import durable_config, heartbeat
from shared.edge import route, serve_group
from shared.infra import Infra

__all__ = ["build_router"]


def build_router(infra: Infra) -> NatsRouter:
    router = NatsRouter()
    settings = infra.settings

    @router.subscriber(
        SESSION_ENDED,
        stream=JStream("ENGRAM_SESSIONS", declare=False),
        durable=CONSUMER,
        # Batches amortize the inbox transaction; the timeout bounds a lone session's wait.
        inbox_prefix=infra.inbox_prefix,
        pull_sub=PullSub(batch_size=100, timeout=0.02, batch=True),
        ack_policy=AckPolicy.MANUAL,
        # Bad input is dead-lettered on its first delivery; what is redelivered failed on an
        # outage (NATS, Postgres), so it is retried until the outage ends rather than dropped.
        config=durable_config(settings.ack_wait_s),
        title="ingest:session.ended",
    )
    async def on_sessions_ended(msg: Annotated[NatsBatchMessage, Context("message")]) -> None:
        """Verify, validate and dedupe platforms' sessions, then hand them to distill."""
        raw: list[Msg] = msg.raw_message
        try:
            async with heartbeat(raw, settings.ack_wait_s):
                await handle_sessions_ended(infra, raw)
        except Exception:
            # Postgres or NATS away: try again later; the steps before the ack are idempotent.
            for m in raw:
                with contextlib.suppress(MsgAlreadyAckdError):
                    await m.nak(delay=infra.backoff(m.metadata.num_delivered))
            raise

    async def save(caller: Caller, request: SaveRequest) -> Accepted | SaveOutcome:
        """Elective save: answered 202 once durably accepted."""
        return await handle_save(infra, caller, request)

    serve_group(router, infra.tokens, "ingest", [route(MEMORY_SAVE, save)])

    return router
