"""The checked-in AsyncAPI document (``contracts/asyncapi.json``) matches the services and contracts."""

from __future__ import annotations

from typing import Any

import pytest

from contracts import subjects
from contracts.schema_export import render
from services.asyncapi import ASYNCAPI_FILE, build_document

REGENERATE = "run `python -m services.asyncapi` and commit contracts/asyncapi.json"

#: The subjects platforms and consumers use; each must be documented with its payload.
WIRE_SUBJECTS = (
    subjects.SESSION_ENDED,
    subjects.MEMORY_SAVE,
    subjects.CONFIG_GET,
    subjects.CONFIG_PUT,
    subjects.AUDIT_QUERY,
    subjects.AUDIT_VERIFY,
    subjects.MEMORY_WRITTEN,
    subjects.MEMORY_PURGED,
)


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return build_document()


def _resolve(doc: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """Follow local ``$ref`` pointers (``#/a/b/c``) to the object they name."""
    while "$ref" in node:
        target: Any = doc
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def test_checked_in_document_is_up_to_date(document: dict[str, Any]) -> None:
    """contracts/asyncapi.json equals what the routers and contract models generate today."""
    assert ASYNCAPI_FILE.is_file(), f"{ASYNCAPI_FILE} is missing; {REGENERATE}"
    assert ASYNCAPI_FILE.read_bytes().decode("utf-8") == render(document), f"out of date; {REGENERATE}"


@pytest.mark.parametrize("subject", WIRE_SUBJECTS)
def test_every_wire_subject_is_documented_with_its_payload(document: dict[str, Any], subject: str) -> None:
    """Each wire subject has a channel whose messages all carry a non-empty payload schema."""
    channels = [ch for ch in document["channels"].values() if ch["address"] == subject]
    assert channels, f"no channel for {subject}"
    for channel in channels:
        assert channel["messages"], f"{subject} has a channel without messages"
        for message in channel["messages"].values():
            payload = _resolve(document, _resolve(document, message)["payload"])
            assert payload.get("type") == "object", f"{subject}: payload is not an object schema"
            assert "properties" in payload, f"{subject}: payload schema has no properties"
