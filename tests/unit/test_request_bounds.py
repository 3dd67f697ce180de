"""Every integer and string a request may carry is bounded in its model, and therefore in the
documents (docs/adr/0084-request-bounds.md): no value reaches a column, a date or a reader it
overflows. The walk over the OpenAPI document fails for a new unbounded field; the cases below
fail without each bound."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest
from pydantic import ValidationError

from contracts.common import JSON_SAFE_INT_MAX, MAX_TTL_SECONDS, PG_INT4_MAX
from contracts.config import RetentionConfig, TypePolicy
from contracts.events import SessionEnded, ToolCall
from contracts.governance import ListRequest, ManageRequest
from contracts.ops import DeadLetterQuery
from contracts.recall import RecallFilters
from contracts.requests import AuditQuery, SaveEntry
from services.gateway.openapi import build_document
from tests.platform import session_payload

_BOUNDED_STRING = ("maxLength", "enum", "const", "format", "pattern")


def _unbounded(schema: dict[str, Any], schemas: dict[str, Any], where: str, seen: set[str]) -> list[str]:
    """Integers without a maximum and strings without a length (or a format, enum or pattern
    that bounds them) anywhere under ``schema``."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name in seen:
            return []
        seen.add(name)
        return _unbounded(schemas[name], schemas, name, seen)
    found: list[str] = []
    # Alternatives of a value (``X | None``); beside an object's own properties they are rules
    # between fields (``given``), which only narrow what the properties allow.
    for key in ("anyOf", "oneOf", "allOf") if "properties" not in schema else ():
        for alternative in schema.get(key, []):
            found += _unbounded(alternative, schemas, where, seen)
    kind = schema.get("type")
    if kind == "integer" and "maximum" not in schema and "const" not in schema:
        found.append(f"{where}: integer without a maximum")
    if kind == "string" and not any(k in schema for k in _BOUNDED_STRING):
        found.append(f"{where}: string without a bound")
    for name, item in schema.get("properties", {}).items():
        found += _unbounded(item, schemas, f"{where}.{name}", seen)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += _unbounded(schema[key], schemas, f"{where}[]", seen)
    return found


def test_every_request_integer_and_string_in_the_openapi_document_is_bounded() -> None:
    document = build_document()
    schemas = document["components"]["schemas"]
    found: list[str] = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            where = f"{method.upper()} {path}"
            for parameter in operation.get("parameters", []):
                schema = parameter.get("schema") or next(iter(parameter["content"].values()))["schema"]
                found += _unbounded(schema, schemas, f"{where} ?{parameter['name']}", set())
            if "requestBody" in operation:
                body = next(iter(operation["requestBody"]["content"].values()))["schema"]
                found += _unbounded(body, schemas, f"{where} body", set())
    assert found == []


@pytest.mark.parametrize(
    ("build", "largest"),
    [
        (lambda v: AuditQuery(after_seq=v), PG_INT4_MAX),
        (lambda v: DeadLetterQuery(before_seq=v), JSON_SAFE_INT_MAX),
        (
            lambda v: ManageRequest(
                entry_id=uuid4(), agent_config_id=uuid4(), op="change_retention", ttl_seconds=v
            ),
            MAX_TTL_SECONDS,
        ),
        (lambda v: RetentionConfig(ttl_seconds=v), MAX_TTL_SECONDS),
        (lambda v: TypePolicy(ttl_days=v), MAX_TTL_SECONDS // 86_400),
        (lambda v: ToolCall(tool="deploy", duration_ms=v), JSON_SAFE_INT_MAX),
        (lambda v: SessionEnded.model_validate(session_payload(uuid4(), uuid4(), steps=v)), PG_INT4_MAX),
    ],
    ids=["after_seq", "before_seq", "ttl_seconds", "retention", "ttl_days", "duration_ms", "steps"],
)
def test_an_integer_past_its_bound_is_refused(build: Any, largest: int) -> None:
    build(largest)
    for past in (largest + 1, 2**63, 2**64):
        with pytest.raises(ValidationError):
            build(past)


def test_the_longest_lifetime_is_a_date() -> None:
    """``now + MAX_TTL_SECONDS`` is a date Python (and so every store Engram writes) holds, for
    as long as Engram is likely to run."""
    assert datetime(2900, 1, 1, tzinfo=UTC) + timedelta(seconds=MAX_TTL_SECONDS) < datetime.max.replace(
        tzinfo=UTC
    )


@pytest.mark.parametrize(
    "build",
    [
        lambda t: SaveEntry(text="x", memory_type=t),
        lambda t: ListRequest(agent_config_id=uuid4(), memory_types=[t]),
        lambda t: RecallFilters(memory_types=[t]),
    ],
    ids=["save", "list", "recall"],
)
def test_a_memory_type_is_one_length_wherever_it_is_named(build: Any) -> None:
    build("x" * 64)
    for bad in ("x" * 65, ""):
        with pytest.raises(ValidationError):
            build(bad)
