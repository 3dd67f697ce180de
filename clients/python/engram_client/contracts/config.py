"""Memory config per agent config (SPEC section 2), with its defaults."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engram_client.contracts.common import JSON_INTEGER, MAX_TTL_SECONDS, MemoryTypeName

__all__ = [
    "DEFAULT_EMBEDDING_MODEL",
    "ConfigPatchSchema",
    "MemoryConfig",
    "PolicyConfig",
    "RetentionConfig",
    "SemanticRecallConfig",
    "TypePolicy",
    "config_patch_schema",
    "deep_merge",
    "default_type_policies",
    "merge_config",
]

DEFAULT_EMBEDDING_MODEL = "all-MiniLM-L6-v2"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class RetentionConfig(_Strict):
    ttl_seconds: Annotated[int, Field(ge=1, le=MAX_TTL_SECONDS), JSON_INTEGER] | None = None
    max_entries: Annotated[int, Field(ge=1, le=1_000_000), JSON_INTEGER] = 500
    decay_strategy: Literal["hard_delete"] = "hard_delete"


class SemanticRecallConfig(_Strict):
    enabled: bool = True
    embedding_model: str = Field(default=DEFAULT_EMBEDDING_MODEL, min_length=1, max_length=200)
    #: How ``hybrid`` fuses its lexical (BM25) and vector rankings: ``convex`` combines their
    #: min-max normalized scores with equal weight, ``rrf`` fuses ranks (k=60). ``convex`` is the
    #: default because it measured clearly better on our recall evaluation (docs/adr/0033-hybrid-fusion.md).
    fusion: Literal["convex", "rrf"] = "convex"
    #: Whether ``hybrid`` brings the entries next to a hit in its session (saved with the same
    #: ``session_id`` and owner, up to two places before or after it): the next one gains half
    #: the hit's score, the one after a quarter, so a hit that is a fragment of a conversation
    #: brings its context (docs/adr/0035-hybrid-neighbourhood.md).
    neighbourhood: bool = True
    #: Whether ``hybrid`` puts first the entries that happened within a date the cue names
    #: ("on 9 November, 2022", "in May 2022"), by ``occurred_at``
    #: (docs/adr/0036-time-grounding.md).
    time_grounding: bool = True


class PolicyConfig(_Strict):
    memory_types_allowed: list[MemoryTypeName] | None = None
    relaxable: list[Annotated[str, Field(max_length=100)]] = Field(
        default_factory=lambda: ["memory_types_allowed", "diagnostics_verbosity"]
    )


class TypePolicy(_Strict):
    decay_on_failure: float = Field(default=0.7, ge=0, le=1)
    prune_below: float = Field(default=0.1, ge=0, le=1)
    ttl_days: Annotated[int, Field(ge=1, le=MAX_TTL_SECONDS // 86_400), JSON_INTEGER] | None = None
    version_on_edit: bool = False


def default_type_policies() -> dict[str, TypePolicy]:
    """Per-type defaults: procedural versions its edits, episodic expires after 90 days."""
    return {
        "procedural": TypePolicy(version_on_edit=True),
        "episodic": TypePolicy(ttl_days=90),
    }


class MemoryConfig(_Strict):
    """The whole memory config of one agent config. Unknown keys are refused."""

    memory_enabled: bool = True
    memory_write_enabled: bool = True
    memory_strategy: Literal["last_k", "importance", "full", "pack", "semantic", "hybrid"] = "last_k"
    top_k: Annotated[int, Field(ge=1, le=1000), JSON_INTEGER] = 10
    scope: Literal["workload", "actor", "session"] = "workload"
    pii_handling: Literal["redact", "block", "allow"] = "redact"
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    semantic_recall: SemanticRecallConfig = Field(default_factory=SemanticRecallConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    type_policies: dict[MemoryTypeName, TypePolicy] = Field(default_factory=default_type_policies)
    #: Keep each session's tool trace as ``layer="observation"`` entries (SPEC 4.1).
    keep_observations: bool = False
    #: Observations expire after this many days (short retention by design).
    observation_ttl_days: Annotated[int, Field(ge=1, le=365), JSON_INTEGER] = 7
    #: A new entry that updates or contradicts an older one of the same owner supersedes it
    #: (``valid_until`` on the old, ``valid_from`` on the new; SPEC 7.2). Off: every entry stays current.
    knowledge_updates: bool = True

    def type_policy(self, memory_type: str) -> TypePolicy:
        return self.type_policies.get(memory_type, TypePolicy())


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` laid onto ``base``: nested objects merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def merge_config(current: MemoryConfig, patch: dict[str, Any], *, strict: bool = False) -> MemoryConfig:
    """Apply a partial config: nested objects merge key by key; the result is validated whole —
    ``strict``ly for a patch a caller sent (``"false"`` is not a boolean, as the documents say)."""
    return MemoryConfig.model_validate(deep_merge(current.model_dump(mode="json"), patch), strict=strict)


def config_patch_schema() -> dict[str, Any]:
    """The JSON Schema of a config patch (``engram.config.put``'s ``config``): the memory config's
    own, every key optional (each has a default) — self-contained, its nested models inlined, so
    a document can place it in a request without the models' names."""
    schema = MemoryConfig.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    patch: dict[str, Any] = inline(schema)
    patch["title"] = "MemoryConfigPatch"
    return patch


class ConfigPatchSchema:
    """``Annotated`` metadata giving a field :func:`config_patch_schema` as its JSON Schema, made
    when a document asks for it — ``WithJsonSchema(config_patch_schema())`` would build the memory
    config's models whenever the module is imported (docs/adr/0092-commands-that-start-fast.md)."""

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        return config_patch_schema()

    def __hash__(self) -> int:
        return hash(ConfigPatchSchema)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConfigPatchSchema)
