"""Each service's request-reply operations on the edge in memory (``Edge.request``), against real
Postgres: the handlers' logic behind the edge, in milliseconds, without NATS. (What needs JetStream — a save
accepted onto its stream, redelivery — stays in tests/integration on a real nats-server.)"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, cast
from uuid import UUID, uuid4

import pytest
from faststream.nats import NatsBroker
from nats.js import JetStreamContext
from pydantic import SecretStr

from contracts import operations as ops
from contracts.common import Principal
from contracts.config import MemoryConfig
from services.distill.save_path import Draft, SaveContext, save_entries
from services.governance_audit.erasure_api import Erasures
from services.governance_audit.router import build_router as governance_router
from services.governance_audit.webhooks.api import Webhooks
from services.ingest.router import build_router as ingest_router
from services.recall.router import build_router as recall_router
from services.recall.service import Recall
from services.recall.side_effects import SideEffects
from shared.runtime.settings import EngramSettings
from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.security.provenance import MessageSigner
from shared.service.edge import Edge
from shared.service.infra import Infra
from shared.storage.config_store import claim_agent_config
from shared.storage.db.engine import Database
from shared.storage.outbox import OutboxRelay
from shared.text.memory_block import BLOCK_OPEN

pytestmark = pytest.mark.integration

ALICE = Principal(kind="end_user", id="alice")
BOB = Principal(kind="end_user", id="bob")
SHARED_TEXTS = ["Deploys go out on Tuesdays.", "The staging database is read-only on Fridays."]
ALICE_TEXTS = ["Alice prefers answers in French."]
BOB_TEXTS = ["Bob's invoices go to the south office."]


@pytest.fixture(scope="module")
async def edge(database_url: str, tokens: TokenService) -> AsyncIterator[Edge]:
    """ingest, recall and governance-audit's routers as ``services.runtime`` builds them, their
    operations answered in memory (no NATS): nothing here publishes to JetStream."""
    settings = EngramSettings(
        nats_url="nats://in-memory:4222",
        database_url=database_url,
        token_keys=SecretStr("router=" + "r" * 48),
        _env_file=None,
    )
    db = Database(database_url, pool_size=2)
    signer = MessageSigner(settings.signing_keys())
    # The relay is never started: its wake() after a commit only sets an event.
    relay = OutboxRelay(db, cast(JetStreamContext, None), signer=signer)
    broker = NatsBroker()
    infra = Infra(settings=settings, db=db, tokens=tokens, broker=broker, relay=relay, signer=signer)
    effects = SideEffects(db)
    broker.include_router(ingest_router(infra))
    broker.include_router(recall_router(infra, Recall(db, effects, embedder=None, index=None)))
    webhooks = Webhooks(db, allow_private=False, wake=lambda: None)  # no delivery worker here
    broker.include_router(governance_router(infra, Erasures(db), webhooks))
    try:
        yield infra.edge
    finally:
        await db.close()


@pytest.fixture
async def seeded(db: Database, org: UUID, agent: UUID) -> UUID:
    """``agent`` of ``org`` with shared-pool entries and one each of alice and bob; returns it."""
    async with db.transaction() as session:
        await claim_agent_config(session, org, agent)
        for owner, texts in ((None, SHARED_TEXTS), (ALICE, ALICE_TEXTS), (BOB, BOB_TEXTS)):
            ctx = SaveContext(
                org_id=org,
                agent_config_id=agent,
                owner=owner,
                session_id="s-1",
                source="elective",
                requested_by="service:test",
            )
            await save_entries(session, ctx, [Draft(t, 0.8, "fact") for t in texts], MemoryConfig())
    return agent


def mint(
    tokens: TokenService, org: UUID, principal: Principal, perms: set[str] | None = None, **kw: Any
) -> str:
    return tokens.mint(
        org_id=org, principal=principal, permissions=set(ALL_PERMISSIONS) if perms is None else perms, **kw
    )


async def call(edge: Edge, op: ops.Operation[Any, Any], body: dict[str, Any], token: str) -> dict[str, Any]:
    reply = await edge.request(
        op.subject, json.dumps(body, default=str).encode(), {"Authorization": f"Bearer {token}"}
    )
    data: dict[str, Any] = json.loads(reply)
    return data


def code(reply: dict[str, Any]) -> str:
    return str(reply.get("error", {}).get("code", "OK"))


# -- recall --------------------------------------------------------------------------------------


async def test_recall_shows_each_caller_what_spec_3_lets_it_see(
    edge: Edge, tokens: TokenService, org: UUID, seeded: UUID
) -> None:
    """A service token acting for no one sees the shared pool; an end user only its own memory,
    never the shared pool nor another end user's; the context is the quarantined data block."""
    body = {"agent_config_id": seeded, "strategy": "last_k", "top_k": 10}
    pool = await call(edge, ops.RECALL, body, mint(tokens, org, Principal(kind="service", id="r")))
    assert sorted(r["text"] for r in pool["results"]) == sorted(SHARED_TEXTS)
    assert BLOCK_OPEN in pool["context"]
    assert "excluded_by_budget" not in pool  # sparse: no budget asked
    alice = await call(edge, ops.RECALL, body, mint(tokens, org, ALICE, {"memory.read"}))
    assert [r["text"] for r in alice["results"]] == ALICE_TEXTS
    for_bob = {**body, "principal": {"kind": "end_user", "id": "bob"}}
    assert (
        code(await call(edge, ops.RECALL, for_bob, mint(tokens, org, ALICE, {"memory.read"}))) == "FORBIDDEN"
    )


async def test_recall_of_another_organizations_agent_config_finds_nothing(
    edge: Edge, tokens: TokenService, seeded: UUID
) -> None:
    """The same agent config id from another organization is refused as such."""
    stranger = mint(tokens, uuid4(), Principal(kind="service", id="r"))
    reply = await call(edge, ops.RECALL, {"agent_config_id": seeded, "strategy": "last_k"}, stranger)
    assert code(reply) == "FORBIDDEN"


async def test_expand_returns_only_what_the_caller_may_see(
    edge: Edge, tokens: TokenService, org: UUID, seeded: UUID
) -> None:
    service = mint(tokens, org, Principal(kind="service", id="r"))
    as_bob = {"agent_config_id": seeded, "strategy": "last_k", "principal": {"kind": "end_user", "id": "bob"}}
    (bobs,) = (await call(edge, ops.RECALL, as_bob, service))["results"]
    expanded = await call(
        edge, ops.RECALL_EXPAND, {"agent_config_id": seeded, "ids": [bobs["id"]]}, mint(tokens, org, ALICE)
    )
    assert expanded["results"] == []
    assert expanded["not_found"] == [bobs["id"]]


async def test_a_session_restricted_token_cannot_rate_another_session(
    edge: Edge, tokens: TokenService, org: UUID, seeded: UUID
) -> None:
    """Issue 9: feedback goes through the same authorize() as recall, session restriction included."""
    restricted = mint(tokens, org, ALICE, {"memory.read", "memory.write"}, session_id="s-alice")
    rating = {"agent_config_id": seeded, "session_id": "s-bob", "success": False}
    assert code(await call(edge, ops.MEMORY_FEEDBACK, rating, restricted)) == "FORBIDDEN"
    own = await call(edge, ops.MEMORY_FEEDBACK, {**rating, "session_id": "s-alice"}, restricted)
    assert own == {"updated": 0, "deleted": 0, "labelled": 0}


# -- governance-audit ----------------------------------------------------------------------------


async def test_config_put_then_get(edge: Edge, tokens: TokenService, org: UUID, seeded: UUID) -> None:
    admin = mint(tokens, org, Principal(kind="service", id="ops"))
    put = await call(edge, ops.CONFIG_PUT, {"agent_config_id": seeded, "config": {"top_k": 7}}, admin)
    assert (put["version"], put["config"]["top_k"]) == (2, 7)
    reader = mint(tokens, org, ALICE, {"memory.read"})
    got = await call(edge, ops.CONFIG_GET, {"agent_config_id": seeded}, reader)
    assert (got["version"], got["config"]["top_k"]) == (2, 7)
    assert (
        code(await call(edge, ops.CONFIG_PUT, {"agent_config_id": seeded, "config": {}}, reader))
        == "FORBIDDEN"
    )


async def test_listing_is_bounded_by_owner_and_organization(
    edge: Edge, tokens: TokenService, org: UUID, seeded: UUID
) -> None:
    alice = mint(tokens, org, ALICE, {"memory.read"})
    page = await call(edge, ops.MEMORY_LIST, {"agent_config_id": seeded}, alice)
    assert [e["text"] for e in page["entries"]] == ALICE_TEXTS
    others = await call(
        edge, ops.MEMORY_LIST, {"agent_config_id": seeded, "actor_ref": "end_user:bob"}, alice
    )
    assert code(others) == "FORBIDDEN"
    stranger = mint(tokens, uuid4(), Principal(kind="service", id="r"))
    assert code(await call(edge, ops.MEMORY_LIST, {"agent_config_id": seeded}, stranger)) == "FORBIDDEN"


async def test_an_end_user_cannot_delete_anothers_entry(
    edge: Edge, tokens: TokenService, org: UUID, seeded: UUID
) -> None:
    service = mint(tokens, org, Principal(kind="service", id="r"))
    bobs = await call(
        edge, ops.MEMORY_LIST, {"agent_config_id": seeded, "actor_ref": "end_user:bob"}, service
    )
    (entry,) = bobs["entries"]
    alice = mint(tokens, org, ALICE)  # every permission, admin included: an end user's is not trusted
    body = {"agent_config_id": seeded, "entry_id": entry["id"]}
    assert code(await call(edge, ops.MEMORY_DELETE, body, alice)) == "NOT_FOUND"
    as_bob = {**body, "principal": {"kind": "end_user", "id": "bob"}}
    assert (await call(edge, ops.MEMORY_GET, as_bob, service))["entry"]["text"] == BOB_TEXTS[0]


# -- ingest --------------------------------------------------------------------------------------


async def test_save_refusals_come_before_anything_is_accepted(
    edge: Edge, tokens: TokenService, org: UUID, seeded: UUID
) -> None:
    """Without memory.write, for a service principal, or into another organization's agent
    config, a save is refused before it reaches JetStream."""
    entry = {"text": "Invoices are due on the 5th.", "memory_type": "fact"}
    body = {"agent_config_id": seeded, "entries": [entry]}
    reader = mint(tokens, org, ALICE, {"memory.read"})
    assert code(await call(edge, ops.MEMORY_SAVE, body, reader)) == "FORBIDDEN"
    service = mint(tokens, org, Principal(kind="service", id="r"))
    as_service = {**body, "principal": {"kind": "service", "id": "other"}}
    assert code(await call(edge, ops.MEMORY_SAVE, as_service, service)) == "INVALID_REQUEST"
    stranger = mint(tokens, uuid4(), Principal(kind="service", id="r"))
    assert code(await call(edge, ops.MEMORY_SAVE, body, stranger)) == "FORBIDDEN"
    restricted = mint(tokens, org, ALICE, {"memory.write"}, session_id="s-1")
    assert code(await call(edge, ops.MEMORY_SAVE, {**body, "session_id": "s-2"}, restricted)) == "FORBIDDEN"
