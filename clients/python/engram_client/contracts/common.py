"""Model bases and the principal, shared by every wire model."""

from __future__ import annotations

from typing import Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["SYSTEM_ORG", "Inbound", "Outbound", "Principal", "PrincipalKind"]

PrincipalKind = Literal["none", "end_user", "actor", "service"]
#: The organization of records about input that named no organization Engram can trust (no valid
#: token): the deployment's, "operator-scoped" — no tenant is shown them, the deployment's operator
#: is (docs/adr/0082-operator-scoped-rejects.md).
SYSTEM_ORG = UUID(int=0)

# Ids are opaque strings chosen by platforms; bound their size and forbid control characters
# and separators that would make ``actor_ref`` ambiguous.
_ID_PATTERN = r"^[^\s:\x00-\x1f\x7f]{1,200}$"


class Inbound(BaseModel):
    """What Engram receives: frozen, and unknown fields are an error, not silently ignored."""

    model_config = ConfigDict(frozen=True, extra="forbid", str_max_length=1_000_000)


class Outbound(BaseModel):
    """What Engram sends: frozen; readers should ignore fields they do not know."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class Principal(Inbound):
    """Who is asking or whom a memory belongs to: ``{kind, id}`` (``none`` has no id)."""

    kind: PrincipalKind
    id: str | None = Field(default=None, pattern=_ID_PATTERN)

    @model_validator(mode="after")
    def _id_matches_kind(self) -> Principal:
        if self.kind == "none" and self.id is not None:
            raise ValueError("principal kind 'none' takes no id")
        if self.kind != "none" and not self.id:
            raise ValueError(f"principal kind {self.kind!r} needs an id")
        return self

    @property
    def ref(self) -> str:
        """The ``actor_ref`` form: ``"<kind>:<id>"`` (``"none"`` for the shared principal)."""
        return self.kind if self.id is None else f"{self.kind}:{self.id}"

    @classmethod
    def parse_ref(cls, ref: str) -> Principal:
        kind, _, ident = ref.partition(":")
        return cls.model_validate({"kind": kind, "id": ident or None})
