"""Memory management over request-reply (SPEC 7.1 to 7.2): list, get, delete, purge, prune, manage
and export. Every request names the agent config (purge and export may span all of them) and,
for service tokens only, the principal acted for; tenancy comes from the token."""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Annotated, Any, Literal, get_args
from uuid import UUID

from pydantic import ConfigDict, Field, JsonValue, field_validator, model_validator

from engram_client.contracts.common import (
    ID_CHARS,
    JSON_INTEGER,
    MAX_TTL_SECONDS,
    ActingFor,
    Inbound,
    MemoryTypeName,
    Outbound,
    Principal,
    absent,
    given,
)

__all__ = [
    "LIFECYCLES",
    "MAX_METADATA_FILTER_BYTES",
    "MAX_METADATA_FILTER_DEPTH",
    "DeleteRequest",
    "EntryView",
    "ExportRequest",
    "GetReply",
    "GetRequest",
    "Lifecycle",
    "ListRequest",
    "ManageOp",
    "ManageReply",
    "ManageRequest",
    "Page",
    "PruneReply",
    "PruneRequest",
    "PurgeReceipt",
    "PurgeRequest",
]

Lifecycle = Literal["active", "stale", "superseded", "suppressed", "disabled"]
LIFECYCLES: tuple[str, ...] = ("active", "stale", "superseded", "suppressed", "disabled")
ManageOp = Literal[
    "pin", "unpin", "disable", "enable", "mark_incorrect", "edit", "merge", "rescope", "change_retention"
]
#: ``"<kind>:<id>"`` (``end_user:alice``, ``actor:carol``) or ``"none"`` for the shared pool.
_ACTOR_REF = rf"^(none|(end_user|actor):{ID_CHARS})$"
_ACTOR_REF_CHARS = len("end_user:") + 200
#: Page tokens are opaque to callers; this only bounds what the parser is asked to look at.
_MAX_PAGE_TOKEN = 2048
#: Their grammar (``shared.security.page_tokens``: base64url body "." base64url MAC); only a token a
#: previous page issued is valid.
_PAGE_TOKEN = r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$"  # noqa: S105 (a pattern, not a secret)
#: Bounds of ``ListRequest.metadata``: its size as compact JSON, and how deep it nests.
MAX_METADATA_FILTER_BYTES = 4096
MAX_METADATA_FILTER_DEPTH = 8


class EntryView(Outbound):
    """A memory entry as management and export show it (SPEC 2, every field)."""

    id: UUID
    org_id: UUID
    agent_config_id: UUID
    owner: Principal | None
    session_id: str | None
    text: str
    fingerprint: str
    importance: float
    reinforcement_count: int
    memory_type: str
    layer: str
    source: str
    source_agent: str | None
    confidence: float
    reliability: float
    lifecycle: str
    pinned: bool
    category: str | None
    confirmation: str | None
    sensitivity: str | None
    consent: str | None
    redaction: list[str]
    quarantined: bool
    expires_at: datetime | None
    created_at: datetime
    updated_at: datetime
    last_accessed_at: datetime | None
    access_count: int
    version: int
    supersedes: UUID | None
    superseded_by: UUID | None
    derived_from: list[UUID]
    embedding_status: str
    metadata: dict[str, Any] = Field(
        description="The writer's metadata; `{}` for a quarantined entry unless the caller holds "
        "memory.admin (withheld like its text)"
    )
    #: when what it records happened, as its writer said (None: not said)
    occurred_at: datetime | None = None
    #: its place in its session: only the order among one session's entries means anything
    session_position: int | None = None
    #: knowledge updates: when this entry became current by superseding ``supersedes``, and when
    #: a newer entry (``superseded_by``) replaced it (None: not known, or still current)
    valid_from: datetime | None = None
    valid_until: datetime | None = None


class _Scoped(Inbound):
    agent_config_id: UUID
    #: Only for service tokens acting on behalf of someone (SPEC 3, 8).
    principal: ActingFor = None


class ListRequest(_Scoped):
    """``engram.memory.list``: highest importance first, 20 per page by default.

    Without ``actor_ref`` it lists what the caller may see (SPEC 3); naming another owner needs
    ``memory.admin``."""

    actor_ref: str | None = Field(default=None, max_length=_ACTOR_REF_CHARS, pattern=_ACTOR_REF)
    lifecycle: list[Lifecycle] | None = Field(default=None, min_length=1, max_length=5)
    layer: Literal["memory", "observation"] | None = None
    memory_types: list[MemoryTypeName] | None = Field(default=None, min_length=1, max_length=50)
    min_importance: float | None = Field(default=None, ge=0, le=1)
    session_id: str | None = Field(default=None, min_length=1, max_length=200)
    metadata: dict[str, JsonValue] | None = Field(
        default=None,
        min_length=1,
        description="Only entries whose metadata contains this object (JSON containment: each key's "
        "value matches recursively, an array matches when it holds every listed element, a scalar "
        f"is equal); at most {MAX_METADATA_FILTER_BYTES} bytes as JSON, {MAX_METADATA_FILTER_DEPTH} "
        "levels deep",
    )
    page_size: Annotated[int, Field(ge=1, le=100), JSON_INTEGER] = 20
    page_token: str | None = Field(
        default=None, min_length=1, max_length=_MAX_PAGE_TOKEN, pattern=_PAGE_TOKEN
    )

    @field_validator("metadata")
    @classmethod
    def _bounded_metadata(cls, value: dict[str, JsonValue] | None) -> dict[str, JsonValue] | None:
        if value is not None:
            _check_json(value, 1)
            if len(json.dumps(value, separators=(",", ":"))) > MAX_METADATA_FILTER_BYTES:
                raise ValueError(f"the metadata filter exceeds {MAX_METADATA_FILTER_BYTES} bytes as JSON")
        return value


def _check_json(value: JsonValue, depth: int) -> None:
    """What Postgres's ``jsonb`` could not hold (NUL characters, non-finite numbers) or what nests
    too deep is refused here, so it is ``INVALID_REQUEST`` and never a database error."""
    if depth > MAX_METADATA_FILTER_DEPTH:
        raise ValueError(f"the metadata filter nests deeper than {MAX_METADATA_FILTER_DEPTH} levels")
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("the metadata filter holds a NUL character")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("the metadata filter holds a number that is not finite")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_json(key, depth)
            _check_json(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_json(item, depth + 1)


class ExportRequest(Inbound):
    """``engram.memory.export``: one owner's entries as JSON Lines pages, oldest first."""

    agent_config_id: UUID | None = None
    principal: ActingFor = None
    actor_ref: str = Field(max_length=_ACTOR_REF_CHARS, pattern=_ACTOR_REF)
    lifecycle: list[Lifecycle] | None = Field(default=None, min_length=1, max_length=5)
    page_size: Annotated[int, Field(ge=1, le=1000), JSON_INTEGER] = 100
    page_token: str | None = Field(
        default=None, min_length=1, max_length=_MAX_PAGE_TOKEN, pattern=_PAGE_TOKEN
    )


class Page(Outbound):
    """A page of entries; ``next_page_token`` is null on the last page."""

    entries: list[EntryView]
    next_page_token: str | None


class GetRequest(_Scoped):
    entry_id: UUID
    #: Also return the versions this entry superseded (edit history), newest first.
    history: bool = False


class GetReply(Outbound):
    entry: EntryView
    history: list[EntryView] = Field(default_factory=list)


class DeleteRequest(_Scoped):
    """``engram.memory.delete``: one entry, with everything derived from it and its versions."""

    entry_id: UUID


class PurgeRequest(Inbound):
    """``engram.memory.purge``: everything one owner has (optionally of one session)."""

    agent_config_id: UUID | None = None
    principal: ActingFor = None
    actor_ref: str = Field(max_length=_ACTOR_REF_CHARS, pattern=_ACTOR_REF)
    session_id: str | None = Field(default=None, min_length=1, max_length=200)


class PurgeReceipt(Outbound):
    """What an erasure removed, per store. ``vectors`` counts points deleted in this call; when the
    vector store lives in another process, the embed service deletes them on ``memory.purged``
    and ``vectors_deferred`` is true."""

    purge_id: UUID
    actor_ref: str | None
    session_id: str | None
    agent_config_ids: list[UUID]
    entries: int
    observations: int
    derived: int
    recall_records: int
    vectors: int
    vectors_deferred: bool
    cache_entries: int
    entry_ids: list[UUID]


class PruneRequest(Inbound):
    agent_config_id: UUID
    max_entries: Annotated[int, Field(ge=0, le=1_000_000), JSON_INTEGER]


class PruneReply(Outbound):
    deleted: int
    remaining: int


#: What each ``manage`` operation needs besides the entry (the validator's rule and the documents').
_MANAGE_NEEDS: dict[str, tuple[str, ...]] = {
    "edit": ("text",),
    "merge": ("text", "merge_with"),
    "rescope": ("owner",),
}


def _manage_rules() -> dict[str, Any]:
    """:class:`ManageRequest`'s validator in JSON Schema: an operation with what it needs, and
    ``ttl_seconds`` or ``expires_at``, not both."""
    ops: tuple[str, ...] = get_args(ManageOp)
    by_op = [
        {"properties": {"op": {"enum": [op for op in ops if op not in _MANAGE_NEEDS]}}},
        *(
            given(*names, when={"op": {"const": op}}, merge_with="array")
            for op, names in _MANAGE_NEEDS.items()
        ),
    ]
    return {"allOf": [{"anyOf": by_op}, {"anyOf": [absent("ttl_seconds"), absent("expires_at")]}]}


class ManageRequest(_Scoped):
    """``engram.memory.manage``: one operation on one entry (``merge``: on ``entry_id`` and
    ``merge_with``)."""

    model_config = ConfigDict(json_schema_extra=lambda schema: schema.update(_manage_rules()))

    entry_id: UUID
    op: ManageOp
    #: ``edit`` and ``merge``: the new text (through the write policy, like every save).
    text: str | None = Field(default=None, min_length=1, max_length=8_000)
    importance: float | None = Field(default=None, ge=0, le=1)
    #: ``merge``: the other entries folded into the new one.
    merge_with: list[UUID] | None = Field(default=None, min_length=1, max_length=50)
    #: ``rescope``: the new owner (``"none"`` = the shared pool).
    owner: str | None = Field(default=None, max_length=_ACTOR_REF_CHARS, pattern=_ACTOR_REF)
    #: ``change_retention``: a new lifetime from now, an absolute expiry, or neither (never expires).
    ttl_seconds: Annotated[int, Field(ge=1, le=MAX_TTL_SECONDS), JSON_INTEGER] | None = None
    expires_at: datetime | None = None

    @model_validator(mode="after")
    def _fields_of_op(self) -> ManageRequest:
        missing = [name for name in _MANAGE_NEEDS.get(self.op, ()) if getattr(self, name) is None]
        if missing:
            raise ValueError(f"op {self.op!r} needs {', '.join(missing)}")
        if self.ttl_seconds is not None and self.expires_at is not None:
            raise ValueError("give ttl_seconds or expires_at, not both")
        return self


class ManageReply(Outbound):
    op: str
    #: The entry as it is now (for ``edit``/``merge``: the new version; null when
    #: ``mark_incorrect`` took its reliability below the floor and it was deleted).
    entry: EntryView | None
    #: Every entry the operation changed (sources of a merge, the superseded version of an edit).
    affected: list[UUID]
