"""recall's request-reply handlers (queue group ``recall``, so instances share the load)."""

from __future__ import annotations

import json
import logging
from uuid import UUID

from faststream.nats import NatsRouter
from nats.aio.msg import Msg

from contracts.operations import MEMORY_FEEDBACK, RECALL, RECALL_EXPAND
from contracts.recall import FeedbackReply, FeedbackRequest, RecallReply
from contracts.subjects import MEMORY_PURGED, MEMORY_WRITTEN
from services.recall.feedback import give_feedback
from services.recall.service import Recall
from shared.messaging.raw_message import as_message, whole_message
from shared.observability.metrics import RECALL_SECONDS
from shared.security.access import Caller
from shared.service.edge import route
from shared.service.infra import Infra
from shared.storage.cache import ResultCache

__all__ = ["build_router"]

log = logging.getLogger(__name__)

QUEUE = "recall"


def _time_strategy(reply: RecallReply, seconds: float) -> None:
    # By the strategy that ran (a bounded set), after any fallback.
    RECALL_SECONDS.labels(reply.strategy).observe(seconds)


def build_router(infra: Infra, recall: Recall, results: ResultCache | None = None) -> NatsRouter:
    router = NatsRouter()

    async def feedback(caller: Caller, request: FeedbackRequest) -> FeedbackReply:
        reply = await give_feedback(infra.db, caller, request)
        if results is not None:
            await results.invalidate(caller.org_id, [request.agent_config_id])
        return reply

    infra.edge.serve_group(
        QUEUE,
        [
            route(RECALL, recall.recall, observe=_time_strategy),
            route(RECALL_EXPAND, recall.expand),
            route(MEMORY_FEEDBACK, feedback),
        ],
    )

    if results is not None and results.enabled:
        # Core NATS (the relay's JetStream publishes reach core subscribers too), one instance per
        # event (queue group: the cache is shared); a missed event is bounded by the cache TTL.
        # no_reply: these are the relay's JetStream publishes, whose reply subject awaits the
        # stream's ack; an empty answer from here would reach the relay first and fail its publish.
        for subject, title, description in (
            (
                MEMORY_WRITTEN,
                "written",
                "A write changes what recall would answer: drop the agent config's cached replies.",
            ),
            (
                MEMORY_PURGED,
                "purged",
                "An erasure by any path (prune, expiry, reliability) drops cached replies too.",
            ),
        ):

            @router.subscriber(
                subject,
                queue="recall-cache",
                no_reply=True,
                title=f"recall:cache.{title}",
                description=description,
                decoder=whole_message,
            )
            async def on_event(body: object) -> None:
                await _invalidate(infra, results, as_message(body).raw_message)

    return router


async def _invalidate(infra: Infra, results: ResultCache, msg: Msg) -> None:
    # An unsigned event is ignored here, not dead-lettered: embed's durable consumer receives the
    # same message from the stream and dead-letters it, once.
    if not infra.signer.verify(msg.subject, msg.data, msg.headers):
        log.warning("cache invalidation: unsigned %s ignored", msg.subject)
        return
    try:
        data = json.loads(msg.data)
        org_id, agent_config_id = UUID(str(data["org_id"])), UUID(str(data["agent_config_id"]))
    except (ValueError, KeyError, TypeError):
        log.warning("cache invalidation: unreadable event skipped")
        return
    await results.invalidate(org_id, [agent_config_id])
