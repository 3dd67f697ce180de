"""A purged memory never comes back (SPEC 7.2): purge alice, then replay every ``memory.written``
ever published (fresh ``Nats-Msg-Id``, so the embed service processes each again), drop the
organization's cached replies, and rebuild every vector with ``engram reindex``. Afterwards her
entries are in none of Postgres, the vector store (searched through the very index recall uses),
Redis, or any recall strategy — while bob's memory, untouched, is still found everywhere."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from uuid import UUID, uuid4

import pytest
import redis.asyncio as redis_asyncio
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy
from sqlalchemy import func, select

from services.reindex import reindex_all
from shared.ports import Embedder, TenantFilter, VectorIndex
from shared.security.auth import TokenService
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from shared.storage.db.models import ENTRIES, LEXICAL_TERMS
from shared.text.lexical import term_index
from tests.platform import eventually, request
from tests.security.support import Tally, count_rows, error_code, mint, report, save

pytestmark = pytest.mark.integration

ALICE = {"kind": "end_user", "id": "alice"}
BOB = {"kind": "end_user", "id": "bob"}
STRATEGIES = ["last_k", "importance", "full", "pack", "semantic", "hybrid"]
ALICE_TEXTS = [
    "Alice's locker code is kept in the blue binder.",
    "Alice is allergic to penicillin.",
    "Alice flies to Lisbon every March.",
    "Alice asked to be called Ali.",
]
BOB_TEXTS = ["Bob's locker code is in the red binder.", "Bob flies to Oslo every June."]


async def _written_messages(nc: Client) -> list[bytes]:
    """Every ``memory.written`` event still in ENGRAM_MEMORY, from the start of the stream."""
    sub = await nc.jetstream().pull_subscribe(
        "engram.memory.written",
        stream="ENGRAM_MEMORY",
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    out: list[bytes] = []
    try:
        while True:
            try:
                msgs = await sub.fetch(256, timeout=0.5)
            except TimeoutError:
                break
            out += [m.data for m in msgs]
            for m in msgs:
                await m.ack()
    finally:
        await sub.unsubscribe()
    return out


async def _embed_caught_up(nc: Client) -> bool:
    info = await nc.jetstream().consumer_info("ENGRAM_MEMORY", "embed")
    return bool(info.num_pending == 0 and info.num_ack_pending == 0)


async def _cached(redis: Any, org: UUID) -> list[bytes]:
    values = []
    async for key in redis.scan_iter(match=f"engram:recall:{org}:*"):
        value = await redis.get(key)
        if value is not None:
            values.append(value)
    return values


async def test_purged_memory_stays_gone_after_replay_and_reindex(
    engram: Infra,
    nc: Client,
    observer_nc: Client,
    db: Database,
    tokens: TokenService,
    embedder: Embedder,
    vector_index: VectorIndex,
    org: UUID,
    agent: UUID,
    service_token: str,
    database_url: str,
) -> None:
    second = uuid4()
    a = str(agent)
    alice_ids = await save(nc, service_token, agent, ALICE_TEXTS[:2], ALICE)
    alice_ids += await save(nc, service_token, agent, ALICE_TEXTS[2:3], ALICE, session_id="s-1")
    alice_ids += await save(nc, service_token, second, ALICE_TEXTS[3:], ALICE)
    # An edit (a new version superseding the old) and a merge (derived from two sources).
    await request(
        nc,
        "engram.config.put",
        {"agent_config_id": a, "config": {"type_policies": {"semantic": {"version_on_edit": True}}}},
        service_token,
    )
    edited = await request(
        nc,
        "engram.memory.manage",
        {
            "agent_config_id": a,
            "principal": ALICE,
            "entry_id": alice_ids[0],
            "op": "edit",
            "text": ALICE_TEXTS[0] + " (green now)",
        },
        service_token,
    )
    merged = await request(
        nc,
        "engram.memory.manage",
        {
            "agent_config_id": a,
            "principal": ALICE,
            "entry_id": alice_ids[1],
            "op": "merge",
            "merge_with": [alice_ids[2]],
            "text": "Alice: penicillin allergy; Lisbon in March.",
        },
        service_token,
    )
    alice_ids += [edited["entry"]["id"], merged["entry"]["id"]]
    bob_ids = await save(nc, service_token, agent, BOB_TEXTS, BOB)
    async with db.read() as s:
        alice_texts = list(
            (
                await s.execute(
                    select(ENTRIES.c.text).where(
                        ENTRIES.c.org_id == org, ENTRIES.c.owner_key == "end_user:alice"
                    )
                )
            ).scalars()
        )

    async def indexed() -> bool:
        return await count_rows(db, ENTRIES.c.org_id == org, ENTRIES.c.embedding_status != "indexed") == 0

    await eventually(indexed, what="every entry indexed")
    alice_token = mint(tokens, org, "end_user:alice", {"memory.read", "memory.purge"})
    redis = redis_asyncio.from_url(engram.settings.redis_url)
    vectors = [list(v) for v in await embedder.embed([*alice_texts, "locker code binder", "flies every"])]
    tenant = TenantFilter(
        org_id=org, agent_config_id=agent, owner_keys=("end_user:alice", "end_user:bob", "")
    )
    tenant2 = TenantFilter(
        org_id=org, agent_config_id=second, owner_keys=("end_user:alice", "end_user:bob", "")
    )
    purged: set[str] = set()
    tally = Tally("erasure-replay")

    async def vector_hits() -> set[str]:
        hits: set[str] = set()
        for v in vectors:
            for t in (tenant, tenant2):
                hits |= {str(h.id) for h in await vector_index.search(v, t, 500)}
        return hits

    # Every lexeme of alice's texts, each weighted 1: any entry sharing one is a lexical hit.
    async with db.read() as session:
        lexemes = {
            lexeme
            for t in alice_texts
            for lexeme in (
                await session.execute(select(func.tsvector_to_array(func.to_tsvector("english", t))))
            ).scalar_one()
        }
    lexical_query = {term_index(lexeme): 1.0 for lexeme in lexemes}
    assert lexical_query

    async def lexical_hits() -> set[str]:
        hits: set[str] = set()
        for t in (tenant, tenant2):
            hits |= {str(h.id) for h in await vector_index.search_lexical(lexical_query, t, 1000)}
        return hits

    async def recall_all(who: str) -> list[dict[str, Any]]:
        replies = []
        for agent_id in (a, str(second)):
            for strategy in STRATEGIES:
                for cue in ("locker code binder", "Alice allergic penicillin Lisbon"):
                    body: dict[str, Any] = {
                        "agent_config_id": agent_id,
                        "strategy": strategy,
                        "cue": cue,
                        "top_k": 20,
                    }
                    if who == "service":
                        replies.append(
                            await request(nc, "engram.recall", {**body, "principal": ALICE}, service_token)
                        )
                    else:
                        replies.append(await request(nc, "engram.recall", body, alice_token))
        return replies

    # Before: alice is everywhere (so "absent" below is the purge's doing), and her last_k,
    # importance and full replies are in Redis.
    assert set(alice_ids) <= await vector_hits()
    assert set(alice_ids) <= await lexical_hits()
    before = await recall_all("service") + await recall_all("alice")
    assert all(error_code(r) is None for r in before)
    found_before = {r["id"] for reply in before for r in reply["results"]}
    assert found_before >= {edited["entry"]["id"], merged["entry"]["id"], alice_ids[3]}
    cached_before = await _cached(redis, org)
    assert any(alice_ids[3].encode() in v or edited["entry"]["id"].encode() in v for v in cached_before)

    receipt = await request(nc, "engram.memory.purge", {"actor_ref": "end_user:alice"}, alice_token)
    assert error_code(receipt) is None, receipt
    purged = {str(i) for i in receipt["entry_ids"]}
    assert set(alice_ids) <= purged

    async def check(stage: str) -> dict[str, int]:
        counts = {
            "rows": 0,
            "vectors": 0,
            "lexical_vectors": 0,
            "lexical_statistics": 0,
            "cached": 0,
            "recalled": 0,
            "expanded": 0,
            "listed": 0,
        }
        counts["rows"] = await count_rows(
            db, ENTRIES.c.org_id == org, ENTRIES.c.owner_key == "end_user:alice"
        )
        counts["rows"] += await count_rows(db, ENTRIES.c.id.in_([UUID(i) for i in purged]))
        counts["vectors"] = len(await vector_hits() & purged)
        counts["lexical_vectors"] = len(await lexical_hits() & purged)
        counts["lexical_statistics"] = await count_rows(
            db,
            LEXICAL_TERMS.c.org_id == org,
            LEXICAL_TERMS.c.owner_key == "end_user:alice",
            table=LEXICAL_TERMS,
        )
        for value in await _cached(redis, org):
            text = value.decode("utf-8", "replace")
            counts["cached"] += int(any(i in text for i in purged) or any(t in text for t in alice_texts))
        for reply in await recall_all("service") + await recall_all("alice"):
            tally.note(reply)
            if error_code(reply):
                tally.problem(f"{stage}: recall failed {reply}")
                continue
            ids = {r["id"] for r in reply["results"]}
            counts["recalled"] += len(ids & purged) + sum(t in reply["context"] for t in alice_texts)
        for agent_id in (a, str(second)):
            expanded = await request(
                nc,
                "engram.recall.expand",
                {"agent_config_id": agent_id, "principal": ALICE, "ids": sorted(purged)},
                service_token,
            )
            tally.note(expanded)
            counts["expanded"] += len(expanded["results"])
            listed = await request(
                nc,
                "engram.memory.list",
                {
                    "agent_config_id": agent_id,
                    "actor_ref": "end_user:alice",
                    "lifecycle": ["active", "stale", "superseded", "suppressed", "disabled"],
                },
                service_token,
            )
            tally.note(listed)
            counts["listed"] += len(listed["entries"])
        return counts

    after_purge = await check("after purge")

    # Replay every memory.written from the start of the stream, as new messages — signed as a
    # service signs them (an insider's replay: unsigned ones never get past the signature check,
    # tests/security/test_wire.py), so what is tested here is the layer beneath.
    written = await _written_messages(observer_nc)
    replayed_ids = {json.loads(d)["entry_id"] for d in written}
    assert purged & replayed_ids, "the stream should still reference alice's entries"
    js = observer_nc.jetstream()
    for data in written:
        headers = engram.signer.sign("engram.memory.written", data, {"Nats-Msg-Id": f"replay-{uuid4()}"})
        await js.publish("engram.memory.written", data, headers=headers)
    await eventually(lambda: _embed_caught_up(observer_nc), what="embed processed the replay")
    await asyncio.sleep(0.2)  # let the relay and cache listeners settle
    # A cold cache (only this organization's keys: other test runs share Redis db 15), then a
    # full rebuild of the vector store from Postgres.
    async for key in redis.scan_iter(match=f"engram:recall*:{org}:*"):
        await redis.delete(key)
    reindexed = await reindex_all(database_url, embedder, vector_index)
    after_replay = await check("after replay and reindex")

    # Bob, never purged, is still found by every path (so "absent" is not "nothing works").
    bob_semantic = await request(
        nc,
        "engram.recall",
        {"agent_config_id": a, "principal": BOB, "strategy": "semantic", "cue": "locker code binder"},
        service_token,
    )
    await redis.aclose()
    report(
        "erasure-replay",
        requests=tally.requests,
        purged=len(purged),
        replayed_messages=len(written),
        reindexed_entries=reindexed,
        after_purge=after_purge,
        after_replay_reindex=after_replay,
        resurrected=sum(after_replay.values()),
        problems=tally.problems,
    )
    assert tally.problems == []
    assert after_purge == dict.fromkeys(after_purge, 0)
    assert after_replay == dict.fromkeys(after_replay, 0)
    assert set(bob_ids) <= {r["id"] for r in bob_semantic["results"]}
    assert set(bob_ids) <= await vector_hits()
