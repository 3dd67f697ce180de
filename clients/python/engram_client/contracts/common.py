"""Model bases and the principal, shared by every wire model."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

__all__ = [
    "ID_CHARS",
    "JSON_INTEGER",
    "JSON_SAFE_INT_MAX",
    "MAX_TEXT_CHARS",
    "MAX_TTL_SECONDS",
    "PG_INT4_MAX",
    "PRINCIPAL_REF_PATTERN",
    "SYSTEM_ORG",
    "ActingFor",
    "Inbound",
    "MemoryTypeName",
    "Outbound",
    "Principal",
    "PrincipalKind",
    "absent",
    "given",
]

PrincipalKind = Literal["none", "end_user", "actor", "service"]
#: The organization of records about input that named no organization Engram can trust (no valid
#: token): the deployment's, "operator-scoped" — no tenant is shown them, the deployment's operator
#: is (docs/adr/0082-operator-scoped-rejects.md).
SYSTEM_ORG = UUID(int=0)

# Bounds of the integers a request may carry (docs/adr/0096-request-bounds.md): each integer field
# of an inbound model names one, so no value reaches a column, a date or a reader it overflows —
# it is INVALID_REQUEST at the edge, and the OpenAPI and AsyncAPI documents state the bound.
#: Postgres ``integer`` (int4): a request value compared with such a column (the audit ``seq``).
PG_INT4_MAX = 2**31 - 1
#: The largest integer every JSON reader keeps exact (JavaScript's ``Number.MAX_SAFE_INTEGER``):
#: the bound of counts and sequences that reach no narrower column.
JSON_SAFE_INT_MAX = 2**53 - 1
#: The longest lifetime a request may give (100 years): ``now + ttl`` stays a date every store
#: holds (Python's ``datetime`` ends in year 9999; a larger ``timedelta`` overflows).
MAX_TTL_SECONDS = 100 * 365 * 86_400
#: The longest string any request field takes, unless the field says less.
MAX_TEXT_CHARS = 250_000
#: A memory type's name (``semantic``, ``procedural``, a platform's own): the one bound of every
#: field that names one, saved or filtered on.
MemoryTypeName = Annotated[str, Field(min_length=1, max_length=64)]

# Ids are opaque strings chosen by platforms; bound their size and forbid control characters
# and separators that would make ``actor_ref`` ambiguous.
ID_CHARS = r"[^\s:\x00-\x1f\x7f]{1,200}"
_ID_PATTERN = f"^{ID_CHARS}$"
#: A principal written as one string, ``"<kind>:<id>"`` or ``"none"`` (``?principal=`` in a query).
PRINCIPAL_REF_PATTERN = rf"^(none|(end_user|actor|service):{ID_CHARS})$"


def given(*names: str, when: dict[str, Any] | None = None, **types: str) -> dict[str, Any]:
    """JSON Schema for "each of ``names`` is present and not null" (``types``: its JSON type, so
    an explicit ``null`` does not count as given), with ``when``: other properties' schemas —
    how the documents state a model validator's rule that some fields go together
    (docs/adr/0096-request-bounds.md)."""
    properties = {**(when or {}), **{n: {"type": types.get(n, "string")} for n in names}}
    return {"required": list(names), "properties": properties}


def absent(name: str) -> dict[str, Any]:
    """JSON Schema for "``name`` is missing or null"."""
    return {"properties": {name: {"type": "null"}}}


def _json_integer(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


#: The last metadata of every integer field of a request, after its bounds
#: (``Annotated[int, Field(ge=…, le=…), JSON_INTEGER]``): JSON Schema counts ``5.0`` as an
#: integer, pydantic's strict mode does not, and requests are validated strictly (``true`` or
#: ``"5"`` is no integer; docs/adr/0096-request-bounds.md). After the bounds, so the documents
#: still state them.
JSON_INTEGER = BeforeValidator(_json_integer)


class Inbound(BaseModel):
    """What Engram receives: frozen, and unknown fields are an error, not silently ignored."""

    # Every string has a length bound (a field's own, else this one), below the smallest body
    # limit (256 KiB): a string one past its bound is still a body the edge reads, so it is
    # INVALID_REQUEST naming the field, not PAYLOAD_TOO_LARGE (docs/adr/0096-request-bounds.md).
    # ``defer_build``: a model's validator is built when it first validates, not when the module is
    # imported — a command that sends one request builds a few of the hundred-odd models, not all
    # (docs/adr/0092-commands-that-start-fast.md).
    model_config = ConfigDict(frozen=True, extra="forbid", str_max_length=MAX_TEXT_CHARS, defer_build=True)


class Outbound(BaseModel):
    """What Engram sends: frozen; readers should ignore fields they do not know."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)  # as Inbound's


class Principal(Inbound):
    """Who is asking or whom a memory belongs to: ``{kind, id}`` (``none`` has no id)."""

    # The validator's rule, in the documents: ``none`` without an id, every other kind with one.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"properties": {"kind": {"const": "none"}, "id": {"type": "null"}}},
                given("id", when={"kind": {"enum": ["end_user", "actor", "service"]}}),
            ]
        }
    )

    kind: PrincipalKind
    id: str | None = Field(default=None, max_length=200, pattern=_ID_PATTERN)

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


#: A request's ``principal``: whom a service token acts for — an end user, an actor or the shared
#: pool (``none``), never a service (the services refuse one: memories belong to no service).
ActingFor = Annotated[
    Principal | None,
    Field(
        json_schema_extra={
            "not": {"type": "object", "required": ["kind"], "properties": {"kind": {"const": "service"}}}
        }
    ),
]
