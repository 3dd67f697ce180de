"""``engram.memory.feedback`` (SPEC 5.6) and ``mark_incorrect``: reliability decays by the type's
``decay_on_failure``, and below ``prune_below`` the entry is erased — unless it is pinned."""

from __future__ import annotations

from uuid import UUID

import pytest
from nats.aio.client import Client
from sqlalchemy import select, text

from contracts.common import Principal
from shared.security.auth import TokenService
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from shared.storage.db.models import ENTRIES
from tests.platform import eventually, request

pytestmark = pytest.mark.integration


async def _save(nc: Client, token: str, agent: UUID, texts: list[str]) -> list[str]:
    body = {"agent_config_id": str(agent), "wait": True, "entries": [{"text": t} for t in texts]}
    return list((await request(nc, "engram.memory.save", body, token))["ids"])


async def _reliability(db: Database, entry_id: str) -> float | None:
    async with db.read() as s:
        value = (
            await s.execute(select(ENTRIES.c.reliability).where(ENTRIES.c.id == UUID(entry_id)))
        ).scalar()
    return None if value is None else float(value)


async def test_failures_decay_reliability_then_erase_but_never_a_pinned_entry(
    engram: Infra, nc: Client, db: Database, org: UUID, agent: UUID, service_token: str
) -> None:
    plain, pinned = await _save(nc, service_token, agent, ["Retry with backoff.", "Use the EU region."])
    await request(
        nc,
        "engram.memory.manage",
        {"agent_config_id": str(agent), "entry_id": pinned, "op": "pin"},
        service_token,
    )

    async def fail(entry_id: str) -> dict[str, int]:
        body = {"agent_config_id": str(agent), "entry_id": entry_id, "success": False}
        return await request(nc, "engram.memory.feedback", body, service_token)

    # defaults: decay_on_failure 0.7, prune_below 0.1 → 0.7, 0.49, 0.343, 0.24, 0.168, 0.118, then 0.082
    for step in range(1, 7):
        assert await fail(plain) == {"updated": 1, "deleted": 0, "labelled": 0}
        assert await _reliability(db, plain) == pytest.approx(0.7**step)
    assert await fail(plain) == {"updated": 0, "deleted": 1, "labelled": 0}
    assert await _reliability(db, plain) is None
    for _ in range(8):
        assert (await fail(pinned))["deleted"] == 0
    assert await _reliability(db, pinned) == pytest.approx(0.7**8)
    ok = await request(
        nc,
        "engram.memory.feedback",
        {"agent_config_id": str(agent), "entry_id": pinned, "success": True},
        service_token,
    )
    assert ok == {"updated": 0, "deleted": 0, "labelled": 0}
    async with db.read() as s:
        kinds = (
            (await s.execute(text("SELECT kind FROM audit_log WHERE org_id = :o ORDER BY seq"), {"o": org}))
            .scalars()
            .all()
        )
    assert kinds.count("memory.feedback") == 16
    assert kinds.count("memory.pruned") == 1


async def test_mark_incorrect_suppresses_and_decays_then_erases(
    engram: Infra, nc: Client, db: Database, agent: UUID, service_token: str
) -> None:
    (entry,) = await _save(nc, service_token, agent, ["The build cache lives in S3."])
    await request(
        nc,
        "engram.config.put",
        {"agent_config_id": str(agent), "config": {"type_policies": {"semantic": {"decay_on_failure": 0.3}}}},
        service_token,
    )
    body = {"agent_config_id": str(agent), "entry_id": entry, "op": "mark_incorrect"}
    first = await request(nc, "engram.memory.manage", body, service_token)
    assert first["entry"]["lifecycle"] == "suppressed"
    assert first["entry"]["reliability"] == pytest.approx(0.3)
    second = await request(nc, "engram.memory.manage", body, service_token)  # 0.09 < 0.1: erased
    assert second["entry"] is None
    assert second["affected"] == [entry]
    assert await _reliability(db, entry) is None


async def _labels(db: Database, org: UUID, session_id: str) -> list[str | None]:
    async with db.read() as s:
        rows = await s.execute(
            text("SELECT label FROM recall_records WHERE org_id = :o AND session_id = :s"),
            {"o": org, "s": session_id},
        )
        return list(rows.scalars().all())


async def test_a_session_rating_touches_only_what_the_caller_may_rate(
    engram: Infra, nc: Client, db: Database, org: UUID, agent: UUID, tokens: TokenService, service_token: str
) -> None:
    """A session-restricted token cannot rate another session, and an end user cannot relabel the
    recalls another end user made in a session; the platform's service token rates any session."""
    await _save(nc, service_token, agent, ["Deploys go out on Tuesdays."])

    def token(user: str, session_id: str | None = None) -> str:
        return tokens.mint(
            org_id=org,
            principal=Principal(kind="end_user", id=user),
            permissions={"memory.read", "memory.write"},
            session_id=session_id,
        )

    alice_s1, bob = token("alice", "s-alice"), token("bob")
    for who, session_id in ((alice_s1, "s-alice"), (bob, "s-bob")):
        body = {"agent_config_id": str(agent), "session_id": session_id, "strategy": "last_k"}
        await request(nc, "engram.recall", body, who)

    async def recorded() -> bool:  # recall records are written off the hot path
        return await _labels(db, org, "s-alice") == [None] and await _labels(db, org, "s-bob") == [None]

    await eventually(recorded, what="both recalls recorded")

    def rate(session_id: str, success: bool) -> dict[str, object]:
        return {"agent_config_id": str(agent), "session_id": session_id, "success": success}

    refused = await request(nc, "engram.memory.feedback", rate("s-bob", False), alice_s1)
    assert refused["error"]["code"] == "FORBIDDEN"
    assert await request(nc, "engram.memory.feedback", rate("s-alice", False), bob) == {
        "updated": 0,
        "deleted": 0,
        "labelled": 0,
    }
    assert await _labels(db, org, "s-alice") == [None]
    assert await _labels(db, org, "s-bob") == [None]
    assert (await request(nc, "engram.memory.feedback", rate("s-alice", True), alice_s1))["labelled"] == 1
    assert (await request(nc, "engram.memory.feedback", rate("s-bob", False), service_token))["labelled"] == 1
    assert await _labels(db, org, "s-alice") == ["success"]
    assert await _labels(db, org, "s-bob") == ["failed"]
