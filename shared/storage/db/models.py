"""The Postgres tables: the source of truth. Qdrant and Redis are rebuilt from these.

``owner_key`` is ``""`` for the shared pool and ``"<kind>:<id>"`` otherwise; it exists so that
owner-scoped dedupe is one unique index that Postgres enforces under concurrency, instead of a
read-then-write race in application code.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB, TSVECTOR
from sqlmodel import Field, SQLModel

__all__ = [
    "AUDIT_HEADS",
    "AUDIT_LOG",
    "ENTRIES",
    "ERASURES",
    "INBOX",
    "LEXICAL_SCOPES",
    "LEXICAL_TERMS",
    "OUTBOX",
    "RECALLS",
    "WEBHOOKS",
    "WEBHOOK_DELIVERIES",
    "AuditHead",
    "AuditRecord",
    "Erasure",
    "InboxRecord",
    "MemoryConfigRow",
    "MemoryConfigVersion",
    "MemoryEntry",
    "OrgSettings",
    "Organization",
    "OutboxMessage",
    "RecallRecord",
    "RevokedToken",
]


def _ts(nullable: bool = False, index: bool = False) -> Any:
    return Field(
        default=None,
        sa_column=sa.Column(sa.DateTime(timezone=True), nullable=nullable, index=index),
    )


def _json(default: Any) -> Any:
    return Field(default_factory=default, sa_column=sa.Column(JSONB, nullable=False))


class MemoryEntry(SQLModel, table=True):
    __tablename__ = "memory_entries"
    __table_args__ = (
        # Owner-scoped exact-text dedupe (SPEC 4.3); superseded versions step out of the way.
        sa.Index(
            "uq_memory_entries_dedupe",
            "org_id",
            "agent_config_id",
            "owner_key",
            "fingerprint",
            unique=True,
            postgresql_where=sa.text("lifecycle <> 'superseded'"),
        ),
        sa.Index("ix_memory_entries_scope", "org_id", "agent_config_id", "owner_key", "created_at"),
        sa.Index("ix_memory_entries_importance", "org_id", "agent_config_id", "owner_key", "importance"),
        sa.Index("ix_memory_entries_search", "search", postgresql_using="gin"),
        # memory.list's metadata filter (``@>``): LangGraph items by namespace and key.
        sa.Index(
            "ix_memory_entries_metadata",
            "metadata",
            postgresql_using="gin",
            postgresql_ops={"metadata": "jsonb_path_ops"},
        ),
        sa.Index("ix_memory_entries_embedding", "embedding_status", "created_at"),
        sa.Index("ix_memory_entries_newest", "org_id", "agent_config_id", "pinned", "created_at"),
        sa.Index(
            "ix_memory_entries_important", "org_id", "agent_config_id", "pinned", "importance", "created_at"
        ),
        # Finding entries whose vector another embedder made (shared/adapters/vectors/coverage.py).
        sa.Index(
            "ix_memory_entries_embedded_with",
            "embedding_model",
            "embedding_dimension",
            postgresql_where=sa.text("embedding_status = 'indexed'"),
        ),
        # Recall's neighbourhood: the entries next to a hit in its session (migration 0007).
        sa.Index(
            "ix_memory_entries_session_position",
            "org_id",
            "agent_config_id",
            "owner_key",
            "session_id",
            "session_position",
            postgresql_where=sa.text("session_position IS NOT NULL"),
        ),
        # Knowledge-update and version links, looked up by erasure (migration 0009).
        sa.Index(
            "ix_memory_entries_supersedes", "supersedes", postgresql_where=sa.text("supersedes IS NOT NULL")
        ),
        sa.Index(
            "ix_memory_entries_superseded_by",
            "superseded_by",
            postgresql_where=sa.text("superseded_by IS NOT NULL"),
        ),
        # The retention sweeper reads only entries that expire, oldest expiry first.
        sa.Index(
            "ix_memory_entries_expiry", "expires_at", postgresql_where=sa.text("expires_at IS NOT NULL")
        ),
    )

    id: UUID = Field(primary_key=True)
    org_id: UUID = Field(index=True)
    agent_config_id: UUID
    owner_key: str = Field(default="", max_length=256)
    owner_kind: str | None = Field(default=None, max_length=16)
    owner_id: str | None = Field(default=None, max_length=200)
    session_id: str | None = Field(default=None, max_length=200)
    text: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    fingerprint: str = Field(max_length=64)
    importance: float
    reinforcement_count: int = 0
    memory_type: str = Field(max_length=64)
    layer: str = Field(default="memory", max_length=16)
    source: str = Field(max_length=16)
    source_agent: str | None = Field(default=None, max_length=200)
    confidence: float = 1.0
    reliability: float = 1.0
    lifecycle: str = Field(default="active", max_length=16)
    pinned: bool = False
    category: str | None = Field(default=None, max_length=64)
    confirmation: str | None = Field(default=None, max_length=64)
    sensitivity: str | None = Field(default=None, max_length=64)
    consent: str | None = Field(default=None, max_length=64)
    #: The typed placeholders the write policy applied, e.g. ``["EMAIL", "API_KEY"]``.
    redaction: list[str] = _json(list)
    quarantined: bool = False
    quarantine_reasons: list[str] = _json(list)
    #: Where the text came from (event id, request id, writer), for quarantine review.
    provenance: dict[str, Any] = _json(dict)
    expires_at: datetime | None = _ts(nullable=True)
    #: When what the entry records happened, as its writer said (a session's time); NULL: not said.
    occurred_at: datetime | None = _ts(nullable=True)
    #: Its place in its session (``session_id``): from the ``memory_entry_session_position``
    #: sequence in save order, so only the order within a session means anything; NULL without one.
    session_position: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger, nullable=True))
    created_at: datetime = _ts()
    updated_at: datetime = _ts()
    last_accessed_at: datetime | None = _ts(nullable=True)
    access_count: int = 0
    version: int = 1
    supersedes: UUID | None = None
    superseded_by: UUID | None = None
    #: Knowledge updates (migration 0009): when this entry's knowledge became current (it
    #: superseded another) and when it stopped being current (a newer entry superseded it).
    valid_from: datetime | None = _ts(nullable=True)
    valid_until: datetime | None = _ts(nullable=True)
    #: The entries a ``merge`` folded into this one: erasing any of them erases this one too.
    derived_from: list[str] = _json(list)
    embedding_status: str = Field(default="pending", max_length=16)
    #: The embedder (``Embedder.name``) and dimension that made the indexed vector; NULL before
    #: the first indexing (and for rows indexed before these columns existed: unknown).
    embedding_model: str | None = Field(default=None, max_length=200)
    embedding_dimension: int | None = None
    # ``metadata`` is reserved by SQLAlchemy's declarative base; the column keeps its wire name.
    meta: dict[str, Any] = Field(default_factory=dict, sa_column=sa.Column("metadata", JSONB, nullable=False))
    #: Lexical search (recall's ``hybrid`` and ``pack`` candidates): Postgres keeps it in step
    #: with ``text``; English stemming and stop words.
    search: Any = Field(
        default=None,
        sa_column=sa.Column("search", TSVECTOR, sa.Computed("to_tsvector('english', text)", persisted=True)),
    )


class Erasure(SQLModel, table=True):
    """A tombstone: what a purge or delete erased, so nothing derived from input older than the
    erasure is ever written again (a replayed session, a late elective save). Holds scope and
    fingerprints — hashes, never text."""

    __tablename__ = "erasures"
    __table_args__ = (sa.Index("ix_erasures_scope", "org_id", "agent_config_id", "owner_key"),)

    id: UUID = Field(primary_key=True)
    org_id: UUID
    #: None: every agent config of the organization.
    agent_config_id: UUID | None = None
    owner_key: str = Field(max_length=256)
    #: None: every session of the owner.
    session_id: str | None = Field(default=None, max_length=200)
    #: None: every text; else only these fingerprints (an entry delete).
    fingerprints: list[str] | None = Field(default=None, sa_column=sa.Column(JSONB, nullable=True))
    erased_at: datetime = _ts()
    reason: str = Field(max_length=32)


class RecallRecord(SQLModel, table=True):
    """One recall (SPEC 5.6): what was disclosed to whom, labelled by how the session went."""

    __tablename__ = "recall_records"
    __table_args__ = (sa.Index("ix_recall_records_session", "org_id", "agent_config_id", "session_id"),)

    pack_id: UUID = Field(primary_key=True)
    org_id: UUID
    agent_config_id: UUID
    caller_ref: str = Field(max_length=256)
    session_id: str | None = Field(default=None, max_length=200)
    strategy: str = Field(max_length=16)
    #: sha256 of the cue: enough to group recalls, not enough to read what was asked.
    cue_hash: str | None = Field(default=None, max_length=64)
    entry_ids: list[str] = _json(list)
    created_at: datetime = _ts()
    label: str | None = Field(default=None, max_length=16)
    label_source: str | None = Field(default=None, max_length=16)


class MemoryConfigRow(SQLModel, table=True):
    """The current memory config of an agent config (absent row = all defaults)."""

    __tablename__ = "memory_configs"

    agent_config_id: UUID = Field(primary_key=True)
    org_id: UUID = Field(index=True)
    version: int
    config: dict[str, Any] = _json(dict)
    updated_at: datetime = _ts()
    updated_by: str | None = None


class MemoryConfigVersion(SQLModel, table=True):
    """Every stored version of a memory config, for history and rollback."""

    __tablename__ = "memory_config_versions"

    agent_config_id: UUID = Field(primary_key=True)
    version: int = Field(primary_key=True)
    org_id: UUID
    config: dict[str, Any] = _json(dict)
    created_at: datetime = _ts()
    created_by: str | None = None


class OrgSettings(SQLModel, table=True):
    """Organization-level switches; ``memory_enabled=false`` turns every agent config off."""

    __tablename__ = "org_settings"

    org_id: UUID = Field(primary_key=True)
    memory_enabled: bool = True
    updated_at: datetime = _ts()


class Organization(SQLModel, table=True):
    """An organization registered through the admin API (``engram.admin.org.*``). Tokens of an
    organization never registered still work (organizations were implicit before); a disabled one's
    are refused (docs/adr/0104-admin-api.md)."""

    __tablename__ = "organizations"

    org_id: UUID = Field(primary_key=True)
    name: str = Field(max_length=200)
    created_at: datetime = _ts()
    created_by: str | None = Field(default=None, max_length=256)
    disabled_at: datetime | None = _ts(nullable=True)


class RevokedToken(SQLModel, table=True):
    """A token refused before it expires (by its ``jti``); kept until then."""

    __tablename__ = "revoked_tokens"

    token_id: str = Field(primary_key=True, max_length=128)
    org_id: UUID
    revoked_at: datetime = _ts()
    #: When the token would have expired anyway (null: not known, kept).
    expires_at: datetime | None = _ts(nullable=True)


class OutboxMessage(SQLModel, table=True):
    """An event committed with its effect, published by the relay with ``Nats-Msg-Id``."""

    __tablename__ = "outbox"

    id: int | None = Field(default=None, primary_key=True)
    event_id: UUID = Field(unique=True)
    subject: str = Field(max_length=256)
    payload: bytes = Field(sa_column=sa.Column(sa.LargeBinary, nullable=False))
    headers: dict[str, str] = _json(dict)
    created_at: datetime = _ts()


class InboxRecord(SQLModel, table=True):
    """An event a consumer has taken effect for; written in the same transaction as the effect."""

    __tablename__ = "inbox"

    consumer: str = Field(primary_key=True, max_length=64)
    event_id: str = Field(primary_key=True, max_length=128)
    processed_at: datetime = _ts()


class AuditRecord(SQLModel, table=True):
    """One append-only, hash-chained audit record; ``seq`` counts per organization."""

    __tablename__ = "audit_log"

    org_id: UUID = Field(primary_key=True)
    seq: int = Field(primary_key=True)
    id: UUID = Field(unique=True)
    kind: str = Field(max_length=64, index=True)
    occurred_at: datetime = _ts()
    actor_ref: str | None = Field(default=None, max_length=256)
    agent_config_id: UUID | None = None
    session_id: str | None = Field(default=None, max_length=200)
    entry_ids: list[str] = _json(list)
    details: dict[str, Any] = _json(dict)
    prev_hash: str = Field(max_length=64)
    hash: str = Field(max_length=64)


class AuditHead(SQLModel, table=True):
    """The newest link of each organization's chain; locked while a record is appended."""

    __tablename__ = "audit_heads"

    org_id: UUID = Field(primary_key=True)
    seq: int
    hash: str = Field(max_length=64)


# Core ``Table`` handles for the hot paths: statements built on these skip the ORM's unit of
# work and are compiled once (SQLModel leaves ``__table__`` untyped, hence the casts).
ENTRIES = cast(sa.Table, MemoryEntry.__table__)  # type: ignore[attr-defined]
OUTBOX = cast(sa.Table, OutboxMessage.__table__)  # type: ignore[attr-defined]
INBOX = cast(sa.Table, InboxRecord.__table__)  # type: ignore[attr-defined]
AUDIT_LOG = cast(sa.Table, AuditRecord.__table__)  # type: ignore[attr-defined]
AUDIT_HEADS = cast(sa.Table, AuditHead.__table__)  # type: ignore[attr-defined]
RECALLS = cast(sa.Table, RecallRecord.__table__)  # type: ignore[attr-defined]
ERASURES = cast(sa.Table, Erasure.__table__)  # type: ignore[attr-defined]

# An organization's webhooks and their deliveries (services/governance_audit/webhooks; migration 0009).
WEBHOOKS = sa.Table(
    "webhooks",
    SQLModel.metadata,
    sa.Column("id", sa.Uuid, primary_key=True),
    sa.Column("org_id", sa.Uuid, nullable=False, index=True),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("description", sa.Text),
    # The feed events delivered (None: all).
    sa.Column("events", JSONB),
    # The Standard Webhooks signing secret (whsec_…): answered once at registration, never again.
    sa.Column("secret", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)
WEBHOOK_DELIVERIES = sa.Table(
    "webhook_deliveries",
    SQLModel.metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("webhook_id", sa.Uuid, sa.ForeignKey("webhooks.id", ondelete="CASCADE"), nullable=False),
    sa.Column("org_id", sa.Uuid, nullable=False),
    sa.Column("event_id", sa.Uuid, nullable=False),
    # The feed event (memory.written, audit.memory.saved, …), its subject and its bytes (no text).
    sa.Column("event", sa.String(128), nullable=False),
    sa.Column("subject", sa.String(256), nullable=False),
    sa.Column("payload", sa.LargeBinary, nullable=False),
    # pending (first try or a retry), delivered, dead (dead-lettered; replayable)
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("last_error", sa.String(300)),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("delivered_at", sa.DateTime(timezone=True)),
    sa.UniqueConstraint("webhook_id", "event_id", name="uq_webhook_deliveries_event"),
    sa.Index(
        "ix_webhook_deliveries_due",
        "next_attempt_at",
        postgresql_where=sa.text("state = 'pending'"),
    ),
)

# hybrid's lexical statistics per owner scope (shared/text/lexical.py). Triggers keep them in step with
# memory_entries (migration 0006, which owns their definition); only read from Python.
LEXICAL_SCOPES = sa.Table(
    "lexical_scopes",
    SQLModel.metadata,
    sa.Column("org_id", sa.Uuid, primary_key=True),
    sa.Column("agent_config_id", sa.Uuid, primary_key=True),
    sa.Column("owner_key", sa.String(256), primary_key=True),
    sa.Column("docs", sa.BigInteger, nullable=False),
    sa.Column("lexemes", sa.BigInteger, nullable=False),
)
LEXICAL_TERMS = sa.Table(
    "lexical_terms",
    SQLModel.metadata,
    sa.Column("org_id", sa.Uuid, primary_key=True),
    sa.Column("agent_config_id", sa.Uuid, primary_key=True),
    sa.Column("lexeme", sa.Text, primary_key=True),
    sa.Column("owner_key", sa.String(256), primary_key=True),
    sa.Column("docs", sa.BigInteger, nullable=False),
)
