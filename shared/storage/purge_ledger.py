"""The purge ledger: every owner's erasure, kept outside the database and outside its backups.

A backup is older than the erasures made after it. Restored alone it would bring their memory
back, and the tombstones that guard against that (``erasures``) are restored with it, as old as
the rest. So each tombstone a purge or delete writes is also appended here (JSON Lines, one
tombstone a line: ids, scope and fingerprints, never text), before its transaction commits: an
erasure that then rolls back leaves a line that, applied again, erases what its owner asked to
erase anyway — the safe direction. ``engram restore`` applies every line whose tombstone the
restored database lacks before the restored deployment answers (decision record 0085).

Appends are single ``write`` calls with ``O_APPEND`` (lines from several processes do not
interleave) followed by ``fsync``. A crash mid-line leaves a torn last line, which is skipped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from sqlalchemy import select

from shared.storage.db.engine import Database
from shared.storage.db.models import ERASURES
from shared.storage.entries import covered
from shared.storage.erasure import Tombstone, erase

__all__ = ["LedgerRecord", "PurgeLedger", "Reapplied", "reapply"]

log = logging.getLogger(__name__)

#: Who an erasure applied again from the ledger is recorded as, in its audit record.
REAPPLIED_BY = "service:engram-restore"


@dataclass(frozen=True)
class LedgerRecord:
    """One tombstone as the ledger keeps it, and whose recall history the erasure deleted."""

    id: UUID
    org_id: UUID
    agent_config_id: UUID | None
    owner_key: str
    session_id: str | None
    fingerprints: tuple[str, ...] | None
    erased_at: datetime
    reason: str
    recall_history_of: str | None = None

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> LedgerRecord:
        fingerprints = raw.get("fingerprints")
        return cls(
            id=UUID(raw["id"]),
            org_id=UUID(raw["org_id"]),
            agent_config_id=UUID(raw["agent_config_id"]) if raw.get("agent_config_id") else None,
            owner_key=str(raw["owner_key"]),
            session_id=raw.get("session_id"),
            fingerprints=tuple(fingerprints) if fingerprints is not None else None,
            erased_at=datetime.fromisoformat(raw["erased_at"]),
            reason=str(raw["reason"]),
            recall_history_of=raw.get("recall_history_of"),
        )

    @classmethod
    def of_tombstone(cls, row: Mapping[str, Any], recall_history_of: str | None) -> LedgerRecord:
        return cls(
            id=row["id"],
            org_id=row["org_id"],
            agent_config_id=row["agent_config_id"],
            owner_key=row["owner_key"],
            session_id=row["session_id"],
            fingerprints=tuple(row["fingerprints"]) if row["fingerprints"] is not None else None,
            erased_at=row["erased_at"],
            reason=row["reason"],
            recall_history_of=recall_history_of,
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "id": str(self.id),
                "org_id": str(self.org_id),
                "agent_config_id": str(self.agent_config_id) if self.agent_config_id else None,
                "owner_key": self.owner_key,
                "session_id": self.session_id,
                "fingerprints": list(self.fingerprints) if self.fingerprints is not None else None,
                "erased_at": self.erased_at.isoformat(),
                "reason": self.reason,
                "recall_history_of": self.recall_history_of,
            },
            separators=(",", ":"),
        )


class PurgeLedger:
    """The append-only ledger file at ``path`` (created 0600 on first append)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def create(self) -> None:
        """Create the ledger, empty, if it is missing (the services do at start): from then on a
        missing ledger is a lost one, and restore says so instead of finding nothing to apply."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))

    def append(self, records: Iterable[LedgerRecord]) -> None:
        """Append ``records``, one line each, in one write, and sync."""
        lines = "".join(record.to_json() + "\n" for record in records)
        if not lines:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, lines.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    async def record(self, tombstones: list[dict[str, Any]], *, recall_history_of: str | None) -> None:
        """Append the tombstones (rows as :func:`shared.storage.erasure.erase` wrote them) off the event
        loop (an fsync may take a while on a busy disk)."""
        if tombstones:
            records = [LedgerRecord.of_tombstone(t, recall_history_of) for t in tombstones]
            await asyncio.to_thread(self.append, records)

    def read(self) -> list[LedgerRecord]:
        """Every whole line, in order; a torn last line (a crash mid-append) is skipped."""
        if not self.path.exists():
            return []
        records = []
        lines = self.path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                records.append(LedgerRecord.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                if number == len(lines):
                    log.warning("skipping the torn last line of %s (a crash mid-append)", self.path)
                    continue
                raise ValueError(f"{self.path} line {number} is not a ledger record") from None
        return records


@dataclass
class Reapplied:
    """What applying the ledger to a restored database did."""

    #: ledger records whose tombstone the database lacked, applied now.
    erasures: int = 0
    #: the entries they erased (their vectors must go too).
    entry_ids: list[UUID] | None = None


async def reapply(db: Database, records: Iterable[LedgerRecord]) -> Reapplied:
    """Apply every record whose tombstone ``db`` lacks: erase what it covers (entries created up to
    its time, their lineage, the owner's recall history) and write its tombstone with the original
    id and time, one transaction each, through the one erase path (so audit records, the chain and
    ``memory.purged`` follow). Idempotent: an applied record's tombstone is then present."""
    done = Reapplied(entry_ids=[])
    assert done.entry_ids is not None
    for record in records:
        async with db.transaction() as session:
            present = (await session.execute(select(ERASURES.c.id).where(ERASURES.c.id == record.id))).first()
            if present is not None:
                continue
            where = covered(
                record.org_id,
                record.agent_config_id,
                record.owner_key,
                session_id=record.session_id,
                fingerprints=record.fingerprints,
                until=record.erased_at,
            )
            erased = await erase(
                session,
                org_id=record.org_id,
                where=where,
                reason=record.reason,
                requested_by=REAPPLIED_BY,
                actor_ref=record.recall_history_of,
                session_id=record.session_id,
                tombstones=[
                    Tombstone(
                        owner_key=record.owner_key,
                        agent_config_id=record.agent_config_id,
                        session_id=record.session_id,
                        fingerprints=record.fingerprints,
                        id=record.id,
                        erased_at=record.erased_at,
                    )
                ],
                recall_history_of=record.recall_history_of,
                audit_kind="memory.deleted" if record.reason == "delete" else "memory.purged",
                audit_details={"reapplied_from": "purge-ledger", "ledger_id": str(record.id)},
                agent_config_id=record.agent_config_id,
            )
        done.erasures += 1
        done.entry_ids.extend(erased.ids)
    return done
