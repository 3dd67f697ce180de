"""Memory management over NATS (SPEC 7): list, get, manage, delete, purge, prune, export,
retention — what each does to Postgres, the vector store, the cache and the audit log."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from nats.aio.client import Client
from sqlalchemy import func, select, text, update

from contracts.common import Principal
from services.governance_audit.retention import RetentionSweeper
from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from shared.storage.db.models import ENTRIES, ERASURES
from tests.platform import eventually, publish_session, request, session_payload

pytestmark = pytest.mark.integration

ALICE = {"kind": "end_user", "id": "alice"}


def mint(tokens: TokenService, org: UUID, ref: str, perms: set[str] | frozenset[str], **kw: Any) -> str:
    return tokens.mint(org_id=org, principal=Principal.parse_ref(ref), permissions=perms, **kw)


async def save(nc: Client, token: str, agent: UUID, texts: list[str], **kw: Any) -> list[str]:
    body = {
        "agent_config_id": str(agent),
        "entries": [{"text": t, "importance": 0.5 + i / 100} for i, t in enumerate(texts)],
        "wait": True,
        **kw,
    }
    reply = await request(nc, "engram.memory.save", body, token)
    assert reply.get("status") == 200, reply
    return list(reply["ids"])


async def count(db: Database, *conditions: Any) -> int:
    async with db.read() as s:
        return int(
            (await s.execute(select(func.count()).select_from(ENTRIES).where(*conditions))).scalar_one()
        )


async def test_list_pages_by_importance_and_get_shows_everything(
    engram: Infra, nc: Client, tokens: TokenService, org: UUID, agent: UUID, service_token: str
) -> None:
    ids = await save(nc, service_token, agent, [f"fact number {i}" for i in range(25)], principal=ALICE)
    alice = mint(tokens, org, "end_user:alice", {"memory.read", "memory.write"})
    first = await request(nc, "engram.memory.list", {"agent_config_id": str(agent)}, alice)
    assert len(first["entries"]) == 20
    assert first["next_page_token"]
    importances = [e["importance"] for e in first["entries"]]
    assert importances == sorted(importances, reverse=True)
    second = await request(
        nc,
        "engram.memory.list",
        {"agent_config_id": str(agent), "page_token": first["next_page_token"]},
        alice,
    )
    assert len(second["entries"]) == 5
    assert second["next_page_token"] is None
    seen = [e["id"] for e in first["entries"] + second["entries"]]
    assert sorted(seen) == sorted(ids)
    got = await request(nc, "engram.memory.get", {"agent_config_id": str(agent), "entry_id": ids[0]}, alice)
    entry = got["entry"]
    for field in (
        "fingerprint",
        "reliability",
        "lifecycle",
        "version",
        "embedding_status",
        "owner",
        "expires_at",
        "occurred_at",
        "session_position",
    ):
        assert field in entry
    assert entry["owner"] == ALICE
    # Saved without a session or a time: no place in a session, and when it happened is not said.
    assert (entry["session_position"], entry["occurred_at"]) == (None, None)
    said = {"text": "a turn", "occurred_at": "2023-05-08T13:56:00Z"}
    reply = await request(
        nc,
        "engram.memory.save",
        {
            "agent_config_id": str(agent),
            "session_id": "s1",
            "entries": [said],
            "wait": True,
            "principal": ALICE,
        },
        service_token,
    )
    turn = await request(
        nc, "engram.memory.get", {"agent_config_id": str(agent), "entry_id": reply["ids"][0]}, alice
    )
    assert turn["entry"]["occurred_at"] == "2023-05-08T13:56:00Z"
    assert isinstance(turn["entry"]["session_position"], int)


async def test_list_filters_by_metadata_containment_within_the_callers_scope(
    engram: Infra, nc: Client, tokens: TokenService, org: UUID, agent: UUID, service_token: str
) -> None:
    """``metadata`` keeps the entries whose metadata contains it (objects key by key, arrays by
    element, scalars equal), still only the caller's own; its pages are bound to it."""
    entries = [
        ("Red one.", {"thread": {"id": "t1", "tags": ["a", "b"]}, "n": 1}),
        ("Red two.", {"thread": {"id": "t1", "tags": ["b"]}, "n": 2}),
        ("Blue one.", {"thread": {"id": "t2"}, "n": 1}),
        ("Bare.", {}),
    ]
    body = {
        "agent_config_id": str(agent),
        "principal": ALICE,
        "entries": [{"text": t, "metadata": m} for t, m in entries],
        "wait": True,
    }
    reply = await request(nc, "engram.memory.save", body, service_token)
    assert reply.get("status") == 200, reply
    # Bob has an entry with the very same metadata: never in Alice's listing.
    bob_body = {**body, "principal": {"kind": "end_user", "id": "bob"}, "entries": [body["entries"][0]]}
    assert (await request(nc, "engram.memory.save", bob_body, service_token)).get("status") == 200
    alice = mint(tokens, org, "end_user:alice", {"memory.read"})

    async def texts(metadata: Any, **extra: Any) -> list[str]:
        page = await request(
            nc, "engram.memory.list", {"agent_config_id": str(agent), "metadata": metadata, **extra}, alice
        )
        assert "error" not in page, page
        return sorted(e["text"] for e in page["entries"])

    assert await texts({"thread": {"id": "t1"}}) == ["Red one.", "Red two."]
    assert await texts({"thread": {"tags": ["a"]}}) == ["Red one."]
    assert await texts({"thread": {"tags": ["b"]}, "n": 2}) == ["Red two."]
    assert await texts({"n": 1}) == ["Blue one.", "Red one."]
    assert await texts({"n": "1"}) == []
    assert await texts({"thread": {"id": "t3"}}) == []

    first = await request(
        nc,
        "engram.memory.list",
        {"agent_config_id": str(agent), "metadata": {"thread": {"id": "t1"}}, "page_size": 1},
        alice,
    )
    assert len(first["entries"]) == 1
    assert first["next_page_token"]
    rebound = await request(
        nc,
        "engram.memory.list",
        {
            "agent_config_id": str(agent),
            "metadata": {"thread": {"id": "t2"}},
            "page_size": 1,
            "page_token": first["next_page_token"],
        },
        alice,
    )
    assert rebound["error"]["code"] == "INVALID_REQUEST"
    assert await texts({"thread": {"id": "t1"}}, page_size=1, page_token=first["next_page_token"]) == [
        t for t in ["Red one.", "Red two."] if t != first["entries"][0]["text"]
    ]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"metadata": {}}',
        b'{"metadata": []}',
        b'{"metadata": "thread"}',
        b'{"metadata": {"k": "a\\u0000b"}}',
        b'{"metadata": {"k\\u0000": 1}}',
        b'{"metadata": {"k": NaN}}',
        b'{"metadata": {"k": Infinity}}',
        b'{"metadata": {"k": [[[[[[[[["deep"]]]]]]]]]}}',
        b'{"metadata": {"k": "' + b"x" * 5000 + b'"}}',
    ],
)
async def test_a_bad_metadata_filter_is_an_invalid_request(
    engram: Infra, nc: Client, tokens: TokenService, org: UUID, agent: UUID, raw: bytes
) -> None:
    """Empty, not an object, a NUL (Postgres's jsonb cannot hold one), a non-finite number, too
    deep or too large: INVALID_REQUEST, never a database error."""
    alice = mint(tokens, org, "end_user:alice", {"memory.read"})
    payload = raw.replace(b"{", b'{"agent_config_id": "' + str(agent).encode() + b'", ', 1)
    reply = await request(nc, "engram.memory.list", payload, alice)
    assert reply["error"]["code"] == "INVALID_REQUEST", reply


async def test_manage_ops_pin_disable_edit_with_history_merge_and_rescope(
    engram: Infra, nc: Client, db: Database, tokens: TokenService, org: UUID, agent: UUID, service_token: str
) -> None:
    a, b, c = await save(
        nc, service_token, agent, ["Use tabs.", "Prefer tabs.", "Deploy on Fridays."], principal=ALICE
    )
    alice = mint(tokens, org, "end_user:alice", {"memory.read", "memory.write"})

    async def manage(body: dict[str, Any], token: str = alice) -> dict[str, Any]:
        return await request(nc, "engram.memory.manage", {"agent_config_id": str(agent), **body}, token)

    assert (await manage({"entry_id": a, "op": "pin"}))["entry"]["pinned"] is True
    assert (await manage({"entry_id": c, "op": "disable"}))["entry"]["lifecycle"] == "disabled"
    assert (await manage({"entry_id": c, "op": "enable"}))["entry"]["lifecycle"] == "active"
    marked = await manage({"entry_id": c, "op": "mark_incorrect"})
    assert marked["entry"]["lifecycle"] == "suppressed"
    assert marked["entry"]["reliability"] == pytest.approx(0.7)

    # procedural types version on edit: the old version is kept, superseded, in the history
    await request(
        nc,
        "engram.config.put",
        {"agent_config_id": str(agent), "config": {"type_policies": {"semantic": {"version_on_edit": True}}}},
        service_token,
    )
    edited = await manage({"entry_id": a, "op": "edit", "text": "Use four spaces, not tabs."})
    new_id = edited["entry"]["id"]
    assert new_id != a
    assert edited["entry"]["version"] == 2
    assert edited["entry"]["supersedes"] == a
    history = await request(
        nc, "engram.memory.get", {"agent_config_id": str(agent), "entry_id": new_id, "history": True}, alice
    )
    assert [h["id"] for h in history["history"]] == [a]
    assert history["history"][0]["lifecycle"] == "superseded"
    # editing a superseded version is refused; PII in an edit is redacted like any save
    assert (await manage({"entry_id": a, "op": "edit", "text": "x"}))["error"]["code"] == "INVALID_REQUEST"
    redacted = await manage({"entry_id": new_id, "op": "edit", "text": "Mail ops@example.com for access."})
    assert "ops@example.com" not in redacted["entry"]["text"]
    assert redacted["entry"]["redaction"] == ["EMAIL"]

    merged = await manage(
        {"entry_id": b, "op": "merge", "merge_with": [c], "text": "Tabs, never Friday deploys."}
    )
    m = merged["entry"]
    assert sorted(m["derived_from"]) == sorted([b, c])
    assert m["lifecycle"] == "active"
    assert await count(db, ENTRIES.c.id.in_([UUID(b), UUID(c)]), ENTRIES.c.lifecycle == "superseded") == 2

    # rescope is admin-only; an admin moves the entry to the shared pool
    assert (await manage({"entry_id": m["id"], "op": "rescope", "owner": "none"}))["error"][
        "code"
    ] == "FORBIDDEN"
    admin = mint(tokens, org, "actor:root", ALL_PERMISSIONS)
    moved = await manage({"entry_id": m["id"], "op": "rescope", "owner": "none"}, admin)
    assert moved["entry"]["owner"] is None
    retention = await manage({"entry_id": new_id, "op": "change_retention", "ttl_seconds": 3600})
    assert retention["entry"]["expires_at"] is not None


async def test_delete_erases_the_entry_its_versions_and_merges(
    engram: Infra, nc: Client, db: Database, tokens: TokenService, org: UUID, agent: UUID, service_token: str
) -> None:
    a, b, keep = await save(
        nc, service_token, agent, ["Alpha fact.", "Beta fact.", "Gamma fact."], principal=ALICE
    )
    alice = mint(tokens, org, "end_user:alice", {"memory.read", "memory.write"})
    merged = await request(
        nc,
        "engram.memory.manage",
        {
            "agent_config_id": str(agent),
            "entry_id": a,
            "op": "merge",
            "merge_with": [b],
            "text": "Alpha and beta.",
        },
        alice,
    )
    receipt = await request(nc, "engram.memory.delete", {"agent_config_id": str(agent), "entry_id": a}, alice)
    # a, the merge it went into, and b (the merge's other source) are one memory's lineage
    assert sorted(receipt["entry_ids"]) == sorted([a, b, merged["entry"]["id"]])
    assert receipt["entries"] == 3
    assert receipt["derived"] == 2
    assert await count(db, ENTRIES.c.org_id == org) == 1
    assert await count(db, ENTRIES.c.id == UUID(keep)) == 1


async def test_purge_erases_rows_vectors_cache_and_history_and_nothing_comes_back(
    engram: Infra,
    nc: Client,
    observer_nc: Client,
    db: Database,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    service_token: str,
) -> None:
    """Purge, then replay the session from the stream: the tombstone keeps the memory erased."""
    session = session_payload(
        org,
        agent,
        principal=ALICE,
        status="failed",
        task="Deploy the billing service",
        tool_trace=[
            {"tool": "deploy", "input": {"svc": "billing"}, "error": "quota exceeded in eu-west-1"},
        ],
    )
    await publish_session(nc, session, service_token)

    async def written() -> bool:
        return await count(db, ENTRIES.c.org_id == org, ENTRIES.c.embedding_status == "indexed") > 0

    await eventually(written, what="distilled and indexed")
    kept = await save(
        nc, service_token, agent, ["Bob likes dark mode."], principal={"kind": "end_user", "id": "bob"}
    )
    recall_body = {"agent_config_id": str(agent), "principal": ALICE, "strategy": "last_k", "session_id": "x"}
    before = await request(nc, "engram.recall", recall_body, service_token)
    assert before["count"] > 0
    await request(nc, "engram.recall", recall_body, service_token)  # cached now (Redis)

    alice = mint(tokens, org, "end_user:alice", {"memory.read", "memory.purge"})
    receipt = await request(
        nc, "engram.memory.purge", {"agent_config_id": str(agent), "actor_ref": "end_user:alice"}, alice
    )
    assert receipt["entries"] == before["count"]
    assert receipt["vectors"] == receipt["entries"]
    assert receipt["recall_records"] >= 0
    assert receipt["vectors_deferred"] is False
    assert await count(db, ENTRIES.c.org_id == org, ENTRIES.c.owner_key == "end_user:alice") == 0
    assert await count(db, ENTRIES.c.id == UUID(kept[0])) == 1
    after = await request(nc, "engram.recall", recall_body, service_token)
    assert after["count"] == 0

    # replay: the same session again (new Msg-Id so JetStream stores it), and a fresh event id
    await publish_session(nc, {**session}, service_token, msg_id=None)
    await publish_session(nc, {**session, "event_id": str(UUID(int=org.int ^ 1))}, service_token, msg_id=None)

    async def processed() -> bool:
        async with db.read() as s:
            n = await s.execute(
                text("SELECT count(*) FROM audit_log WHERE org_id = :o AND kind = 'memory.saved'"), {"o": org}
            )
            return int(n.scalar_one()) >= 3  # the first distill, bob's save, and the replay

    await eventually(processed, what="the replay processed")
    assert await count(db, ENTRIES.c.org_id == org, ENTRIES.c.owner_key == "end_user:alice") == 0
    async with db.read() as s:
        tombstones = (
            await s.execute(select(func.count()).select_from(ERASURES).where(ERASURES.c.org_id == org))
        ).scalar_one()
    assert tombstones == 1

    # No memory text in any stream: sessions leave ENGRAM_SESSIONS once processed (work queue);
    # memory and audit streams carry ids only.
    js = observer_nc.jetstream()
    for stream in ("ENGRAM_SESSIONS", "ENGRAM_MEMORY", "ENGRAM_AUDIT"):
        state = (await js.stream_info(stream)).state
        for seq in range(state.first_seq, state.last_seq + 1):
            try:
                msg = await js.get_msg(stream, seq)
            except Exception:  # noqa: S112 (deleted/acked sequence numbers leave gaps)
                continue
            assert b"quota exceeded" not in (msg.data or b""), (stream, seq)


async def test_prune_keeps_pinned_and_reports_deleted_and_remaining(
    engram: Infra, nc: Client, tokens: TokenService, org: UUID, agent: UUID, service_token: str
) -> None:
    ids = await save(nc, service_token, agent, [f"note {i}" for i in range(6)])
    await request(
        nc,
        "engram.memory.manage",
        {"agent_config_id": str(agent), "entry_id": ids[0], "op": "pin"},
        service_token,
    )
    reply = await request(
        nc, "engram.memory.prune", {"agent_config_id": str(agent), "max_entries": 2}, service_token
    )
    assert reply == {"deleted": 4, "remaining": 2}
    listed = await request(nc, "engram.memory.list", {"agent_config_id": str(agent)}, service_token)
    remaining = {e["id"] for e in listed["entries"]}
    assert ids[0] in remaining
    assert ids[5] in remaining


async def test_export_pages_then_refuses_tampered_tokens(
    engram: Infra, nc: Client, tokens: TokenService, org: UUID, agent: UUID, service_token: str
) -> None:
    ids = await save(nc, service_token, agent, [f"exported {i}" for i in range(7)], principal=ALICE)
    alice = mint(tokens, org, "end_user:alice", {"memory.read"})
    body = {"agent_config_id": str(agent), "actor_ref": "end_user:alice", "page_size": 3}
    got: list[str] = []
    token = None
    pages = 0
    while True:
        page = await request(
            nc, "engram.memory.export", {**body, **({"page_token": token} if token else {})}, alice
        )
        got += [e["id"] for e in page["entries"]]
        pages += 1
        token = page["next_page_token"]
        if token is None:
            break
        last_token = token
    assert sorted(got) == sorted(ids)
    assert pages == 3
    flipped = last_token[:-3] + ("A" if last_token[-3] != "A" else "B") + last_token[-2:]
    for bad in (flipped, last_token[:20], "x.y", last_token + "A"):
        reply = await request(nc, "engram.memory.export", {**body, "page_token": bad}, alice)
        assert reply["error"]["code"] == "INVALID_REQUEST"
        assert "entries" not in reply
    # reused on another filter
    other = await request(
        nc, "engram.memory.export", {**body, "lifecycle": ["active"], "page_token": last_token}, alice
    )
    assert other["error"]["code"] == "INVALID_REQUEST"


async def test_expired_entries_leave_recall_at_once_and_the_sweeper_erases_them(
    engram: Infra, nc: Client, db: Database, org: UUID, agent: UUID, service_token: str
) -> None:
    ids = await save(nc, service_token, agent, ["short lived", "long lived"])
    async with db.transaction() as s:
        await s.execute(
            update(ENTRIES)
            .where(ENTRIES.c.id == UUID(ids[0]))
            .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )
    reply = await request(
        nc, "engram.recall", {"agent_config_id": str(agent), "strategy": "last_k"}, service_token
    )
    assert [r["id"] for r in reply["results"]] == [ids[1]]
    swept: list[int] = []

    async def after(org_id: UUID, erased: Any) -> None:
        swept.append(len(erased.ids))

    sweeper = RetentionSweeper(db, after)
    # The running service's own sweeper may take the row first (SKIP LOCKED: this sweep then
    # skips it and answers 0 until the other commits), so wait on the row being gone.
    for _ in range(600):
        await sweeper.sweep_once()
        if await count(db, ENTRIES.c.id == UUID(ids[0])) == 0:
            break
        await asyncio.sleep(0.05)
    assert await count(db, ENTRIES.c.id == UUID(ids[0])) == 0
    async with db.read() as s:
        kinds = (
            (await s.execute(text("SELECT kind FROM audit_log WHERE org_id = :o"), {"o": org}))
            .scalars()
            .all()
        )
    assert "memory.expired" in kinds
