"""recall's request-reply handlers (queue group ``recall``, so instances share the load)."""

from __future__ import annotations

from typing import Any

from faststream.nats import NatsRouter
from faststream.nats.annotations import NatsMessage

from contracts.recall import ExpandRequest, FeedbackRequest, RecallRequest
from contracts.subjects import MEMORY_FEEDBACK, RECALL, RECALL_EXPAND
from services.recall.feedback import give_feedback
from services.recall.service import Recall
from shared.handlers import answer
from shared.infra import Infra

__all__ = ["build_router"]

QUEUE = "recall"


def build_router(infra: Infra, recall: Recall) -> NatsRouter:
    router = NatsRouter()

    @router.subscriber(RECALL, queue=QUEUE, title="recall:recall")
    async def on_recall(msg: NatsMessage) -> dict[str, Any]:
        """What should this agent remember right now?"""
        return await answer(
            infra.tokens, msg.headers, msg.body, RecallRequest, recall.recall, exclude_unset=True
        )

    @router.subscriber(RECALL_EXPAND, queue=QUEUE, title="recall:recall.expand")
    async def on_expand(msg: NatsMessage) -> dict[str, Any]:
        """Full stored content for up to 20 accessible ids."""
        return await answer(infra.tokens, msg.headers, msg.body, ExpandRequest, recall.expand)

    @router.subscriber(MEMORY_FEEDBACK, queue=QUEUE, title="recall:memory.feedback")
    async def on_feedback(msg: NatsMessage) -> dict[str, Any]:
        """How a recalled memory (or a whole session) worked out."""
        return await answer(
            infra.tokens, msg.headers, msg.body, FeedbackRequest, lambda c, r: give_feedback(infra.db, c, r)
        )

    return router
