"""The HTTP gateway against the real stack (NATS with authentication, the services, Postgres):
every route of the operation table, the session publish, the probes, and the errors — always the
SPEC 9 envelope with its status, never a 500."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from pydantic import SecretStr

from contracts.operations import OPERATIONS
from services.gateway.server import running_gateway
from services.runtime import running_services
from shared.messaging.wire import MAX_REQUEST_BYTES
from shared.runtime.settings import EngramSettings
from shared.security.nats_auth.permissions import SERVICES
from tests.platform import eventually, session_payload
from tests.support.servers import secured_nats_server

pytestmark = pytest.mark.integration

ALICE = {"kind": "end_user", "id": "alice"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _save(http: httpx.AsyncClient, token: str, agent: UUID, *texts: str) -> list[str]:
    reply = await http.post(
        "/v1/memories",
        json={
            "agent_config_id": str(agent),
            "principal": ALICE,
            "entries": [{"text": t, "importance": 0.9 - i / 10} for i, t in enumerate(texts)],
            "wait": True,
        },
        headers=bearer(token),
    )
    assert reply.status_code == 200, reply.text
    ids: list[str] = reply.json()["ids"]
    assert len(ids) == len(texts)
    return ids


def _error(reply: httpx.Response, code: str, status: int) -> dict[str, Any]:
    """The reply is the SPEC 9 envelope with ``code``, its status the HTTP status."""
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    error: dict[str, Any] = reply.json()["error"]
    assert (error["code"], error["status"]) == (code, status)
    return error


async def test_sessions_are_published_and_distilled(
    http: httpx.AsyncClient, service_token: str, org: UUID, agent: UUID
) -> None:
    """POST /v1/sessions answers 202 once ingest has handed the session on; the same event_id
    again is a duplicate; the session is distilled (its audit record shows up over GET
    /v1/audit)."""
    session = session_payload(org, agent, tool_trace=[{"tool": "deploy", "input": {}, "error": "quota"}])
    body = json.dumps(session, default=str)
    first = await http.post("/v1/sessions", content=body, headers=bearer(service_token))
    assert first.status_code == 202, first.text
    assert first.json()["event_id"] == str(session["event_id"])
    assert first.json()["stream_seq"] > 0
    assert first.json()["duplicate"] is False
    again = await http.post("/v1/sessions", content=body, headers=bearer(service_token))
    assert again.status_code == 202
    assert again.json()["duplicate"] is True
    assert again.json()["stream_seq"] is None

    async def distilled() -> bool:
        reply = await http.get(
            "/v1/audit", params={"kind": "distill.completed"}, headers=bearer(service_token)
        )
        assert reply.status_code == 200, reply.text
        return any(r["session_id"] == session["session_id"] for r in reply.json()["records"])

    await eventually(distilled, what="the session published over HTTP distilled")


async def test_save_recall_expand_feedback(http: httpx.AsyncClient, service_token: str, agent: UUID) -> None:
    """POST /v1/memories (202 accepted, or 200 with wait), /v1/recall, /v1/recall/expand, /v1/feedback."""
    accepted = await http.post(
        "/v1/memories",
        json={"agent_config_id": str(agent), "principal": ALICE, "content": "Uses vim."},
        headers=bearer(service_token),
    )
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["status"] == 202
    first, second = await _save(http, service_token, agent, "Prefers dark mode.", "Works in Berlin.")

    recall = await http.post(
        "/v1/recall",
        json={"agent_config_id": str(agent), "principal": ALICE, "strategy": "importance", "top_k": 2},
        headers=bearer(service_token),
    )
    assert recall.status_code == 200, recall.text
    assert [r["id"] for r in recall.json()["results"]] == [first, second]
    assert "<engram-memory" in recall.json()["context"]

    expand = await http.post(
        "/v1/recall/expand",
        json={"agent_config_id": str(agent), "principal": ALICE, "ids": [second, str(uuid4())]},
        headers=bearer(service_token),
    )
    assert expand.status_code == 200, expand.text
    assert [r["text"] for r in expand.json()["results"]] == ["Works in Berlin."]
    assert len(expand.json()["not_found"]) == 1

    feedback = await http.post(
        "/v1/feedback",
        json={"agent_config_id": str(agent), "principal": ALICE, "entry_id": second, "success": False},
        headers=bearer(service_token),
    )
    assert feedback.status_code == 200, feedback.text
    assert feedback.json()["updated"] == 1


async def test_list_get_manage_delete(http: httpx.AsyncClient, service_token: str, agent: UUID) -> None:
    """GET /v1/memories (query parameters, repeated list values, page tokens), GET, PATCH and
    DELETE /v1/memories/{entry_id}."""
    first, second, third = await _save(http, service_token, agent, "One.", "Two.", "Three.")
    query = [
        ("agent_config_id", str(agent)),
        ("principal", "end_user:alice"),
        ("page_size", "2"),
        ("lifecycle", "active"),
        ("lifecycle", "stale"),
    ]
    page = await http.get("/v1/memories", params=query, headers=bearer(service_token))
    assert page.status_code == 200, page.text
    assert [e["id"] for e in page.json()["entries"]] == [first, second]
    rest = await http.get(
        "/v1/memories",
        params=[*query, ("page_token", page.json()["next_page_token"])],
        headers=bearer(service_token),
    )
    assert [e["id"] for e in rest.json()["entries"]] == [third]
    assert rest.json()["next_page_token"] is None

    scoped = {"agent_config_id": str(agent), "principal": "end_user:alice"}
    got = await http.get(f"/v1/memories/{first}", params=scoped, headers=bearer(service_token))
    assert got.status_code == 200, got.text
    assert got.json()["entry"]["text"] == "One."

    pinned = await http.patch(
        f"/v1/memories/{first}",
        json={"agent_config_id": str(agent), "principal": ALICE, "op": "pin"},
        headers=bearer(service_token),
    )
    assert pinned.status_code == 200, pinned.text
    assert pinned.json()["entry"]["pinned"] is True
    edited = await http.patch(
        f"/v1/memories/{second}",
        json={"agent_config_id": str(agent), "principal": ALICE, "op": "edit", "text": "Two, edited."},
        headers=bearer(service_token),
    )
    assert edited.status_code == 200, edited.text
    assert edited.json()["entry"]["text"] == "Two, edited."
    history = await http.get(
        f"/v1/memories/{second}", params={**scoped, "history": "true"}, headers=bearer(service_token)
    )
    assert history.status_code == 200, history.text
    assert history.json()["entry"]["version"] == 2
    bad_flag = await http.get(
        f"/v1/memories/{second}", params={**scoped, "history": "perhaps"}, headers=bearer(service_token)
    )
    _error(bad_flag, "INVALID_REQUEST", 400)

    deleted = await http.delete(f"/v1/memories/{third}", params=scoped, headers=bearer(service_token))
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["entry_ids"] == [third]
    gone = await http.get(f"/v1/memories/{third}", params=scoped, headers=bearer(service_token))
    _error(gone, "NOT_FOUND", 404)


async def test_list_takes_a_metadata_filter_as_json_in_the_query(
    http: httpx.AsyncClient, service_token: str, agent: UUID
) -> None:
    """GET /v1/memories?metadata={...} (the object as JSON, as the OpenAPI document says) filters
    like ``metadata`` on NATS; a value that is no JSON object is a 400 INVALID_REQUEST."""
    saved = await http.post(
        "/v1/memories",
        json={
            "agent_config_id": str(agent),
            "principal": ALICE,
            "entries": [{"text": "In thread one.", "metadata": {"thread": "t1"}}, {"text": "Elsewhere."}],
            "wait": True,
        },
        headers=bearer(service_token),
    )
    assert saved.status_code == 200, saved.text
    scoped = [("agent_config_id", str(agent)), ("principal", "end_user:alice")]
    page = await http.get(
        "/v1/memories", params=[*scoped, ("metadata", '{"thread": "t1"}')], headers=bearer(service_token)
    )
    assert page.status_code == 200, page.text
    assert [e["text"] for e in page.json()["entries"]] == ["In thread one."]
    for bad in ("thread", "{", "[1]", "{}"):
        reply = await http.get(
            "/v1/memories", params=[*scoped, ("metadata", bad)], headers=bearer(service_token)
        )
        _error(reply, "INVALID_REQUEST", 400)


async def test_export_streams_every_page_as_json_lines(
    http: httpx.AsyncClient, service_token: str, agent: UUID
) -> None:
    """GET /v1/export follows the page tokens itself: one entry per line, oldest first."""
    ids = await _save(http, service_token, agent, "A.", "B.", "C.")
    async with http.stream(
        "GET",
        "/v1/export",
        params={"actor_ref": "end_user:alice", "agent_config_id": str(agent), "page_size": "1"},
        headers=bearer(service_token),
    ) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("application/jsonl")
        lines = [json.loads(line) async for line in reply.aiter_lines() if line]
    assert sorted(e["id"] for e in lines) == sorted(ids)
    assert all(e["owner"] == ALICE for e in lines)


async def test_purge_prune_config_audit(http: httpx.AsyncClient, service_token: str, agent: UUID) -> None:
    """POST /v1/purge, POST /v1/prune, GET|PUT /v1/config, GET /v1/audit, POST /v1/audit/verify."""
    put = await http.put(
        "/v1/config",
        json={"agent_config_id": str(agent), "config": {"top_k": 7}},
        headers=bearer(service_token),
    )
    assert put.status_code == 200, put.text
    got = await http.get("/v1/config", params={"agent_config_id": str(agent)}, headers=bearer(service_token))
    assert got.json()["config"]["top_k"] == 7

    await _save(http, service_token, agent, "X.", "Y.", "Z.")
    pruned = await http.post(
        "/v1/prune", json={"agent_config_id": str(agent), "max_entries": 2}, headers=bearer(service_token)
    )
    assert pruned.status_code == 200, pruned.text
    assert pruned.json() == {"deleted": 1, "remaining": 2}
    purged = await http.post(
        "/v1/purge",
        json={"actor_ref": "end_user:alice", "agent_config_id": str(agent)},
        headers=bearer(service_token),
    )
    assert purged.status_code == 200, purged.text
    assert purged.json()["entries"] == 2

    audit = await http.get(
        "/v1/audit", params={"kind": "memory.purged", "limit": "10"}, headers=bearer(service_token)
    )
    assert audit.status_code == 200, audit.text
    assert audit.json()["records"]
    verify = await http.post("/v1/audit/verify", headers=bearer(service_token))
    assert verify.status_code == 200, verify.text
    assert verify.json()["ok"] is True


async def test_every_operation_has_its_route(http: httpx.AsyncClient) -> None:
    """Each route of the table exists with its method (an anonymous call is refused 401, not 404
    or 405)."""
    for method, path in [(op.http_method, op.http_path) for op in OPERATIONS]:
        reply = await http.request(method, path.replace("{entry_id}", str(uuid4())))
        _error(reply, "UNAUTHENTICATED", 401)
        assert reply.headers["www-authenticate"] == "Bearer"


async def test_probes(http: httpx.AsyncClient) -> None:
    assert (await http.get("/healthz")).json() == {"status": "ok"}
    ready = await http.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"nats": True, **dict.fromkeys(SERVICES, True)}


def _sample(text: str, name: str, labels: str) -> float:
    """A sample's value from a Prometheus text exposition (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_metrics_count_requests_by_route_and_status(
    http: httpx.AsyncClient, service_token: str, agent: UUID
) -> None:
    """``GET /metrics`` on the gateway: its recalls are counted by route and status, a refused
    one under its own status; no label carries an id."""
    ok, refused = 'route="recall",status="200"', 'route="recall",status="401"'
    before = (await http.get("/metrics")).text
    body = {"agent_config_id": str(agent), "strategy": "last_k"}
    for _ in range(3):
        assert (await http.post("/v1/recall", json=body, headers=bearer(service_token))).status_code == 200
    assert (await http.post("/v1/recall", json=body)).status_code == 401
    after = await http.get("/metrics")
    assert after.status_code == 200
    assert after.headers["content-type"].startswith("text/plain")
    count = "engram_http_requests_total"
    assert _sample(after.text, count, ok) - _sample(before, count, ok) == 3
    assert _sample(after.text, count, refused) - _sample(before, count, refused) == 1
    assert str(agent) not in after.text


async def test_readyz_fails_while_no_service_answers(
    settings: EngramSettings, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A gateway whose NATS has no services behind it is live but not ready, and says retry
    (503) to a request and to a session publish (no stream answers, as while a stream elects a
    new leader)."""
    async with secured_nats_server(tmp_path_factory.mktemp("lonely")) as server:
        assert server.gateway is not None
        lonely = settings.model_copy(update={"nats_url": server.url, "http_port": 0})
        async with (
            running_gateway(lonely, server.gateway.seed) as running,
            httpx.AsyncClient(base_url=running.url) as client,
        ):
            assert (await client.get("/healthz")).status_code == 200
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["checks"] == {"nats": True, **dict.fromkeys(SERVICES, False)}
            save = await client.post("/v1/recall", json={}, headers=bearer("anything"))
            _error(save, "UNAVAILABLE", 503)
            session = session_payload(uuid4(), uuid4())
            published = await client.post("/v1/sessions", json=session, headers=bearer("anything"))
            _error(published, "UNAVAILABLE", 503)


async def test_readyz_needs_every_service_distill_and_embed_included(
    settings: EngramSettings, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """/readyz checks all five services, each under its own NATS identity: with ingest, recall and
    governance-audit running it is 503 and names distill and embed (which serve no request of the
    table); once they run too it is 200."""
    async with secured_nats_server(tmp_path_factory.mktemp("partial")) as server, AsyncExitStack() as stack:
        assert server.gateway is not None
        base = settings.model_copy(
            update={"nats_url": server.url, "http_port": 0, "data_dir": tmp_path_factory.mktemp("vectors")}
        )

        async def start(service: str) -> None:
            seed = SecretStr(server.service_seeds[service])
            # Qdrant Edge opens in one process: embed's; recall runs without vectors here.
            vectors = "" if service == "embed" else "none"
            own = base.model_copy(update={"nats_nkey_seed": seed, "vector_store": vectors})
            await stack.enter_async_context(running_services(own, [service]))

        running = await stack.enter_async_context(running_gateway(base, server.gateway.seed))
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=running.url))
        for service in ("ingest", "recall", "governance-audit"):
            await start(service)
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"] == {
            "nats": True,
            **dict.fromkeys(SERVICES, True),
            "distill": False,
            "embed": False,
        }
        for service in ("distill", "embed"):
            await start(service)
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json() == {"status": "ready", "checks": {"nats": True, **dict.fromkeys(SERVICES, True)}}


async def test_readyz_counts_embed_in_a_deployment_without_a_vector_store(
    settings: EngramSettings, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """With ENGRAM_VECTOR_STORE=none embed has nothing to index but runs, so it answers its probe:
    such a deployment becomes ready (it never did: embed was left out of the probes' responders)."""
    async with secured_nats_server(tmp_path_factory.mktemp("novectors")) as server, AsyncExitStack() as stack:
        assert server.gateway is not None
        base = settings.model_copy(update={"nats_url": server.url, "http_port": 0, "vector_store": "none"})
        for service in SERVICES:
            own = base.model_copy(update={"nats_nkey_seed": SecretStr(server.service_seeds[service])})
            await stack.enter_async_context(running_services(own, [service]))
        running = await stack.enter_async_context(running_gateway(base, server.gateway.seed))
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=running.url))
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text


async def _chunks(size: int) -> AsyncIterator[bytes]:
    for _ in range(size // 65536 + 1):
        yield b" " * 65536


async def test_bad_input_gets_typed_errors(http: httpx.AsyncClient, service_token: str, agent: UUID) -> None:
    """Malformed JSON, a non-object, an oversize body (declared or streamed), bad and unknown
    query values, a path contradicting the body, forged tokens, no such route or method."""
    auth = bearer(service_token)
    _error(await http.post("/v1/recall", content=b"{not json", headers=auth), "INVALID_REQUEST", 400)
    _error(await http.post("/v1/recall", content=b"[1, 2]", headers=auth), "INVALID_REQUEST", 400)
    _error(
        await http.patch(f"/v1/memories/{uuid4()}", content=b"\xff\xfe", headers=auth), "INVALID_REQUEST", 400
    )
    too_big = b"{" + b" " * MAX_REQUEST_BYTES + b"}"
    error = _error(await http.post("/v1/recall", content=too_big, headers=auth), "PAYLOAD_TOO_LARGE", 413)
    assert error["details"] == {"limit": MAX_REQUEST_BYTES}
    streamed = await http.post("/v1/memories", content=_chunks(MAX_REQUEST_BYTES), headers=auth)
    _error(streamed, "PAYLOAD_TOO_LARGE", 413)
    sessions_too_big = await http.post("/v1/sessions", content=_chunks(600 * 1024), headers=auth)
    _error(sessions_too_big, "PAYLOAD_TOO_LARGE", 413)
    _error(await http.post("/v1/sessions", json={"event_id": "x"}, headers=auth), "INVALID_REQUEST", 400)

    listing = {"agent_config_id": str(agent)}
    _error(
        await http.get("/v1/memories", params={**listing, "page_size": "many"}, headers=auth),
        "INVALID_REQUEST",
        400,
    )
    _error(
        await http.get("/v1/memories", params={**listing, "bogus": "1"}, headers=auth), "INVALID_REQUEST", 400
    )
    _error(
        await http.get("/v1/memories", params={"agent_config_id": "not-a-uuid"}, headers=auth),
        "INVALID_REQUEST",
        400,
    )
    _error(
        await http.get("/v1/memories", params={**listing, "principal": "nobody"}, headers=auth),
        "INVALID_REQUEST",
        400,
    )
    _error(
        await http.get("/v1/config", params=[("agent_config_id", str(agent))] * 2, headers=auth),
        "INVALID_REQUEST",
        400,
    )
    entry = uuid4()
    conflict = await http.patch(
        f"/v1/memories/{entry}",
        json={"agent_config_id": str(agent), "entry_id": str(uuid4()), "op": "pin"},
        headers=auth,
    )
    _error(conflict, "INVALID_REQUEST", 400)
    _error(await http.get(f"/v1/memories/{entry}", params=listing, headers=auth), "NOT_FOUND", 404)
    _error(await http.get("/v1/memories/not-a-uuid", params=listing, headers=auth), "INVALID_REQUEST", 400)

    _error(
        await http.get("/v1/config", params=listing, headers=bearer("forged.token.value")),
        "UNAUTHENTICATED",
        401,
    )
    _error(
        await http.get("/v1/config", params=listing, headers={"Authorization": "Basic abc"}),
        "UNAUTHENTICATED",
        401,
    )
    _error(await http.get("/v1/nothing", headers=auth), "NOT_FOUND", 404)
    wrong_method = await http.put("/v1/recall", json={}, headers=auth)
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["code"] == "INVALID_REQUEST"
    assert wrong_method.headers["allow"] == "POST"


async def test_cors_is_off_by_default(http: httpx.AsyncClient, service_token: str, agent: UUID) -> None:
    """No CORS headers unless origins are configured: another origin's page cannot read replies."""
    preflight = await http.options(
        "/v1/recall",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in preflight.headers
    reply = await http.get(
        "/v1/config",
        params={"agent_config_id": str(agent)},
        headers={**bearer(service_token), "Origin": "https://evil.example"},
    )
    assert "access-control-allow-origin" not in reply.headers
