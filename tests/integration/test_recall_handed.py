"""What an agent is handed, through the real write path and ``engram.recall``: the demo's two
declined refunds for end_user:alice leave a lesson, observations and outcomes that say one thing
many times; recall folds the copies into the entry kept above them and puts the lesson that says
what worked first (docs/adr/0094-what-recall-hands-an-agent.md). And a relative date in the cue
("yesterday") counts from the request's ``asked_at`` (docs/adr/0036-time-grounding.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
from nats.aio.client import Client
from sqlalchemy import text

from services.cli.demo_data import demo_sessions
from services.recall.distinct import similar, word_set
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from tests.platform import eventually, publish_session, request

pytestmark = pytest.mark.integration

ALICE = {"kind": "end_user", "id": "alice"}
CUE = "my card got declined"


async def _settled(db: Database, org: UUID, sessions: int) -> bool:
    """Every session distilled and every entry indexed."""
    async with db.read() as s:
        done = (
            await s.execute(
                text(
                    "SELECT count(*) FROM audit_log WHERE org_id = :org "
                    "AND kind IN ('distill.completed', 'distill.skipped')"
                ),
                {"org": org},
            )
        ).scalar_one()
        waiting = (
            await s.execute(
                text(
                    "SELECT count(*) FROM memory_entries "
                    "WHERE org_id = :org AND embedding_status <> 'indexed'"
                ),
                {"org": org},
            )
        ).scalar_one()
    return bool(done >= sessions and waiting == 0)


async def _recall(nc: Client, token: str, agent: UUID, **extra: Any) -> dict[str, Any]:
    body = {"agent_config_id": str(agent), "principal": ALICE, "strategy": "hybrid", "top_k": 10, **extra}
    reply = await request(nc, "engram.recall", body, token, timeout=30)
    assert "error" not in reply, reply
    return reply


async def test_copies_of_one_failure_are_folded_and_the_fix_comes_first(
    engram: Infra, nc: Client, db: Database, org: UUID, agent: UUID, service_token: str
) -> None:
    config = {"agent_config_id": str(agent), "config": {"keep_observations": True}}
    assert "error" not in await request(nc, "engram.config.put", config, service_token)
    alice = [
        {**s, "event_id": str(uuid4())}  # the demo's ids are fixed; another test may have used them
        for s in demo_sessions(org, agent, org, agent, now=datetime.now(UTC))
        if s["principal"] == ALICE
    ]
    assert len(alice) == 2
    for s in alice:
        await publish_session(nc, s, service_token)

    async def settled() -> bool:
        return await _settled(db, org, len(alice))

    await eventually(settled, timeout=120, what="alice's sessions distilled and indexed")

    as_ranked = (await _recall(nc, service_token, agent, cue=CUE, collapse_similar=False))["results"]
    folded = (await _recall(nc, service_token, agent, cue=CUE))["results"]
    words = [word_set(r["text"]) for r in folded]
    # No two results say nearly the same words, and what was folded is counted.
    assert not any(similar(a, b) for i, a in enumerate(words) for b in words[i + 1 :])
    assert sum(r.get("similar_count", 0) for r in folded) >= 2
    # As ranked, the copies were there: every entry recall left out nearly repeats one it kept.
    kept = {r["id"] for r in folded}
    left_out = [r for r in as_ranked[: len(folded)] if r["id"] not in kept]
    assert left_out
    for r in left_out:
        assert any(similar(word_set(r["text"]), w) for w in words), r["text"]
    # The lesson that says what worked ranks in the top 3, ahead of the raw calls of its session.
    fix = next(i for i, r in enumerate(folded) if "store_credit" in r["text"] and r["layer"] == "memory")
    assert fix < 3, [r["text"] for r in folded]
    session = folded[fix]["session_id"]
    assert all(not (r["layer"] == "observation" and r["session_id"] == session) for r in folded[:fix]), [
        r["text"] for r in folded
    ]


async def test_full_format_carries_the_count_and_other_strategies_list_as_stored(
    engram: Infra, nc: Client, service_token: str
) -> None:
    """Three saves of one fact with another order id: hybrid folds them; last_k lists them all."""
    agent = uuid4()
    texts = [f"Refund for order A-{n} was declined by the card issuer (code 05)." for n in (1042, 1107, 2210)]
    body = {
        "agent_config_id": str(agent),
        "wait": True,
        "principal": ALICE,
        "entries": [{"text": t, "importance": 0.5, "memory_type": "fact"} for t in texts],
    }
    assert (await request(nc, "engram.memory.save", body, service_token))["saved"] == 3

    async def indexed() -> bool:
        reply = await _recall(nc, service_token, agent, cue="refund declined", collapse_similar=False)
        return len(reply["results"]) == 3

    await eventually(indexed, timeout=60, what="three entries indexed")
    (only,) = (await _recall(nc, service_token, agent, cue="refund declined", format="full"))["results"]
    assert only["similar_count"] == 2
    listed = await _recall(nc, service_token, agent, strategy="last_k", format="full")
    assert [r["similar_count"] for r in listed["results"]] == [0, 0, 0]


async def test_yesterday_counts_from_asked_at(engram: Infra, nc: Client, service_token: str) -> None:
    """Two deploy failures a week apart: "yesterday" asked the day after the older one puts it
    first; asked the day after the newer one, the newer one."""
    agent = uuid4()
    asked = datetime(2026, 6, 10, 15, 0, tzinfo=UTC)
    days = {
        "billing service failed on the migration step": asked - timedelta(days=8),
        "search frontend failed after the cache warm-up": asked - timedelta(days=1),
    }
    body = {
        "agent_config_id": str(agent),
        "wait": True,
        "principal": ALICE,
        "entries": [
            {
                "text": f"The deploy of the {name}.",
                "importance": 0.5,
                "memory_type": "episodic",
                "occurred_at": when.isoformat(),
            }
            for name, when in days.items()
        ],
    }
    assert (await request(nc, "engram.memory.save", body, service_token))["saved"] == 2
    cue = "which deploy failed yesterday"

    async def indexed() -> bool:
        return len((await _recall(nc, service_token, agent, cue=cue))["results"]) == 2

    await eventually(indexed, timeout=60, what="two entries indexed")
    for name, when in days.items():
        reply = await _recall(
            nc, service_token, agent, cue=cue, asked_at=(when + timedelta(days=1)).isoformat()
        )
        assert name in reply["results"][0]["text"]


async def test_asked_at_without_a_time_zone_is_a_typed_error(
    engram: Infra, nc: Client, service_token: str, agent: UUID
) -> None:
    body = {
        "agent_config_id": str(agent),
        "principal": ALICE,
        "strategy": "hybrid",
        "cue": "what failed yesterday",
        "asked_at": "2026-06-10T15:00:00",
    }
    reply = await request(nc, "engram.recall", body, service_token)
    assert reply["error"]["code"] == "INVALID_REQUEST", reply
