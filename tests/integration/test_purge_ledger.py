"""The purge ledger (decision record 0085) on the running services: a purge and a delete append their
tombstones before they commit, and applying the ledger to a database restored from before them
erases the same memory again — once, with the original tombstones, the audit chain intact."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import pytest
from nats.aio.client import Client
from sqlalchemy import delete, insert, select

from contracts.common import Principal
from shared.runtime.settings import EngramSettings
from shared.security.auth import TokenService
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from shared.storage.db.models import ENTRIES, ERASURES
from shared.storage.purge_ledger import PurgeLedger, reapply
from tests.platform import request

pytestmark = pytest.mark.integration

ALICE = {"kind": "end_user", "id": "alice"}
BOB = {"kind": "end_user", "id": "bob"}


async def _save(
    nc: Client, token: str, agent: UUID, texts: list[str], principal: dict[str, str]
) -> list[str]:
    body = {
        "agent_config_id": str(agent),
        "entries": [{"text": t} for t in texts],
        "wait": True,
        "principal": principal,
    }
    reply = await request(nc, "engram.memory.save", body, token)
    assert reply.get("status") == 200, reply
    return list(reply["ids"])


async def _rows(db: Database, org: UUID) -> list[dict[str, Any]]:
    async with db.read() as s:
        return [
            dict(r._mapping) for r in (await s.execute(select(ENTRIES).where(ENTRIES.c.org_id == org))).all()
        ]


async def test_ledger_outlives_a_restore_and_erases_again_once(
    engram: Infra,
    nc: Client,
    db: Database,
    settings: EngramSettings,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    service_token: str,
) -> None:
    await _save(nc, service_token, agent, ["Alice prefers tea.", "Alice lives in Lyon."], ALICE)
    bob_ids = await _save(nc, service_token, agent, ["Bob likes dark mode.", "Bob uses vim."], BOB)
    backup = await _rows(db, org)  # what a backup taken now holds
    assert len(backup) == 4

    ledger = PurgeLedger(settings.purge_ledger_path())
    before = {r.id for r in ledger.read()}
    alice = tokens.mint(
        org_id=org,
        principal=Principal.parse_ref("end_user:alice"),
        permissions={"memory.read", "memory.purge"},
    )
    receipt = await request(
        nc, "engram.memory.purge", {"agent_config_id": str(agent), "actor_ref": "end_user:alice"}, alice
    )
    assert receipt["entries"] == 2
    deleted = await request(
        nc, "engram.memory.delete", {"agent_config_id": str(agent), "entry_id": bob_ids[0]}, service_token
    )
    assert deleted["entries"] == 1

    records = [r for r in ledger.read() if r.id not in before]
    assert [(r.owner_key, r.reason) for r in records] == [
        ("end_user:alice", "purge"),
        ("end_user:bob", "delete"),
    ]
    assert records[0].recall_history_of == "end_user:alice"
    assert records[0].fingerprints is None  # the whole owner
    assert records[1].fingerprints is not None
    assert len(records[1].fingerprints) == 1  # the one text
    raw = ledger.path.read_text()
    assert "tea" not in raw  # ids and hashes, never text
    assert "dark mode" not in raw
    assert oct(ledger.path.stat().st_mode & 0o777) == "0o600"
    async with db.read() as s:
        tombstones = {
            r.id for r in (await s.execute(select(ERASURES.c.id).where(ERASURES.c.org_id == org))).all()
        }
    assert tombstones == {r.id for r in records}  # the ledger holds the very tombstones

    # "Restore" the older state: the rows back, the tombstones gone (they were written after it).
    async with db.transaction() as s:
        await s.execute(delete(ERASURES).where(ERASURES.c.org_id == org))
        await s.execute(delete(ENTRIES).where(ENTRIES.c.org_id == org))
        # ``search`` is computed by Postgres from the text.
        await s.execute(insert(ENTRIES), [{k: v for k, v in r.items() if k != "search"} for r in backup])

    done = await reapply(db, records)
    assert done.erasures == 2
    assert sorted(map(str, done.entry_ids or [])) == sorted(
        str(r["id"]) for r in backup if r["owner_key"] == "end_user:alice" or str(r["id"]) == bob_ids[0]
    )
    left = await _rows(db, org)
    assert [str(r["id"]) for r in left] == [bob_ids[1]]  # bob's other memory stays
    async with db.read() as s:
        restored = {
            r.id for r in (await s.execute(select(ERASURES.c.id).where(ERASURES.c.org_id == org))).all()
        }
    assert restored == {r.id for r in records}  # the original tombstones, so replays stay refused

    again = await reapply(db, records)  # idempotent: every tombstone is present now
    assert again.erasures == 0

    verdict = await request(nc, "engram.audit.verify", {}, service_token, timeout=60)
    assert verdict["ok"] is True, verdict
    page = await request(nc, "engram.audit.query", {"after_seq": 0, "limit": 1000}, service_token)
    reapplied = [r for r in page["records"] if r["details"].get("reapplied_from") == "purge-ledger"]
    assert sorted(r["kind"] for r in reapplied) == ["memory.deleted", "memory.purged"], reapplied
    assert json.dumps(reapplied).count("service:engram-restore") >= 2


def test_a_torn_last_line_is_skipped_and_a_damaged_middle_refused(tmp_path: Any) -> None:
    from datetime import UTC, datetime
    from uuid import uuid4

    ledger = PurgeLedger(tmp_path / "ledger.jsonl")
    row = {
        "id": uuid4(),
        "org_id": uuid4(),
        "agent_config_id": None,
        "owner_key": "end_user:alice",
        "session_id": None,
        "fingerprints": None,
        "erased_at": datetime.now(UTC),
        "reason": "purge",
    }
    from shared.storage.purge_ledger import LedgerRecord

    ledger.append([LedgerRecord.of_tombstone(row, "end_user:alice")])
    with ledger.path.open("a") as handle:
        handle.write('{"id": "torn')  # a crash mid-append
    assert [r.id for r in ledger.read()] == [row["id"]]
    ledger.path.write_text('{"garbage": 1}\n' + ledger.path.read_text().splitlines()[0] + "\n")
    with pytest.raises(ValueError, match="line 1"):
        ledger.read()
