"""Operator views of the pipeline's plumbing (``engram.ops.*``): dead letters and stream lag."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import Field

from contracts.common import JSON_SAFE_INT_MAX, Inbound, JsonInt, Outbound

__all__ = [
    "ConsumerLag",
    "DeadLetterPage",
    "DeadLetterQuery",
    "DeadLetterSummary",
    "LagQuery",
    "LagReply",
    "StreamCount",
]


class DeadLetterQuery(Inbound):
    #: ``engram.dlq.<source>``: ingest, distill, embed …; none is every source.
    source: str | None = Field(default=None, max_length=40, pattern=r"^[a-z][a-z0-9_-]{0,39}$")
    #: The page before this stream sequence (the previous page's ``next_before_seq``).
    before_seq: JsonInt | None = Field(default=None, ge=1, le=JSON_SAFE_INT_MAX)
    limit: JsonInt = Field(default=50, ge=1, le=500)


class DeadLetterSummary(Outbound):
    """One dead letter without its kept payload (the redacted original stays in the stream)."""

    seq: int
    #: Whose event it was: the caller's organization, or — for the deployment's operator — any
    #: organization's, the all-zero system organization's (no valid token named one) or none
    #: (letters older than the field).
    org_id: UUID | None = None
    occurred_at: datetime
    source_subject: str
    original_event_id: str | None
    code: str
    reason: str
    deliveries: int
    original_sha256: str


class DeadLetterPage(Outbound):
    """Newest first."""

    letters: list[DeadLetterSummary]
    next_before_seq: int | None


class LagQuery(Inbound):
    pass


class StreamCount(Outbound):
    stream: str
    messages: int
    bytes: int
    first_seq: int
    last_seq: int


class ConsumerLag(Outbound):
    stream: str
    durable: str
    #: Stored messages this consumer has not been delivered yet.
    num_pending: int
    #: Delivered, not yet acknowledged.
    num_ack_pending: int
    num_redelivered: int


class LagReply(Outbound):
    streams: list[StreamCount]
    #: A durable that does not exist yet (its service never started) is left out.
    consumers: list[ConsumerLag]
