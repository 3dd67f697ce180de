"""Recall over request-reply (SPEC section 5): ``engram.recall``, ``engram.recall.expand`` and
``engram.memory.feedback``."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, get_args
from uuid import UUID

from pydantic import ConfigDict, Field, JsonValue

from contracts.common import ActingFor, Inbound, JsonInt, MemoryTypeName, Outbound, absent, given

__all__ = [
    "MAX_EXPAND_EXAMINED",
    "MAX_EXPAND_RETURNED",
    "SEMANTIC_MAX_TOP_K",
    "ExcludedResult",
    "ExpandReply",
    "ExpandRequest",
    "FeedbackReply",
    "FeedbackRequest",
    "RecallFilters",
    "RecallReply",
    "RecallRequest",
    "RecallResult",
    "Strategy",
]

Strategy = Literal["last_k", "importance", "full", "pack", "semantic", "hybrid"]
Format = Literal["text", "full", "compact", "narrative"]
TargetLayer = Literal["memory", "observation", "all"]

#: ``engram.recall.expand`` returns at most this many entries ...
MAX_EXPAND_RETURNED = 20
#: ... and examines at most this many requested ids per call (SPEC 5.3).
MAX_EXPAND_EXAMINED = 100


class RecallFilters(Inbound):
    """SPEC 5.5 filters; all of them narrow, none widens what the caller may see."""

    memory_types: list[MemoryTypeName] | None = Field(default=None, max_length=50)
    min_importance: float | None = Field(default=None, ge=0, le=1)
    min_confidence: float | None = Field(default=None, ge=0, le=1)
    source: list[Literal["distill", "elective", "append", "import"]] | None = None
    source_agent: str | None = Field(default=None, max_length=200)
    session_id: str | None = Field(default=None, max_length=200)
    created_after: datetime | None = None
    created_before: datetime | None = None


def _recall_rules() -> dict[str, Any]:
    """What the recall service refuses beyond the fields, for a strategy named in the request:
    ``semantic`` and ``hybrid`` need a cue with something in it, ``min_score`` needs one of them,
    ``semantic`` takes ``top_k`` up to 20 (``services/recall/service.py``)."""
    vector = ["semantic", "hybrid"]
    others: list[str | None] = [s for s in get_args(Strategy) if s not in vector]
    return {
        "allOf": [
            {
                "anyOf": [
                    {"properties": {"strategy": {"enum": [*others, None]}}},
                    {"required": ["cue"], "properties": {"cue": {"type": "string", "pattern": r"\S"}}},
                ]
            },
            {
                "anyOf": [
                    absent("min_score"),
                    {"required": ["strategy"], "properties": {"strategy": {"enum": vector}}},
                ]
            },
            {
                "anyOf": [
                    {"properties": {"strategy": {"enum": [*others, "hybrid", None]}}},
                    {"properties": {"top_k": {"anyOf": [{"type": "null"}, {"maximum": SEMANTIC_MAX_TOP_K}]}}},
                ]
            },
        ]
    }


#: ``semantic`` recall takes ``top_k`` up to this.
SEMANTIC_MAX_TOP_K = 20


class RecallRequest(Inbound):
    model_config = ConfigDict(json_schema_extra=lambda schema: schema.update(_recall_rules()))

    agent_config_id: UUID
    #: Only for service tokens acting on behalf of someone (SPEC 3, 8).
    principal: ActingFor = None
    session_id: str | None = Field(default=None, min_length=1, max_length=200)
    #: None uses the agent config's ``memory_strategy``.
    strategy: Strategy | None = None
    cue: str | None = Field(default=None, max_length=8_000)
    top_k: JsonInt | None = Field(default=None, ge=1, le=1000)
    #: A relevance floor for ``semantic`` and ``hybrid``: only entries whose cosine similarity to
    #: the cue is at least this (-1 to 1) are returned, so a cue nothing fits gets no results.
    #: Refused with any other strategy; a vector store that cannot answer is then an error, not
    #: a fallback (docs/adr/0037-min-score.md).
    min_score: float | None = Field(
        default=None,
        ge=-1.0,
        le=1.0,
        allow_inf_nan=False,
        description="semantic/hybrid only: the least cosine similarity to the cue an entry needs",
    )
    format: Format = "text"
    token_budget: JsonInt | None = Field(default=None, ge=1, le=1_000_000)
    target_layer: TargetLayer = "all"
    filters: RecallFilters | None = None
    diagnostics: Literal["summary", "candidates"] | None = None
    #: Only the axes the config lists in ``policy.relaxable`` (SPEC 5.4).
    policy_override: dict[str, Any] | None = None


class RecallResult(Outbound):
    """One recalled entry. ``text`` and ``full`` carry the SPEC 5 fields; ``compact`` and
    ``narrative`` carry fewer (id, text, score, and for compact the type) — which is why only
    ``id``, ``text`` and ``score`` are required. Fields a format does not carry are absent on the
    wire, so ``tokens_used`` counts exactly what was sent."""

    id: UUID
    text: str
    score: float
    memory_type: str | None = None
    layer: str | None = None
    importance: float | None = None
    created_at: datetime | None = None
    session_id: str | None = None
    metadata: dict[str, JsonValue] | None = None
    source: str | None = None
    reinforcement_count: int | None = None
    #: The text was shortened to fit the budget (SPEC 5.3); ``engram.recall.expand`` has it whole.
    content_truncated: bool = False
    #: Quarantined text is never returned; ``text`` is a bounded placeholder (SPEC 5.4).
    quarantined: bool = False


class ExcludedResult(Outbound):
    id: UUID
    session_id: str | None
    title: str


class RecallReply(Outbound):
    results: list[RecallResult]
    context: str
    strategy: Strategy
    pack_id: UUID | None
    count: int
    matched_count: int
    tokens_used: int
    truncated: bool
    warnings: list[str]
    excluded_by_budget: int | None = None
    excluded_results: list[ExcludedResult] | None = None
    excluded_results_truncated: bool | None = None
    minimum_budget: int | None = None
    diagnostics: dict[str, Any] | None = None


class ExpandRequest(Inbound):
    agent_config_id: UUID
    principal: ActingFor = None
    session_id: str | None = Field(default=None, min_length=1, max_length=200)
    ids: list[UUID] = Field(min_length=1, max_length=10_000)


class ExpandReply(Outbound):
    results: list[RecallResult]
    #: True when a cap (20 returned, 100 examined) left requested ids unprocessed.
    truncated: bool
    #: Requested ids that are not accessible to the caller (absent, foreign or not active).
    not_found: list[UUID]


class FeedbackRequest(Inbound):
    """``success`` for one entry (reliability decay) or a session rating (recall labels)."""

    model_config = ConfigDict(json_schema_extra={"anyOf": [given("entry_id"), given("session_id")]})

    agent_config_id: UUID
    principal: ActingFor = None
    entry_id: UUID | None = None
    session_id: str | None = Field(default=None, min_length=1, max_length=200)
    success: bool


class FeedbackReply(Outbound):
    updated: int
    deleted: int
    labelled: int
