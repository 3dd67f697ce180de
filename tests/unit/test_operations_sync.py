"""The checked-in operation table (``contracts/operations.json``) is what the table and the error
codes generate, and every model it names is described where it says."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contracts.errors import ErrorCode
from contracts.operations import OPERATIONS, STREAMS
from contracts.operations_export import OPERATIONS_FILE, build_document
from contracts.schema_export import SCHEMA_DIR, render
from services.gateway.openapi import OPENAPI_FILE

REGENERATE = "run `make schema` and commit contracts/operations.json and clients/typescript/src/generated"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return build_document()


def test_checked_in_document_is_up_to_date(document: dict[str, Any]) -> None:
    """A change to the table or the error codes without regenerating the file fails here."""
    assert OPERATIONS_FILE.is_file(), f"{OPERATIONS_FILE} is missing; {REGENERATE}"
    assert OPERATIONS_FILE.read_bytes().decode("utf-8") == render(document), f"out of date; {REGENERATE}"


def test_every_operation_public_stream_and_error_code_is_listed(document: dict[str, Any]) -> None:
    """The document holds the whole table (internal streams aside) and every SPEC 9 code once."""
    assert [op["subject"] for op in document["operations"]] == [op.subject for op in OPERATIONS]
    assert [s["subject"] for s in document["streams"]] == [s.subject for s in STREAMS if s.public]
    assert [e["code"] for e in document["errors"]] == [code.value for code in ErrorCode]
    retryable = {e["code"] for e in document["errors"] if e["retryable"]}
    assert retryable == {"RATE_LIMITED", "VECTOR_UNAVAILABLE", "UNAVAILABLE"}


def test_named_models_are_described_in_the_checked_in_schemas(document: dict[str, Any]) -> None:
    """Operation models are OpenAPI components; stream payloads are JSON
    Schema files: a client generating types from those finds every name."""
    components = json.loads(OPENAPI_FILE.read_text())["components"]["schemas"]
    for op in document["operations"]:
        for name in (op["request"], *op["replies"]):
            assert name in components, f"{op['name']}: {name} is not in contracts/openapi.json"
    for stream in document["streams"]:
        assert (SCHEMA_DIR / f"{stream['payload']}.json").is_file(), stream["payload"]
