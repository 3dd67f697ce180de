"""How the gateway spreads a request over HTTP (``services/gateway/payloads.py``), generated from
the request models: which fields repeat in a query, how a principal is written, what a path
fixes, and the body limits — checked without a server (the routes themselves run against the
real stack in tests/integration/test_gateway.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import uuid4

import pytest
from engram_client.http_shape import HttpShape

from contracts.errors import InvalidRequest, PayloadTooLarge
from contracts.operations import MEMORY_EXPORT, MEMORY_GET, MEMORY_LIST, MEMORY_MANAGE, RECALL
from services.gateway.payloads import Shape, decode_object, read_limited


def test_shapes_follow_the_request_models() -> None:
    listing = Shape.of(MEMORY_LIST)
    assert listing.list_fields == {"lifecycle", "memory_types"}
    assert listing.principal_fields == {"principal"}
    assert not listing.in_body
    assert Shape.of(MEMORY_EXPORT).list_fields == {"lifecycle"}
    assert Shape.of(RECALL).in_body
    assert "entry_id" not in Shape.of(MEMORY_GET).query_fields


def test_a_query_becomes_the_request() -> None:
    shape = Shape.of(MEMORY_LIST)
    payload = shape.from_query(
        [
            ("agent_config_id", "a"),
            ("lifecycle", "active"),
            ("lifecycle", "stale"),
            ("principal", "end_user:al"),
        ],
        {},
    )
    assert payload == {
        "agent_config_id": "a",
        "lifecycle": ["active", "stale"],
        "principal": {"kind": "end_user", "id": "al"},
    }
    assert shape.from_query([("principal", "none")], {})["principal"] == {"kind": "none", "id": None}
    with pytest.raises(InvalidRequest, match="more than once"):
        shape.from_query([("page_size", "1"), ("page_size", "2")], {})
    with pytest.raises(InvalidRequest, match="path"):
        Shape.of(MEMORY_GET).from_query([("entry_id", "x")], {"entry_id": "y"})


def test_the_path_fixes_its_fields() -> None:
    shape = Shape.of(MEMORY_MANAGE)
    assert shape.with_path({"op": "pin"}, {"entry_id": "e"}) == {"op": "pin", "entry_id": "e"}
    assert shape.with_path({"entry_id": "e"}, {"entry_id": "e"}) == {"entry_id": "e"}
    with pytest.raises(InvalidRequest, match="differs"):
        shape.with_path({"entry_id": "other"}, {"entry_id": "e"})


def test_bodies_are_json_objects() -> None:
    assert decode_object(b"") == {}
    assert decode_object(b' {"a": 1} ') == {"a": 1}
    for bad in (b"{", b"[1]", b'"text"', b"\xff"):
        with pytest.raises(InvalidRequest):
            decode_object(bad)


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_body_limits_by_declared_length_and_while_streaming() -> None:
    assert await read_limited(_chunks(b"ab", b"cd"), "4", 4) == b"abcd"
    with pytest.raises(PayloadTooLarge):
        await read_limited(_chunks(), "5", 4)  # refused before reading anything
    with pytest.raises(PayloadTooLarge):
        await read_limited(_chunks(b"ab", b"cde"), None, 4)
    with pytest.raises(InvalidRequest, match="Content-Length"):
        await read_limited(_chunks(b"a"), "many", 4)


def test_what_the_client_writes_the_gateway_reads_back() -> None:
    """The thin client's HTTP request (``engram_client.http_shape``: path, repeated list
    parameters, a principal as its ref) is read back by the gateway as the same request."""
    agent, entry = uuid4(), uuid4()
    request = MEMORY_LIST.request.model_validate(
        {
            "agent_config_id": agent,
            "principal": {"kind": "end_user", "id": "alice"},
            "lifecycle": ["active", "disabled"],
            "page_size": 5,
            "min_importance": 0.25,
        }
    )
    sent = request.model_dump(mode="json", exclude_none=True)
    path, rest = HttpShape.of(MEMORY_LIST).path(sent)
    assert path == "/v1/memories"
    read = Shape.of(MEMORY_LIST).from_query(HttpShape.of(MEMORY_LIST).to_query(rest), {})
    assert MEMORY_LIST.request.model_validate(read) == request

    path, rest = HttpShape.of(MEMORY_GET).path({"agent_config_id": str(agent), "entry_id": str(entry)})
    assert (path, rest) == (f"/v1/memories/{entry}", {"agent_config_id": str(agent)})
