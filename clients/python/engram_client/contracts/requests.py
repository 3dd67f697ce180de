"""Request-reply payloads (SPEC sections 4.2 and 7)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import ConfigDict, Field, JsonValue, field_validator, model_validator

from engram_client.contracts.common import (
    JSON_INTEGER,
    PG_INT4_MAX,
    ActingFor,
    Inbound,
    MemoryTypeName,
    Outbound,
    given,
)
from engram_client.contracts.config import ConfigPatchSchema, MemoryConfig

__all__ = [
    "Accepted",
    "AuditQuery",
    "AuditQueryReply",
    "AuditVerify",
    "AuditVerifyReply",
    "BrokenLink",
    "ConfigGet",
    "ConfigPut",
    "ConfigReply",
    "SaveEntry",
    "SaveOutcome",
    "SaveRequest",
    "SessionAccepted",
]

MAX_ENTRY_CHARS = 8_000


class SaveEntry(Inbound):
    text: str = Field(min_length=1, max_length=MAX_ENTRY_CHARS)
    importance: float = Field(default=0.5, ge=0, le=1)
    memory_type: MemoryTypeName = "semantic"
    layer: Literal["memory", "observation"] = "memory"
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    #: When what the entry records happened (a conversation turn's time), if not now; a time
    #: without a zone is taken as UTC, as for ``engram.session.ended``.
    occurred_at: datetime | None = None

    @field_validator("occurred_at")
    @classmethod
    def _utc_when_naive(cls, value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


class SaveRequest(Inbound):
    """``engram.memory.save``: ``entries`` or a single ``content`` string."""

    model_config = ConfigDict(
        json_schema_extra={"oneOf": [given("entries", entries="array"), given("content")]}
    )

    agent_config_id: UUID
    session_id: str | None = Field(default=None, min_length=1, max_length=200)
    principal: ActingFor = None
    entries: list[SaveEntry] | None = Field(default=None, min_length=1, max_length=100)
    content: str | None = Field(default=None, min_length=1, max_length=MAX_ENTRY_CHARS)
    wait: bool = False
    #: Optional idempotency key: a retried save with the same id takes effect once.
    request_id: UUID | None = None

    @model_validator(mode="after")
    def _entries_or_content(self) -> SaveRequest:
        if (self.entries is None) == (self.content is None):
            raise ValueError("give exactly one of 'entries' or 'content'")
        return self

    def all_entries(self) -> list[SaveEntry]:
        if self.entries is not None:
            return list(self.entries)
        assert self.content is not None
        return [SaveEntry(text=self.content)]


class Accepted(Outbound):
    status: Literal[202] = 202
    request_id: UUID


class SessionAccepted(Outbound):
    """``engram.session.submit`` (``POST /v1/sessions``): ingest verified the token and the session
    and handed it to distill, durably (``stream_seq``: where in ``ENGRAM_SESSIONS``) — or, with
    ``duplicate``, had already taken this organization's ``event_id``, so this copy changes
    nothing. Another organization's event with the same id is never a duplicate of it."""

    status: Literal[202] = 202
    event_id: UUID
    stream_seq: int | None = None
    duplicate: bool = False


class SaveOutcome(Outbound):
    """The result of the save path: ``{saved, skipped, reinforced}`` plus the entry ids, and how
    many of the stored entries were quarantined (prompt-injection text, never recalled as text)
    or had PII redacted (each count is of entries, among ``ids``)."""

    status: Literal[200] = 200
    request_id: UUID | None = None
    saved: int
    skipped: int
    reinforced: int
    ids: list[UUID]
    quarantined: int = 0
    redacted: int = 0
    #: ``agent_config_created``: the first write to this agent config created it (SPEC 2).
    warnings: list[str] = Field(default_factory=list)


class ConfigGet(Inbound):
    agent_config_id: UUID


class ConfigPut(Inbound):
    agent_config_id: UUID
    #: Keys of the memory config to change; nested objects merge key by key and the result is
    #: validated whole (``shared.storage.config_store``). The documents show the keys and their bounds.
    config: Annotated[dict[str, Any], ConfigPatchSchema()]


class ConfigReply(Outbound):
    agent_config_id: UUID
    version: int
    config: MemoryConfig


class AuditQuery(Inbound):
    kind: str | None = Field(default=None, max_length=100)
    after_seq: Annotated[int, Field(ge=0, le=PG_INT4_MAX), JSON_INTEGER] = 0
    limit: Annotated[int, Field(ge=1, le=1000), JSON_INTEGER] = 100
    agent_config_id: UUID | None = None


class AuditQueryReply(Outbound):
    records: list[dict[str, Any]]
    next_after_seq: int | None


class AuditVerify(Inbound):
    pass


class BrokenLink(Outbound):
    seq: int
    record_id: UUID | None
    reason: str


class AuditVerifyReply(Outbound):
    ok: bool
    checked: int
    first_broken: BrokenLink | None
