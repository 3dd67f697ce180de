"""The thin client (``engram_client``) over both transports against the real services and gateway:
the same calls give the same typed replies over NATS and HTTP, errors are the typed exceptions of
their SPEC 9 codes either way, and the blocking client does what the async one does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from engram_client import (
    EngramClient,
    ErrorCode,
    Forbidden,
    NotFound,
    SyncEngramClient,
    Unauthenticated,
    Unavailable,
)
from engram_client.contracts.common import Principal
from engram_client.contracts.requests import SaveOutcome
from pydantic import ValidationError

from services.gateway.openapi import OPENAPI_FILE
from shared.runtime.settings import EngramSettings
from shared.security.auth import TokenService
from shared.service.infra import Infra
from tests.platform import session_payload

pytestmark = pytest.mark.integration

ALICE = {"kind": "end_user", "id": "alice"}


@pytest.fixture(params=["nats", "http"])
async def client(
    request: pytest.FixtureRequest,
    engram: Infra,
    settings: EngramSettings,
    gateway: str,
    service_token: str,
    platform_options: dict[str, Any],
) -> AsyncIterator[EngramClient]:
    if request.param == "nats":
        made = await EngramClient.connect(settings.nats_url, service_token, timeout=30, **platform_options)
    else:
        made = EngramClient.connect_http(gateway, service_token, timeout=30)
    async with made:
        yield made


async def test_every_kind_of_call_over_either_transport(client: EngramClient, org: UUID, agent: UUID) -> None:
    """A body (POST), a query with a list field and a principal (GET), a path field (GET, PATCH,
    DELETE), the whole-request method, paging and a waiting save: the same typed replies."""
    taken = await client.submit_session(session_payload(org, agent, tool_trace=[{"tool": "t", "error": "e"}]))
    assert taken.duplicate is False
    text = f"Alice drinks green tea ({uuid4().hex[:8]})."
    outcome = await client.save(agent, [{"text": text, "importance": 0.97}], principal=ALICE, wait=True)
    assert isinstance(outcome, SaveOutcome)
    (entry_id,) = outcome.ids
    page = await client.list_entries(agent, principal=ALICE, lifecycle=["active"], page_size=50)
    assert entry_id in {e.id for e in page.entries}
    assert (await client.get_entry(agent, entry_id, principal=ALICE, history=True)).entry.text == text
    assert (await client.manage(agent, entry_id, "pin", principal=ALICE)).entry.pinned
    exported = [e.id async for p in client.export("end_user:alice", agent_config_id=agent) for e in p.entries]
    assert entry_id in exported
    assert (await client.get_config(agent)).config is not None
    assert (await client.delete(agent, entry_id, principal=ALICE)).entries == 1
    with pytest.raises(NotFound) as gone:
        await client.get_entry(agent, entry_id, principal=ALICE)
    assert (gone.value.code, gone.value.status, gone.value.retryable) == (ErrorCode.NOT_FOUND, 404, False)
    assert (await client.audit_verify()).ok


async def test_errors_are_typed_over_either_transport(
    engram: Infra,
    settings: EngramSettings,
    gateway: str,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    service_token: str,
    platform_options: dict[str, Any],
) -> None:
    """A forged token, a token without the permission, and a request the client refuses before
    sending it: the same exception, code and status over NATS and over HTTP."""
    reader = tokens.mint(
        org_id=org, principal=Principal(kind="end_user", id="alice"), permissions={"memory.read"}
    )
    for transport in ("nats", "http"):
        forged: EngramClient
        if transport == "nats":
            forged = await EngramClient.connect(settings.nats_url, "forged", **platform_options)
            limited = await EngramClient.connect(settings.nats_url, reader, **platform_options)
        else:
            forged = EngramClient.connect_http(gateway, "forged")
            limited = EngramClient.connect_http(gateway, reader)
        async with forged, limited:
            with pytest.raises(Unauthenticated) as refused:
                await forged.get_config(agent)
            assert (refused.value.status, refused.value.retryable) == (401, False), transport
            with pytest.raises(Forbidden) as denied:
                await limited.put_config(agent, {"top_k": 3})
            assert denied.value.status == 403, transport
            with pytest.raises(ValidationError):  # the request model's verdict, before sending
                await limited.recall(agent, top_k=0, strategy="importance")


async def test_http_transport_names_an_unreachable_gateway(agent: UUID) -> None:
    """Nothing listening: UNAVAILABLE, retryable, rather than an httpx exception."""
    async with EngramClient.connect_http("http://127.0.0.1:9", "t", timeout=5) as client:
        with pytest.raises(Unavailable) as away:
            await client.get_config(agent)
    assert away.value.retryable


async def test_the_blocking_client_over_http_and_nats(
    engram: Infra,
    settings: EngramSettings,
    gateway: str,
    agent: UUID,
    service_token: str,
    platform_options: dict[str, Any],
) -> None:
    """SyncEngramClient runs the same calls without an event loop of the caller's (here: in a
    thread, as a script would; the services under test run on this test's loop)."""

    def run() -> list[int]:
        versions = []
        with SyncEngramClient.connect_http(gateway, service_token, timeout=30) as over_http:
            versions.append(over_http.get_config(agent).version)
        with SyncEngramClient.connect(
            settings.nats_url, service_token, timeout=30, **platform_options
        ) as over_nats:
            versions.append(over_nats.get_config(agent).version)
            with pytest.raises(NotFound):
                over_nats.get_entry(agent, uuid4())
        return versions

    first, second = await asyncio.to_thread(run)
    assert first == second


async def test_the_gateway_serves_its_openapi_document_and_docs(gateway: str) -> None:
    """GET /openapi.json is the checked-in document; /docs is Swagger UI from installed files
    (its scripts from this origin, no inline script, a policy that allows nothing else)."""
    async with httpx.AsyncClient(base_url=gateway, timeout=30) as http:
        document = await http.get("/openapi.json")
        assert document.status_code == 200
        assert document.content == OPENAPI_FILE.read_bytes()
        page = await http.get("/docs")
        assert page.status_code == 200
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert "<script>" not in page.text
        for asset in ("/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css", "/docs/start.js"):
            assert (await http.get(asset)).status_code == 200, asset
