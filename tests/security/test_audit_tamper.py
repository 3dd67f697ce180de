"""Tampering with the audit chain behind the database's append-only trigger (SPEC 7.4): altering,
deleting (in the middle, at the end, with the rest renumbered), reordering and appending a row are
each named by ``engram.audit.verify``. (``tests/integration/test_requests.py`` covers altering
``details``; this covers the rest.) The trigger is disabled inside the tampering transaction only,
as the existing test does."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID, uuid4

import pytest
from nats.aio.client import Client
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from contracts.common import Principal
from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.service.infra import Infra
from shared.storage.audit import record_hash
from shared.storage.db.engine import Database
from shared.storage.db.models import AuditRecord
from tests.platform import request
from tests.security.support import Tally, report

pytestmark = pytest.mark.integration

RECORDS = 6
K = 3  # the row tampered with (1-based seq, in the middle)

Tamper = Callable[[AsyncConnection, UUID], Awaitable[None]]


async def _alter_actor(conn: AsyncConnection, org: UUID) -> None:
    await conn.execute(
        text("UPDATE audit_log SET actor_ref = 'actor:nobody' WHERE org_id = :o AND seq = :s"),
        {"o": org, "s": K},
    )


async def _alter_time(conn: AsyncConnection, org: UUID) -> None:
    await conn.execute(
        text(
            "UPDATE audit_log SET occurred_at = occurred_at - interval '1 day' WHERE org_id = :o AND seq = :s"
        ),
        {"o": org, "s": K},
    )


async def _alter_entry_ids(conn: AsyncConnection, org: UUID) -> None:
    await conn.execute(
        text("UPDATE audit_log SET entry_ids = '[]'::jsonb WHERE org_id = :o AND seq = :s"),
        {"o": org, "s": K},
    )


async def _delete_middle(conn: AsyncConnection, org: UUID) -> None:
    await conn.execute(text("DELETE FROM audit_log WHERE org_id = :o AND seq = :s"), {"o": org, "s": K})


async def _delete_last(conn: AsyncConnection, org: UUID) -> None:
    await conn.execute(text("DELETE FROM audit_log WHERE org_id = :o AND seq = :s"), {"o": org, "s": RECORDS})


async def _delete_and_renumber(conn: AsyncConnection, org: UUID) -> None:
    """Delete row K, close the gap, and move the chain head back: no hole left to see."""
    await conn.execute(text("DELETE FROM audit_log WHERE org_id = :o AND seq = :s"), {"o": org, "s": K})
    for seq in range(K + 1, RECORDS + 1):
        await conn.execute(
            text("UPDATE audit_log SET seq = :n WHERE org_id = :o AND seq = :s"),
            {"o": org, "s": seq, "n": seq - 1},
        )
    await conn.execute(
        text(
            "UPDATE audit_heads SET seq = :n, "
            "hash = (SELECT hash FROM audit_log WHERE org_id = :o AND seq = :n) WHERE org_id = :o"
        ),
        {"o": org, "n": RECORDS - 1},
    )


async def _swap(conn: AsyncConnection, org: UUID) -> None:
    """Reorder: rows K and K+1 trade places (seq is the order)."""
    for s, n in ((K, -1), (K + 1, K), (-1, K + 1)):
        await conn.execute(
            text("UPDATE audit_log SET seq = :n WHERE org_id = :o AND seq = :s"), {"o": org, "s": s, "n": n}
        )


async def _swap_contents(conn: AsyncConnection, org: UUID) -> None:
    """Reorder by content: rows K and K+1 keep their seq but trade kind, ids, details and time."""
    await conn.execute(
        text(
            "UPDATE audit_log a SET (kind, occurred_at, actor_ref, agent_config_id, session_id, "
            "entry_ids, details) = (SELECT kind, occurred_at, actor_ref, agent_config_id, session_id, "
            "entry_ids, details FROM audit_log b WHERE b.org_id = a.org_id "
            "AND b.seq = CASE WHEN a.seq = :k THEN :k1 ELSE :k END) "
            "WHERE a.org_id = :o AND a.seq IN (:k, :k1)"
        ),
        {"o": org, "k": K, "k1": K + 1},
    )


async def _append_forged(conn: AsyncConnection, org: UUID) -> None:
    """A well-formed record appended after the last one, hash and all, without moving the head."""
    last = (
        await conn.execute(
            text("SELECT hash FROM audit_log WHERE org_id = :o AND seq = :s"), {"o": org, "s": RECORDS}
        )
    ).scalar_one()
    from datetime import UTC, datetime

    forged = AuditRecord(
        org_id=org,
        seq=RECORDS + 1,
        id=uuid4(),
        kind="memory.purged",
        occurred_at=datetime.now(UTC),
        actor_ref="actor:nobody",
        agent_config_id=None,
        session_id=None,
        entry_ids=[],
        details={"count": 0},
        prev_hash=str(last),
        hash="",
    )
    forged.hash = record_hash(forged)
    await conn.execute(
        text(
            "INSERT INTO audit_log (org_id, seq, id, kind, occurred_at, actor_ref, agent_config_id, "
            "session_id, entry_ids, details, prev_hash, hash) VALUES (:org_id, :seq, :id, :kind, "
            ":occurred_at, :actor_ref, NULL, NULL, '[]'::jsonb, CAST(:details AS jsonb), :prev_hash, :hash)"
        ),
        {
            **forged.model_dump(exclude={"agent_config_id", "session_id", "entry_ids"}),
            "details": '{"count": 0}',
        },
    )


SCENARIOS: dict[str, tuple[Tamper, int | None]] = {
    # name: (tampering, the seq verify must name; None: detection is enough)
    "alter_actor_ref": (_alter_actor, K),
    "alter_occurred_at": (_alter_time, K),
    "alter_entry_ids": (_alter_entry_ids, K),
    "delete_middle": (_delete_middle, K),
    "delete_last": (_delete_last, RECORDS),
    "delete_and_renumber": (_delete_and_renumber, K),
    "reorder_by_seq": (_swap, K),
    "reorder_by_content": (_swap_contents, K),
    # Detected through the head; verify then names seq RECORDS + 2 ("records after this one were
    # removed"), not the forged RECORDS + 1: a misleading diagnosis, but a detection.
    "append_without_head": (_append_forged, None),
}


async def test_every_kind_of_audit_tampering_is_detected(
    engram: Infra, nc: Client, db: Database, tokens: TokenService
) -> None:
    tally = Tally("audit-tamper")
    outcomes: dict[str, Any] = {}
    for name, (tamper, broken_seq) in SCENARIOS.items():
        org, agent = uuid4(), uuid4()
        token = tokens.mint(
            org_id=org, principal=Principal(kind="service", id="runner"), permissions=ALL_PERMISSIONS
        )
        for i in range(RECORDS):
            body = {"agent_config_id": str(agent), "wait": True, "content": f"audited fact {i}"}
            assert (await request(nc, "engram.memory.save", body, token))["status"] == 200
        clean = await request(nc, "engram.audit.verify", {}, token)
        assert clean == {"ok": True, "checked": RECORDS, "first_broken": None}, clean
        async with db.engine.begin() as conn:
            await conn.execute(text("ALTER TABLE audit_log DISABLE TRIGGER audit_log_no_change"))
            await tamper(conn, org)
            await conn.execute(text("ALTER TABLE audit_log ENABLE TRIGGER audit_log_no_change"))
        verdict = await request(nc, "engram.audit.verify", {}, token)
        tally.note(verdict)
        outcomes[name] = verdict
        broken = verdict.get("first_broken") or {}
        if verdict.get("ok") is not False or broken_seq not in (None, broken.get("seq")):
            tally.problem(f"{name}: {verdict}")
    report(
        "audit-tamper",
        requests=tally.requests,
        scenarios=len(SCENARIOS),
        detected=len(SCENARIOS) - len(tally.problems),
        undetected=len(tally.problems),
        outcomes={k: (v.get("first_broken") or {}).get("reason") for k, v in outcomes.items()},
        problems=tally.problems,
    )
    assert tally.problems == []
