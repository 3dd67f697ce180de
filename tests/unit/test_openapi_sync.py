"""The checked-in OpenAPI document (``contracts/openapi.json``) is what the operation table
generates, is valid OpenAPI 3.1, and describes every route the gateway serves."""

from __future__ import annotations

from typing import Any

import pytest
from openapi_spec_validator import validate
from starlette.routing import Route

from contracts.operations import OPERATIONS
from contracts.schema_export import render
from services.gateway.app import routes
from services.gateway.openapi import OPENAPI_FILE, build_document

REGENERATE = "run `python -m services.gateway.openapi` and commit contracts/openapi.json"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return build_document()


def test_checked_in_document_is_up_to_date(document: dict[str, Any]) -> None:
    assert OPENAPI_FILE.is_file(), f"{OPENAPI_FILE} is missing; {REGENERATE}"
    assert OPENAPI_FILE.read_bytes().decode("utf-8") == render(document), f"out of date; {REGENERATE}"


def test_it_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    assert document["openapi"] == "3.1.0"
    validate(document)


def test_every_operation_is_documented(document: dict[str, Any]) -> None:
    for op in OPERATIONS:
        item = document["paths"][op.http_path][op.http_method.lower()]
        assert item["operationId"] == op.name
        assert item["x-nats-subject"] == op.subject
        assert {"4XX", "5XX"} <= item["responses"].keys()
    assert "202" in document["paths"]["/v1/sessions"]["post"]["responses"]


def test_the_document_and_the_gateway_have_the_same_routes(document: dict[str, Any]) -> None:
    """Every route the app serves is documented, and nothing else is (no bridge is needed to list
    them: routes are built without touching NATS)."""
    served = {
        (method.lower(), route.path)
        for route in routes(None, None)  # type: ignore[arg-type]
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    }
    documented = {(method, path) for path, item in document["paths"].items() for method in item}
    assert served == documented
