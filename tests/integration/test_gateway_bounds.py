"""The request bounds (docs/adr/0096-request-bounds.md) over HTTP and over NATS, and the
gateway's own refusals as the OpenAPI document states them: an integer past the column or date it
reaches, and text no store keeps, are a typed 400 — never INTERNAL; a wrong method answers 405
naming every method of its path; a URL past the parser's limit gets the SPEC 9 envelope;
``/metrics`` serves what the document says."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID, uuid4

import httpx
import pytest
from nats.aio.client import Client

from contracts.common import MAX_TTL_SECONDS, PG_INT4_MAX
from services.gateway.openapi import build_document
from tests.platform import request, session_payload

pytestmark = pytest.mark.integration


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _refused(reply: httpx.Response | dict[str, Any], loc: str | None = None) -> dict[str, Any]:
    """The reply is the SPEC 9 envelope with INVALID_REQUEST (over HTTP: status 400, JSON)."""
    if isinstance(reply, httpx.Response):
        assert reply.status_code == 400, (reply.status_code, reply.text[:300])
        assert reply.headers["content-type"].startswith("application/json")
        reply = reply.json()
    error: dict[str, Any] = reply["error"]
    assert (error["code"], error["status"]) == ("INVALID_REQUEST", 400), error
    if loc is not None:
        assert loc in json.dumps(error["details"]), error
    return error


@pytest.mark.parametrize("after_seq", [PG_INT4_MAX + 1, 2**63, 2**64, -1])
async def test_an_audit_sequence_past_int4_is_a_400(
    http: httpx.AsyncClient, nc: Client, service_token: str, after_seq: int
) -> None:
    """``GET /v1/audit?after_seq=2147483648`` (and 2**63) overflowed the int4 ``seq`` column
    into INTERNAL; now the model refuses it, over HTTP and NATS alike."""
    reply = await http.get("/v1/audit", params={"after_seq": after_seq}, headers=bearer(service_token))
    _refused(reply, "after_seq")
    _refused(await request(nc, "engram.audit.query", {"after_seq": after_seq}, service_token), "after_seq")


async def test_the_largest_audit_sequence_is_answered(http: httpx.AsyncClient, service_token: str) -> None:
    reply = await http.get("/v1/audit", params={"after_seq": PG_INT4_MAX}, headers=bearer(service_token))
    assert reply.status_code == 200, reply.text
    assert reply.json()["records"] == []


@pytest.mark.parametrize("name", ["memory_types", "session_id", "actor_ref", "page_token"])
async def test_nul_in_a_query_parameter_is_a_400(
    http: httpx.AsyncClient, service_token: str, agent: UUID, name: str
) -> None:
    """``?memory_types=a%00b``, ``?session_id=a%00b`` … answer INVALID_REQUEST."""
    url = f"/v1/memories?agent_config_id={agent}&{name}=a%00b"
    _refused(await http.get(url, headers=bearer(service_token)), name)


async def test_a_memory_type_filter_is_as_long_as_a_memory_type_may_be(
    http: httpx.AsyncClient, service_token: str, agent: UUID
) -> None:
    params = {"agent_config_id": str(agent), "memory_types": "x" * 65}
    _refused(await http.get("/v1/memories", params=params, headers=bearer(service_token)), "memory_types")
    params["memory_types"] = "x" * 64
    # Past validation: an agent config nothing was written to yet is not found.
    reply = await http.get("/v1/memories", params=params, headers=bearer(service_token))
    assert (reply.status_code, reply.json()["error"]["code"]) == (404, "NOT_FOUND"), reply.text


async def test_a_retention_past_the_calendar_is_a_400(
    http: httpx.AsyncClient, nc: Client, service_token: str, agent: UUID
) -> None:
    """``change_retention`` with a ``ttl_seconds`` whose expiry no date holds (``now +
    timedelta`` overflowed into INTERNAL) is refused, over HTTP and NATS; the longest allowed
    lifetime is applied. The same bound holds for the agent config's retention."""
    saved = await http.post(
        "/v1/memories",
        json={
            "agent_config_id": str(agent),
            "principal": {"kind": "end_user", "id": "alice"},
            "content": "Keeps receipts.",
            "wait": True,
        },
        headers=bearer(service_token),
    )
    assert saved.status_code == 200, saved.text
    entry = saved.json()["ids"][0]
    change = {
        "op": "change_retention",
        "principal": {"kind": "end_user", "id": "alice"},
        "agent_config_id": str(agent),
    }
    for ttl in (MAX_TTL_SECONDS + 1, 10**15, 2**63):
        body = {**change, "ttl_seconds": ttl}
        _refused(await http.patch(f"/v1/memories/{entry}", json=body, headers=bearer(service_token)), "ttl")
        over_nats = await request(nc, "engram.memory.manage", {**body, "entry_id": entry}, service_token)
        _refused(over_nats, "ttl_seconds")
    longest = await http.patch(
        f"/v1/memories/{entry}",
        json={**change, "ttl_seconds": MAX_TTL_SECONDS},
        headers=bearer(service_token),
    )
    assert longest.status_code == 200, longest.text
    expires = datetime.fromisoformat(longest.json()["entry"]["expires_at"])
    assert expires.year >= datetime.now(UTC).year + 99

    config = {"agent_config_id": str(agent), "config": {"retention": {"ttl_seconds": 10**15}}}
    _refused(await http.put("/v1/config", json=config, headers=bearer(service_token)), "ttl_seconds")


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("PUT", "/v1/memories", {"GET", "HEAD", "POST"}),
        ("POST", "/v1/memories/{entry_id}", {"DELETE", "GET", "HEAD", "PATCH"}),
        ("DELETE", "/v1/config", {"GET", "HEAD", "PUT"}),
        ("GET", "/v1/recall", {"POST"}),
    ],
)
async def test_a_405_names_every_method_of_the_path(
    http: httpx.AsyncClient, service_token: str, method: str, path: str, allowed: set[str]
) -> None:
    """``Allow`` lists every method the path has (it named only one operation's before): the
    document's, and HEAD beside GET, which Starlette answers as GET without a body."""
    documented = {m.upper() for m in build_document()["paths"][path]}
    assert documented | ({"HEAD"} if "GET" in documented else set()) == allowed
    reply = await http.request(method, path.format(entry_id=UUID(int=1)), headers=bearer(service_token))
    assert reply.status_code == 405, reply.text
    assert reply.json()["error"]["status"] == 405
    assert {m.strip() for m in reply.headers["allow"].split(",")} == allowed


@pytest.mark.parametrize("method", ["GET", "DELETE", "PATCH"])
async def test_an_empty_entry_id_is_a_404_envelope_not_a_redirect(
    http: httpx.AsyncClient, service_token: str, method: str
) -> None:
    """``/v1/memories/`` names no entry: NOT_FOUND in the envelope (Starlette once answered it with
    a bare 307 to ``/v1/memories``, another operation's route)."""
    reply = await http.request(method, "/v1/memories/", headers=bearer(service_token), follow_redirects=False)
    assert reply.status_code == 404, reply.text
    assert reply.json()["error"]["code"] == "NOT_FOUND"


async def test_the_console_prefix_alone_still_leads_to_the_console(http: httpx.AsyncClient) -> None:
    reply = await http.get("/console", follow_redirects=False)
    assert reply.status_code == 303
    assert reply.headers["location"] == "/console/"


async def _raw(gateway: str, head: bytes) -> tuple[bytes, bytes]:
    """Send ``head`` as it is (a client library refuses URLs this long); the status line and body."""
    url = urlsplit(gateway)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(head)
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    status, _, rest = answer.partition(b"\r\n")
    return status, rest.partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize("length", [70_000, 1_000_000])
async def test_a_url_past_the_parsers_limit_gets_the_envelope(gateway: str, length: int) -> None:
    """A URL over ~64 KiB was a plain-text 400 from uvicorn's parser: now the SPEC 9 envelope."""
    head = b"GET /v1/memories?session_id=" + b"a" * length + b" HTTP/1.1\r\nHost: engram\r\n\r\n"
    status, body = await _raw(gateway, head)
    assert status.startswith(b"HTTP/1.1 400"), status
    _refused(json.loads(body))


async def test_bytes_that_are_not_http_get_the_envelope(gateway: str) -> None:
    status, body = await _raw(gateway, b"\x00\x01 not http\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400"), status
    _refused(json.loads(body))


async def test_metrics_are_served_as_documented(http: httpx.AsyncClient) -> None:
    """``/metrics`` is the Prometheus text exposition, and the document says so (it said JSON)."""
    reply = await http.get("/metrics")
    assert reply.status_code == 200
    documented = build_document()["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(documented) == [reply.headers["content-type"].split(";")[0]] == ["text/plain"]
    assert "# TYPE" in reply.text


async def test_a_session_step_count_past_int4_is_refused(
    http: httpx.AsyncClient, service_token: str, org: UUID, agent: UUID
) -> None:
    session = session_payload(org, agent, steps=PG_INT4_MAX + 1, event_id=str(uuid4()))
    reply = await http.post("/v1/sessions", content=json.dumps(session), headers=bearer(service_token))
    _refused(reply, "steps")
