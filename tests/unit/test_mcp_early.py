"""``engram mcp`` answers ``initialize`` before the MCP SDK is loaded (``services/mcp/early.py``):
its answer must be the SDK's own, for every protocol version it gives, and anything it is not sure
of must be left to the SDK."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from contracts.schema_export import render
from services.mcp.early import INITIALIZE_RECORD, answer_for, load_record
from services.mcp.initialize_export import build_record, initialize_request, sdk_answer

REGENERATE = "run `make schema` and commit services/mcp/initialize.json"


def _line(message: dict[str, Any]) -> bytes:
    return (json.dumps(message) + "\n").encode()


@pytest.fixture(scope="module")
def record() -> dict[str, Any]:
    return load_record()


def test_the_record_is_what_the_sdk_answers() -> None:
    """An SDK upgrade, or a change to the server's name, instructions or capabilities, without
    regenerating the record fails here."""
    assert INITIALIZE_RECORD.is_file(), f"{INITIALIZE_RECORD} is missing; {REGENERATE}"
    assert INITIALIZE_RECORD.read_bytes().decode("utf-8") == render(build_record()), REGENERATE


@pytest.mark.parametrize("version", HANDSHAKE_PROTOCOL_VERSIONS)
@pytest.mark.parametrize("request_id", [7, "req-7"])
def test_the_early_answer_is_the_sdks_answer(record: dict[str, Any], version: str, request_id: Any) -> None:
    request = {**initialize_request(version), "id": request_id}
    request["params"] = {**request["params"], "capabilities": {"roots": {"listChanged": True}}}
    assert answer_for(_line(request), record) == sdk_answer(request)


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        {"jsonrpc": "2.0", "method": "initialize", "params": initialize_request("2025-06-18")["params"]},
        {**initialize_request("2025-06-18"), "id": True},
        {**initialize_request("2025-06-18"), "jsonrpc": "1.0"},
        initialize_request("1999-01-01"),
        *(initialize_request(version) for version in MODERN_PROTOCOL_VERSIONS),
        {**initialize_request("2025-06-18"), "params": {"protocolVersion": "2025-06-18", "capabilities": {}}},
        {
            **initialize_request("2025-06-18"),
            "params": {"protocolVersion": "2025-06-18", "clientInfo": {"name": "x", "version": "1"}},
        },
        {
            **initialize_request("2025-06-18"),
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "x", "version": 1},
            },
        },
    ],
    ids=[
        "not-initialize",
        "a-notification",
        "boolean-id",
        "not-json-rpc-2",
        "unknown-version",
        *(f"modern-{v}" for v in MODERN_PROTOCOL_VERSIONS),
        "no-client-info",
        "no-capabilities",
        "client-version-not-text",
    ],
)
def test_what_it_is_not_sure_of_is_left_to_the_sdk(record: dict[str, Any], message: dict[str, Any]) -> None:
    assert answer_for(_line(message), record) is None


@pytest.mark.parametrize("line", [b"", b"\n", b"{not json\n", b"[1, 2]\n", b'"initialize"\n'])
def test_lines_that_are_no_request_are_left_to_the_sdk(record: dict[str, Any], line: bytes) -> None:
    assert answer_for(line, record) is None
