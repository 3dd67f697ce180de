"""A feed per organization (SPEC 11): what ``engram.feed.<org>.<event>``, ``GET /v1/events`` and
an organization's webhooks carry, and the webhook operations (``engram.webhooks.*``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from pydantic import Field, RootModel

from engram_client.contracts.common import Inbound, Outbound
from engram_client.contracts.events import AuditEvent, MemoryPurged, MemoryWritten

__all__ = [
    "FeedEvent",
    "WebhookCreated",
    "WebhookDelete",
    "WebhookDeleted",
    "WebhookInfo",
    "WebhookList",
    "WebhookPage",
    "WebhookRegister",
    "WebhookReplay",
    "WebhookReplayed",
]

#: Where a webhook may point: an http(s) URL (the deployment refuses its own internals unless
#: told otherwise: ``ENGRAM_WEBHOOK_ALLOW_PRIVATE_NETWORKS``).
_URL = (
    r"^https?://(?:\[[0-9A-Fa-f:.]{2,45}\]|[^\s/?#@:\[\]]{1,253})"
    r"(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?"
    r"(?:/[^\s#]*)?$"
)


class FeedEvent(RootModel[MemoryWritten | MemoryPurged | AuditEvent]):
    """One event of an organization's feed: the same JSON as on ``engram.memory.written``,
    ``engram.memory.purged`` or ``engram.audit.<kind>`` — ids and metadata, never memory text.
    Its subject (``engram.feed.<org_id>.<event>``), its SSE ``event:`` field and its webhook
    payload's ``type`` say which."""


class WebhookRegister(Inbound):
    url: str = Field(max_length=2048, pattern=_URL)
    description: str | None = Field(default=None, max_length=200)
    #: The feed events delivered (``memory.written``, ``memory.purged``, ``audit``); none: all.
    events: list[Literal["memory.written", "memory.purged", "audit"]] | None = Field(
        default=None, min_length=1, max_length=3
    )


class WebhookInfo(Outbound):
    """A registered webhook, never its secret."""

    webhook_id: UUID
    url: str
    description: str | None
    events: list[str] | None
    created_at: datetime
    #: Deliveries by state: waiting (first try or a retry), delivered, dead-lettered.
    pending: int = 0
    delivered: int = 0
    dead: int = 0


class WebhookCreated(WebhookInfo):
    #: The signing secret (Standard Webhooks, ``whsec_<base64>``): shown this once, never again.
    secret: str


class WebhookList(Inbound):
    pass


class WebhookPage(Outbound):
    webhooks: list[WebhookInfo]


class WebhookDelete(Inbound):
    webhook_id: UUID


class WebhookDeleted(Outbound):
    webhook_id: UUID
    #: Deliveries still waiting that were dropped with it.
    dropped: int


class WebhookReplay(Inbound):
    webhook_id: UUID
    #: Replay these events' deliveries (dead or delivered); none: every dead-lettered one.
    event_ids: list[UUID] | None = Field(default=None, min_length=1, max_length=1000)


class WebhookReplayed(Outbound):
    webhook_id: UUID
    replayed: int
