"""Request-reply over NATS as a platform would do it: elective saves, memory config, audit."""

from __future__ import annotations

from uuid import UUID, uuid4

import pytest
from nats.aio.client import Client
from sqlalchemy import select, text

from contracts.common import Principal
from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from shared.storage.db.models import MemoryEntry
from tests.platform import request

pytestmark = pytest.mark.integration


def _mint(
    tokens: TokenService, org: UUID, kind: str, ident: str | None, perms: set[str] | frozenset[str]
) -> str:
    return tokens.mint(
        org_id=org, principal=Principal.model_validate({"kind": kind, "id": ident}), permissions=perms
    )


async def test_save_with_wait_reports_saved_skipped_and_reinforced(
    engram: Infra, nc: Client, org: UUID, agent: UUID, service_token: str
) -> None:
    """wait:true answers {saved, skipped, reinforced, ids}; the same text again reinforces."""
    body = {
        "agent_config_id": str(agent),
        "principal": {"kind": "end_user", "id": "alice"},
        "entries": [
            {"text": "Alice prefers metric units.", "importance": 0.6},
            {"text": "too small to keep", "importance": 0.09},
            {"text": "kept at the floor", "importance": 0.1},
        ],
        "wait": True,
    }
    first = await request(nc, "engram.memory.save", body, service_token)
    assert (first["status"], first["saved"], first["skipped"], first["reinforced"]) == (200, 2, 1, 0)
    again = await request(
        nc,
        "engram.memory.save",
        {**body, "entries": [{"text": "  alice PREFERS metric units ", "importance": 0.9}]},
        service_token,
    )
    assert (again["saved"], again["reinforced"]) == (0, 1)
    assert again["ids"][0] == first["ids"][0]


async def test_save_without_wait_is_accepted_then_stored(
    engram: Infra, nc: Client, db: Database, org: UUID, agent: UUID, service_token: str
) -> None:
    """Without wait the reply is 202 with a request id, and the entry is stored shortly after."""
    reply = await request(
        nc,
        "engram.memory.save",
        {"agent_config_id": str(agent), "content": "Use the EU region."},
        service_token,
    )
    assert reply["status"] == 202
    UUID(reply["request_id"])

    async def stored() -> bool:
        async with db.read() as s:
            return (await s.execute(select(MemoryEntry).where(MemoryEntry.org_id == org))).first() is not None  # type: ignore[arg-type]

    from tests.platform import eventually

    await eventually(stored, what="the accepted save")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"not json", "INVALID_REQUEST"),
        ({"agent_config_id": "nope", "content": "x"}, "INVALID_REQUEST"),
        ({"content": "missing agent"}, "INVALID_REQUEST"),
        ({"agent_config_id": str(uuid4()), "content": "x", "entries": [{"text": "y"}]}, "INVALID_REQUEST"),
        ({"agent_config_id": str(uuid4()), "content": "x", "surprise": 1}, "INVALID_REQUEST"),
        ({"agent_config_id": str(uuid4()), "content": "x" * 9000}, "INVALID_REQUEST"),
        (b"{" + b'"a":' * 1 + b'"' + b"x" * 300_000 + b'"}', "PAYLOAD_TOO_LARGE"),
    ],
)
async def test_bad_save_requests_get_typed_errors(
    engram: Infra, nc: Client, service_token: str, body: dict[str, object] | bytes, code: str
) -> None:
    """Malformed save requests are answered with the SPEC 9 envelope, never a crash."""
    reply = await request(nc, "engram.memory.save", body, service_token)
    assert reply["error"]["code"] == code
    assert isinstance(reply["error"]["status"], int)


async def test_save_refuses_bad_credentials_and_foreign_principals(
    engram: Infra, nc: Client, tokens: TokenService, org: UUID, agent: UUID
) -> None:
    """No token, a forged one, another user, the shared pool as an end user, another org's
    agent config and a read-only token are all refused before anything is accepted."""
    body = {"agent_config_id": str(agent), "content": "x", "wait": True}
    alice = _mint(tokens, org, "end_user", "alice", {"memory.write"})
    owner = _mint(tokens, org, "service", "svc", ALL_PERMISSIONS)
    assert (await request(nc, "engram.memory.save", body, owner))[
        "status"
    ] == 200  # org claims the agent config
    other_org = _mint(tokens, uuid4(), "service", "svc", ALL_PERMISSIONS)
    forged = TokenService({"test-key": "x" * 48}).mint(
        org_id=org, principal=Principal(kind="service", id="s"), permissions=ALL_PERMISSIONS
    )
    cases = [
        (None, body, "UNAUTHENTICATED"),
        (forged, body, "UNAUTHENTICATED"),
        (alice, {**body, "principal": {"kind": "end_user", "id": "bob"}}, "FORBIDDEN"),
        (_mint(tokens, org, "actor", "carol", {"memory.read"}), body, "FORBIDDEN"),
        (other_org, body, "FORBIDDEN"),
        (
            _mint(tokens, org, "actor", "carol", {"memory.write"}),
            {**body, "principal": {"kind": "none"}},
            "FORBIDDEN",
        ),
    ]
    for token, payload, code in cases:
        reply = await request(nc, "engram.memory.save", payload, token)
        assert reply.get("error", {}).get("code") == code, (token, payload, reply)
    # An end user saving for themselves is fine, and lands in their own scope.
    mine = await request(nc, "engram.memory.save", body, alice)
    assert mine["saved"] == 1


async def test_end_users_never_share_a_deduplicated_entry(
    engram: Infra, nc: Client, db: Database, org: UUID, agent: UUID, service_token: str
) -> None:
    """The same text saved for two end users is two entries, one per owner."""
    for user in ("alice", "bob", "alice"):
        await request(
            nc,
            "engram.memory.save",
            {
                "agent_config_id": str(agent),
                "wait": True,
                "principal": {"kind": "end_user", "id": user},
                "content": "Wants invoices by post.",
            },
            service_token,
        )
    async with db.read() as s:
        rows = (await s.execute(select(MemoryEntry).where(MemoryEntry.org_id == org))).scalars().all()  # type: ignore[arg-type]
    assert sorted((r.owner_key, r.reinforcement_count) for r in rows) == [
        ("end_user:alice", 1),
        ("end_user:bob", 0),
    ]


async def test_config_defaults_merge_validation_and_tenancy(
    engram: Infra, nc: Client, tokens: TokenService, org: UUID, agent: UUID, service_token: str
) -> None:
    """config.get answers SPEC 2's defaults; put merges nested objects, validates, versions, and
    refuses other organizations and callers without memory.admin."""
    got = await request(nc, "engram.config.get", {"agent_config_id": str(agent)}, service_token)
    assert got["version"] == 0
    config = got["config"]
    assert (config["memory_strategy"], config["top_k"], config["scope"], config["pii_handling"]) == (
        "last_k",
        10,
        "workload",
        "redact",
    )
    assert config["retention"] == {"ttl_seconds": None, "max_entries": 500, "decay_strategy": "hard_delete"}
    assert config["type_policies"]["procedural"]["version_on_edit"] is True
    assert config["type_policies"]["episodic"]["ttl_days"] == 90

    put = await request(
        nc,
        "engram.config.put",
        {"agent_config_id": str(agent), "config": {"retention": {"max_entries": 1000}, "top_k": 5}},
        service_token,
    )
    assert put["version"] == 1
    assert put["config"]["retention"] == {
        "ttl_seconds": None,
        "max_entries": 1000,
        "decay_strategy": "hard_delete",
    }
    second = await request(
        nc,
        "engram.config.put",
        {"agent_config_id": str(agent), "config": {"retention": {"ttl_seconds": 60}}},
        service_token,
    )
    assert second["version"] == 2
    assert second["config"]["retention"]["max_entries"] == 1000
    assert second["config"]["top_k"] == 5

    bad = await request(
        nc, "engram.config.put", {"agent_config_id": str(agent), "config": {"top_k": -1}}, service_token
    )
    assert bad["error"]["code"] == "INVALID_REQUEST"
    unknown = await request(
        nc, "engram.config.put", {"agent_config_id": str(agent), "config": {"nope": 1}}, service_token
    )
    assert unknown["error"]["code"] == "INVALID_REQUEST"
    foreign = _mint(tokens, uuid4(), "service", "svc", ALL_PERMISSIONS)
    for subject in ("engram.config.get", "engram.config.put"):
        reply = await request(
            nc,
            subject,
            {"agent_config_id": str(agent), "config": {}}
            if subject.endswith("put")
            else {"agent_config_id": str(agent)},
            foreign,
        )
        assert reply["error"]["code"] == "FORBIDDEN"
    writer = _mint(tokens, org, "actor", "carol", {"memory.read", "memory.write"})
    denied = await request(
        nc, "engram.config.put", {"agent_config_id": str(agent), "config": {"top_k": 3}}, writer
    )
    assert denied["error"]["code"] == "FORBIDDEN"
    final = await request(nc, "engram.config.get", {"agent_config_id": str(agent)}, service_token)
    assert final["version"] == 2


async def test_audit_query_is_scoped_and_verify_names_an_altered_row(
    engram: Infra, nc: Client, db: Database, tokens: TokenService, org: UUID, agent: UUID, service_token: str
) -> None:
    """audit.query returns only the caller's org; verify is ok until a row is altered behind the
    database's append-only trigger, then names that row; an ordinary UPDATE is refused outright."""
    for i in range(5):
        await request(
            nc,
            "engram.memory.save",
            {"agent_config_id": str(agent), "wait": True, "content": f"fact number {i}"},
            service_token,
        )
    records = (await request(nc, "engram.audit.query", {"kind": "memory.saved"}, service_token))["records"]
    assert len(records) == 5
    assert {r["org_id"] for r in records} == {str(org)}
    assert all("fact number" not in str(r) for r in records)  # ids and counts, no memory text
    other = _mint(tokens, uuid4(), "service", "svc", ALL_PERMISSIONS)
    assert (await request(nc, "engram.audit.query", {}, other))["records"] == []
    reader = _mint(tokens, org, "actor", "carol", {"memory.read"})
    assert (await request(nc, "engram.audit.query", {}, reader))["error"]["code"] == "FORBIDDEN"

    ok = await request(nc, "engram.audit.verify", {}, service_token)
    assert ok["ok"] is True
    assert ok["checked"] >= 5
    target = records[2]["seq"]
    async with db.engine.connect() as conn:
        with pytest.raises(Exception, match="append-only"):
            await conn.execute(
                text("UPDATE audit_log SET details = '{}' WHERE org_id = :o AND seq = :s"),
                {"o": org, "s": target},
            )
        await conn.rollback()
    async with db.engine.begin() as conn:
        await conn.execute(text("ALTER TABLE audit_log DISABLE TRIGGER audit_log_no_change"))
        await conn.execute(
            text(
                "UPDATE audit_log SET details = jsonb_set(details, '{saved}', '7') "
                "WHERE org_id = :o AND seq = :s"
            ),
            {"o": org, "s": target},
        )
        await conn.execute(text("ALTER TABLE audit_log ENABLE TRIGGER audit_log_no_change"))
    broken = await request(nc, "engram.audit.verify", {}, service_token)
    assert broken["ok"] is False
    assert broken["first_broken"]["seq"] == target
    assert broken["first_broken"]["record_id"] == records[2]["event_id"]
