"""Events on JetStream (SPEC section 6). Every event has ``event_id``, ``schema_version`` and
``occurred_at``; consumers are idempotent by ``event_id``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal
from uuid import UUID, uuid4

from pydantic import Field, JsonValue, model_validator

from contracts.common import JSON_SAFE_INT_MAX, PG_INT4_MAX, Inbound, JsonInt, Outbound, Principal

__all__ = [
    "MAX_SESSION_BYTES",
    "AuditEvent",
    "DeadLetter",
    "MemoryPurged",
    "MemoryWritten",
    "SessionEnded",
    "SessionStatus",
    "ToolCall",
    "TranscriptTurn",
]

#: The largest ``session.ended`` payload ingest accepts (bigger ones are dead-lettered
#: with ``PAYLOAD_TOO_LARGE``); JetStream's own limit is set just above it.
MAX_SESSION_BYTES = 512 * 1024

SessionStatus = Literal["success", "failed", "cancelled", "timeout"]


def _now() -> datetime:
    return datetime.now(UTC)


class ToolCall(Inbound):
    """One tool call of a session's trace."""

    tool: str = Field(min_length=1, max_length=200)
    input: JsonValue = None
    output: JsonValue = None
    error: str | None = None
    started_at: datetime | None = None
    duration_ms: JsonInt | None = Field(default=None, ge=0, le=JSON_SAFE_INT_MAX)


class TranscriptTurn(Inbound):
    role: str = Field(min_length=1, max_length=50)
    content: str


class SessionEnded(Inbound):
    """``engram.session.ended``: what a platform publishes when an agent session ends."""

    event_id: UUID
    schema_version: Literal[1]
    org_id: UUID
    agent_config_id: UUID
    session_id: str = Field(min_length=1, max_length=200)
    status: SessionStatus
    principal: Principal
    steps: JsonInt = Field(ge=0, le=PG_INT4_MAX)
    task: str = Field(default="", max_length=20_000)
    tool_trace: list[ToolCall] = Field(default_factory=list, max_length=2_000)
    transcript: list[TranscriptTurn] | None = Field(default=None, max_length=2_000)
    rating: float | None = Field(default=None, ge=0, le=1)
    ended_at: datetime
    occurred_at: datetime | None = None

    @model_validator(mode="after")
    def _default_occurred_at(self) -> SessionEnded:
        # A time without a zone is taken as UTC, so every comparison downstream (retention,
        # erasure tombstones) compares like with like.
        if self.ended_at.tzinfo is None:
            object.__setattr__(self, "ended_at", self.ended_at.replace(tzinfo=UTC))
        if self.occurred_at is None:
            object.__setattr__(self, "occurred_at", self.ended_at)
        elif self.occurred_at.tzinfo is None:
            object.__setattr__(self, "occurred_at", self.occurred_at.replace(tzinfo=UTC))
        return self


class MemoryWritten(Outbound):
    """``engram.memory.written``: one per stored or reinforced entry. Ids and metadata, no text."""

    event_id: UUID = Field(default_factory=uuid4)
    schema_version: Literal[1] = 1
    occurred_at: datetime = Field(default_factory=_now)
    org_id: UUID
    agent_config_id: UUID
    entry_id: UUID
    outcome: Literal["saved", "reinforced"]
    owner: Principal | None
    session_id: str | None
    layer: Literal["memory", "observation"]
    memory_type: str
    source: str
    importance: float
    version: int
    quarantined: bool


class MemoryPurged(Outbound):
    """``engram.memory.purged``: what was erased (ids and scope), counts, and who asked."""

    event_id: UUID = Field(default_factory=uuid4)
    schema_version: Literal[1] = 1
    occurred_at: datetime = Field(default_factory=_now)
    org_id: UUID
    agent_config_id: UUID | None
    entry_ids: list[UUID]
    actor_ref: str | None
    session_id: str | None
    count: int
    requested_by: str
    #: ``purge``, ``delete``, ``prune`` (over ``max_entries``) or ``expired``.
    reason: str = "purge"


class AuditEvent(Outbound):
    """``engram.audit.<kind>``: one hash-chained audit record. Ids and counts, never memory text."""

    event_id: UUID
    schema_version: Literal[1] = 1
    occurred_at: datetime
    org_id: UUID
    seq: int
    kind: str
    actor_ref: str | None
    agent_config_id: UUID | None
    session_id: str | None
    entry_ids: list[UUID]
    details: dict[str, Any]
    prev_hash: str
    hash: str


class DeadLetter(Outbound):
    """``engram.dlq.<source>``: an event that could not be processed, with the reason.

    The original bytes are kept (base64) so an operator can fix and replay, with every PII value
    replaced by its typed placeholder — a rejected session must not keep an e-mail address or a
    card number in the stream for days; replaying the redacted copy distills the same lessons as
    the save path would have stored. ``original_sha256`` identifies the exact original.
    """

    event_id: UUID = Field(default_factory=uuid4)
    schema_version: Literal[1] = 1
    occurred_at: datetime = Field(default_factory=_now)
    source_subject: str
    original_event_id: str | None
    code: str
    reason: str
    details: dict[str, Any] = Field(default_factory=dict)
    deliveries: int = 1
    original_b64: str
    original_sha256: str = ""
    #: the PII kinds replaced in ``original_b64``.
    redactions: list[str] = Field(default_factory=list)
    #: The organization whose event it was (``engram.ops.dead_letters`` shows each its own); the
    #: all-zero system organization for one that named none (no valid token), and None on letters
    #: written before this field, which no tenant is shown.
    org_id: UUID | None = None
