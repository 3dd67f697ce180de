"""MCP over streamable HTTP: ``services.mcp.streamable_http_app`` served by uvicorn on a real port
and reached by the SDK's own HTTP client; the caller is each request's ``Authorization`` header."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from mcp.shared.exceptions import MCPError
from nats.aio.client import Client as Nats
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from services.mcp import Caller, streamable_http_app
from services.mcp.catalog import TOOLS
from shared.security.auth import TokenService
from shared.service.infra import Infra
from tests.conftest import TEST_KID, TEST_SECRET
from tests.integration.test_mcp import RW
from tests.mcp_clients import error_of, ok, over_http, serving
from tests.security.support import b64url, mint

pytestmark = pytest.mark.integration


@pytest.fixture
async def url(engram: Infra, nc: Nats, tokens: TokenService) -> AsyncIterator[str]:
    async with serving(streamable_http_app(nc, tokens)) as endpoint:
        yield endpoint


async def test_tools_over_http_act_as_the_bearer(
    url: str, tokens: TokenService, org: UUID, agent: UUID
) -> None:
    """Two agents of two organizations on one endpoint: each remembers and recalls its own, the
    other's ids are not found, and the other's agent config is forbidden."""
    alice = mint(tokens, org, "end_user:alice", RW)
    other_org, other_agent = uuid4(), uuid4()
    mallory = mint(tokens, other_org, "end_user:alice", RW)
    async with over_http(url, Caller(alice, agent)) as client:
        assert [t.name for t in (await client.list_tools()).tools] == [d.name for d in TOOLS]
        saved = ok(await client.call_tool("remember", {"text": "Invoices go out on the 3rd."}))
        recalled = ok(await client.call_tool("recall", {"strategy": "last_k"}))
        assert [r["id"] for r in recalled["results"]] == saved["ids"]
        assert "Invoices go out on the 3rd." in recalled["context"]
    async with over_http(url, Caller(mallory, other_agent)) as client:
        assert ok(await client.call_tool("recall", {"strategy": "last_k"}))["results"] == []
        assert ok(await client.call_tool("expand", {"ids": saved["ids"]}))["not_found"] == saved["ids"]
        assert (
            error_of(await client.call_tool("forget", {"entry_id": saved["ids"][0]}))["code"] == "NOT_FOUND"
        )
    async with over_http(url, Caller(mallory, agent)) as client:
        assert error_of(await client.call_tool("recall", {"strategy": "last_k"}))["code"] == "FORBIDDEN"
        assert error_of(await client.call_tool("list_memories", {}))["code"] == "FORBIDDEN"
    async with over_http(url, Caller(alice, agent)) as client:
        assert ok(await client.call_tool("expand", {"ids": saved["ids"]}))["ids"] == saved["ids"]


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "curl", "version": "1"},
    },
}


def _bad_tokens(tokens: TokenService, org: UUID) -> dict[str, str]:
    """Bearer tokens that must not open a session: none verifies."""
    alice = mint(tokens, org, "end_user:alice", RW)
    header, payload, signature = alice.split(".")
    unsigned = b64url(json.dumps({"alg": "none", "typ": "JWT", "kid": TEST_KID}).encode())
    return {
        "garbage": "forged.token.value",
        "expired": mint(tokens, org, "end_user:alice", RW, ttl_seconds=-60),
        "signed with another key": mint(
            TokenService({"k": secrets.token_urlsafe(48)}), org, "end_user:alice", RW
        ),
        "another issuer": mint(
            TokenService({TEST_KID: TEST_SECRET}, "not-engram"), org, "end_user:alice", RW
        ),
        "payload swapped": f"{header}.{mint(tokens, uuid4(), 'service:x', RW).split('.')[1]}.{signature}",
        "alg none": f"{unsigned}.{payload}.",
    }


async def test_bad_tokens_are_refused_at_initialize(
    url: str, tokens: TokenService, org: UUID, agent: UUID
) -> None:
    """No bearer, or one that does not verify (forged, expired, another key or issuer, a tampered
    payload, alg none): ``initialize`` itself is answered 401 with the SPEC 9 envelope and a Bearer
    challenge, before MCP — the SDK client never gets a session, let alone the tool list."""
    async with httpx.AsyncClient() as http:
        bare = await http.post(url, json=INITIALIZE)
        assert bare.status_code == 401
        assert bare.json()["error"]["code"] == "UNAUTHENTICATED"
        assert bare.headers["www-authenticate"] == "Bearer"
        for label, token in _bad_tokens(tokens, org).items():
            refused = await http.post(url, json=INITIALIZE, headers={"Authorization": f"Bearer {token}"})
            assert refused.status_code == 401, (label, refused.text)
            assert refused.json()["error"]["code"] == "UNAUTHENTICATED", label
            assert refused.headers["www-authenticate"] == 'Bearer error="invalid_token"', label
            listed = await http.post(
                url,
                json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert listed.status_code == 401, (label, listed.text)
    for label, token in _bad_tokens(tokens, org).items():
        # The SDK reports the 401 of its initialize request as an MCPError from its task group.
        with pytest.raises(ExceptionGroup) as refused:
            async with over_http(url, Caller(token, agent)) as client:
                await client.list_tools()
        assert refused.group_contains(MCPError, match="error response"), (label, refused.value)


async def test_bad_agent_configs_are_refused(url: str, tokens: TokenService, org: UUID) -> None:
    """A verified bearer without an agent config, or with one that is not a UUID: INVALID_REQUEST
    naming the header, as a tool error."""
    alice = mint(tokens, org, "end_user:alice", RW)
    async with over_http(url, Authorization=f"Bearer {alice}") as client:
        error: dict[str, Any] = error_of(await client.call_tool("recall", {}))
        assert error["code"] == "INVALID_REQUEST"
        assert "x-engram-agent-config" in error["message"]
    async with over_http(
        url, Authorization=f"Bearer {alice}", **{"X-Engram-Agent-Config": "not-a-uuid"}
    ) as client:
        assert error_of(await client.call_tool("recall", {}))["code"] == "INVALID_REQUEST"


async def test_mounted_in_a_gateway_app(
    engram: Infra, nc: Nats, tokens: TokenService, org: UUID, agent: UUID
) -> None:
    """The recipe for the HTTP gateway: the MCP app as the endpoint of its ``/mcp`` route, its
    lifespan entered by the gateway (which runs uvicorn with ``lifespan="off"``); the gateway's
    other routes are untouched."""
    mcp_app = streamable_http_app(nc, tokens)

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    gateway = Starlette(routes=[Route("/mcp", endpoint=mcp_app), Route("/healthz", healthz)])
    alice = mint(tokens, org, "end_user:alice", RW)
    async with mcp_app.router.lifespan_context(mcp_app), serving(gateway, lifespan="off") as url:
        async with over_http(url, Caller(alice, agent)) as client:
            saved = ok(await client.call_tool("remember", {"text": "The gateway serves MCP at /mcp."}))
            recalled = ok(await client.call_tool("recall", {"strategy": "last_k"}))
        async with httpx.AsyncClient() as http:
            health = await http.get(url.removesuffix("/mcp") + "/healthz")
            bare = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert [r["id"] for r in recalled["results"]] == saved["ids"]
    assert health.json() == {"status": "ok"}
    assert bare.status_code == 401


async def test_the_gateway_serves_mcp(gateway: str, tokens: TokenService, org: UUID, agent: UUID) -> None:
    """``engram serve gateway`` (here: the gateway in front of this module's services, under its own
    NATS identity) serves the MCP tools at ``/mcp``: the table's tools, acting as the bearer."""
    alice = mint(tokens, org, "end_user:alice", RW)
    async with over_http(f"{gateway}/mcp", Caller(alice, agent)) as client:
        assert [t.name for t in (await client.list_tools()).tools] == [d.name for d in TOOLS]
        saved = ok(await client.call_tool("remember", {"text": "The gateway answers MCP too."}))
        recalled = ok(await client.call_tool("recall", {"strategy": "last_k"}))
        assert ok(await client.call_tool("forget", {"entry_id": saved["ids"][0]}))["entries"] == 1
    assert [r["id"] for r in recalled["results"]] == saved["ids"]
    expired = mint(tokens, org, "end_user:alice", RW, ttl_seconds=-60)
    async with httpx.AsyncClient() as http:
        bare = await http.post(f"{gateway}/mcp", json=INITIALIZE)
        late = await http.post(
            f"{gateway}/mcp", json=INITIALIZE, headers={"Authorization": f"Bearer {expired}"}
        )
    assert bare.status_code == 401
    assert late.status_code == 401
    assert late.json()["error"]["code"] == "UNAUTHENTICATED"
