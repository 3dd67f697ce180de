"""Recall's side effects (SPEC 5.6), off the hot path: recall records, access counts and the
audit record of each disclosure, written in batches by one background task.

A recall answers before its record is written; records queue in memory and are flushed
``interval_s`` after the first of them or at ``max_batch`` recalls, in one transaction per flush
(and at shutdown); nothing runs while nobody recalls. A crash
can lose at most the unflushed interval — a deliberate trade for a recall path without a
synchronous write (docs/adr/0039-recall-side-effects.md).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from sqlalchemy import insert

from shared.runtime.background import PeriodicWorker
from shared.runtime.time import utcnow
from shared.storage import audit
from shared.storage.db.engine import Database
from shared.storage.db.models import RECALLS
from shared.storage.entries import EntryStore

__all__ = ["Disclosure", "SideEffects"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Disclosure:
    pack_id: UUID
    org_id: UUID
    agent_config_id: UUID
    caller_ref: str
    session_id: str | None
    strategy: str
    cue_hash: str | None
    entry_ids: tuple[UUID, ...]
    at: datetime
    kind: str = "memory.recalled"


class SideEffects(PeriodicWorker):
    name = "recall-side-effects"

    def __init__(self, db: Database, *, interval_s: float = 0.1, max_batch: int = 500) -> None:
        # Idle until a recall records something: nothing wakes while nobody recalls.
        super().__init__(None)
        #: How long the first record waits for company before its flush.
        self._window = interval_s
        self._db = db
        self._max = max_batch
        self._queue: list[Disclosure] = []
        self.flushed = 0

    def record(self, disclosure: Disclosure) -> None:
        self._queue.append(disclosure)
        if len(self._queue) == 1 or len(self._queue) >= self._max:
            self.wake()

    async def tick(self) -> None:
        if 0 < len(self._queue) < self._max:
            await self._pause(self._window)  # company for the first record; cut short at max_batch
        # Postgres away: the records stay queued and are written by a later tick.
        await self.flush()

    async def finished(self) -> None:
        await self.flush()

    async def flush(self) -> int:
        batch, self._queue = self._queue, []
        if not batch:
            return 0
        try:
            await self._write(batch)
        except Exception:
            self._queue = batch + self._queue  # keep them for the next attempt
            raise
        self.flushed += len(batch)
        return len(batch)

    async def _write(self, batch: list[Disclosure]) -> None:
        now = utcnow()
        hits: Counter[UUID] = Counter(i for d in batch for i in d.entry_ids)
        by_org: dict[UUID, list[audit.AuditEntry]] = {}
        for d in batch:
            by_org.setdefault(d.org_id, []).append(
                audit.AuditEntry(
                    kind=d.kind,
                    actor_ref=d.caller_ref,
                    agent_config_id=d.agent_config_id,
                    session_id=d.session_id,
                    entry_ids=d.entry_ids,
                    details={"pack_id": str(d.pack_id), "strategy": d.strategy, "count": len(d.entry_ids)},
                )
            )
        async with self._db.transaction() as session:
            await session.execute(
                insert(RECALLS),
                [
                    {
                        "pack_id": d.pack_id,
                        "org_id": d.org_id,
                        "agent_config_id": d.agent_config_id,
                        "caller_ref": d.caller_ref,
                        "session_id": d.session_id,
                        "strategy": d.strategy,
                        "cue_hash": d.cue_hash,
                        "entry_ids": [str(i) for i in d.entry_ids],
                        "created_at": d.at,
                        "label": None,
                        "label_source": None,
                    }
                    for d in batch
                ],
            )
            await EntryStore(session).accessed(hits, now)
            for org_id in sorted(by_org, key=str):
                await audit.append(session, org_id, by_org[org_id])
