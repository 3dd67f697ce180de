"""Knowledge updates through every interface (issue 26 §1): a changed value saved over NATS, HTTP
and MCP supersedes the old one; recall prefers what is current in every strategy, a cue about the
past still reaches history, and list/get show the chain. (LangGraph's ``put`` of a changed value on
the same key replaces the item: ``StoreBehaviour.test_put_get_overwrite_delete`` in
test_langgraph_store.py, run against ``EngramStore``.)"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import httpx
import pytest
from nats.aio.client import Client as Nats

from services.mcp import Caller
from shared.security.auth import TokenService
from shared.service.infra import Infra
from tests.mcp_clients import in_process, ok
from tests.platform import eventually, request
from tests.security.support import mint

pytestmark = pytest.mark.integration

ALICE = {"kind": "end_user", "id": "alice"}
OLD, NEW = "Alice lives in Boston.", "Alice moved to Seattle."
OTHER = "Alice works at Acme on the payments team."


async def _save(nc: Nats, token: str, agent: UUID, text: str) -> str:
    body = {"agent_config_id": str(agent), "principal": ALICE, "wait": True, "entries": [{"text": text}]}
    reply = await request(nc, "engram.memory.save", body, token)
    assert reply["saved"] == 1, reply
    return str(reply["ids"][0])


async def _recall(nc: Nats, token: str, agent: UUID, **fields: Any) -> list[str]:
    body = {"agent_config_id": str(agent), "principal": ALICE, "top_k": 10, **fields}
    reply = await request(nc, "engram.recall", body, token)
    assert "error" not in reply, reply
    return [r["text"] for r in reply["results"]]


async def test_over_nats_recall_prefers_what_is_current(
    engram: Infra, nc: Nats, agent: UUID, service_token: str
) -> None:
    """After "moved to Seattle", every strategy answers Seattle and never Boston for a question
    about now; a question about before reaches Boston; list and get show the chain."""
    old_id = await _save(nc, service_token, agent, OLD)
    await _save(nc, service_token, agent, OTHER)
    new_id = await _save(nc, service_token, agent, NEW)

    async def indexed() -> bool:
        found = await _recall(nc, service_token, agent, strategy="semantic", cue="Where does Alice live?")
        return len(found) == 2  # the current two; the superseded one is never a candidate

    await eventually(indexed, what="the current entries embedded")
    for strategy in ("last_k", "importance", "full", "pack", "semantic", "hybrid"):
        texts = await _recall(nc, service_token, agent, strategy=strategy, cue="Where does Alice live?")
        assert OLD not in texts, strategy
        assert NEW in texts, strategy
    hybrid = await _recall(nc, service_token, agent, strategy="hybrid", cue="Where does Alice live?")
    assert hybrid[0] == NEW
    for strategy in ("pack", "semantic", "hybrid"):
        before = await _recall(
            nc, service_token, agent, strategy=strategy, cue="Where did Alice live before Seattle?"
        )
        assert OLD in before, strategy
    expanded = await request(
        nc,
        "engram.recall.expand",
        {"agent_config_id": str(agent), "principal": ALICE, "ids": [old_id]},
        service_token,
    )
    assert [r["text"] for r in expanded["results"]] == [OLD]  # history a past cue returned expands

    listed = await request(
        nc,
        "engram.memory.list",
        {"agent_config_id": str(agent), "principal": ALICE, "lifecycle": ["superseded"]},
        service_token,
    )
    (entry,) = listed["entries"]
    assert (entry["id"], entry["superseded_by"]) == (old_id, new_id)
    assert entry["valid_until"] is not None
    got = await request(
        nc,
        "engram.memory.get",
        {"agent_config_id": str(agent), "principal": ALICE, "entry_id": new_id, "history": True},
        service_token,
    )
    assert (got["entry"]["supersedes"], got["entry"]["valid_from"]) == (old_id, entry["valid_until"])
    assert [h["id"] for h in got["history"]] == [old_id]


async def test_over_http(http: httpx.AsyncClient, agent: UUID, service_token: str) -> None:
    """POST /v1/memories of a changed value supersedes; GET /v1/memories shows the chain."""
    headers = {"Authorization": f"Bearer {service_token}"}
    ids = []
    for text in ("Alice's favorite color is blue.", "Alice's favorite color is now green."):
        body = {"agent_config_id": str(agent), "principal": ALICE, "wait": True, "entries": [{"text": text}]}
        reply = await http.post("/v1/memories", json=body, headers=headers)
        assert reply.status_code == 200, reply.text
        ids.append(reply.json()["ids"][0])
    page = await http.get(
        "/v1/memories",
        params=[
            ("agent_config_id", str(agent)),
            ("actor_ref", "end_user:alice"),
            ("lifecycle", "active"),
            ("lifecycle", "superseded"),
        ],
        headers=headers,
    )
    assert page.status_code == 200, page.text
    by_id = {e["id"]: e for e in page.json()["entries"]}
    assert (by_id[ids[0]]["lifecycle"], by_id[ids[0]]["superseded_by"]) == ("superseded", ids[1])
    assert (by_id[ids[1]]["lifecycle"], by_id[ids[1]]["supersedes"]) == ("active", ids[0])


async def test_over_mcp(engram: Infra, nc: Nats, tokens: TokenService, org: UUID, agent: UUID) -> None:
    """An agent remembering a changed value (MCP ``remember``) supersedes what it remembered
    before: ``recall`` answers only the current one, ``list_memories`` shows both with the link."""
    alice = mint(tokens, org, "end_user:alice", {"memory.read", "memory.write"})
    async with in_process(nc, Caller(token=alice, agent_config_id=agent)) as session:
        first = ok(await session.call_tool("remember", {"text": "I use VS Code as my editor."}))
        second = ok(await session.call_tool("remember", {"text": "I switched to Vim as my editor."}))
        found = ok(await session.call_tool("recall", {"strategy": "last_k"}))
        assert [r["id"] for r in found["results"]] == second["ids"]
        history = {"page_size": 10, "lifecycle": ["active", "superseded"]}
        listed = ok(await session.call_tool("list_memories", history))
        by_id = {e["id"]: e for e in listed["entries"]}
        old, new = first["ids"][0], second["ids"][0]
        assert (by_id[old]["lifecycle"], by_id[old]["superseded_by"]) == ("superseded", new)
        assert (by_id[new]["lifecycle"], by_id[new]["supersedes"]) == ("active", old)
