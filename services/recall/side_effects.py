"""Recall's side effects (SPEC 5.6), off the hot path: recall records, access counts and the
audit record of each disclosure, written in batches by one background task.

A recall answers before its record is written; records queue in memory and are flushed every
``interval_s`` or ``max_batch`` recalls, in one transaction per flush (and at shutdown). A crash
can lose at most the unflushed interval — a deliberate trade for a recall path without a
synchronous write (docs/adr/0039-recall-side-effects.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from sqlalchemy import insert

from shared import audit
from shared.background import cancel
from shared.db.engine import Database
from shared.db.models import RECALLS
from shared.entries import EntryStore
from shared.time import utcnow

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


class SideEffects:
    def __init__(self, db: Database, *, interval_s: float = 0.1, max_batch: int = 500) -> None:
        self._db = db
        self._interval = interval_s
        self._max = max_batch
        self._queue: list[Disclosure] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.flushed = 0

    def record(self, disclosure: Disclosure) -> None:
        self._queue.append(disclosure)
        if len(self._queue) >= self._max:
            self._wake.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="recall-side-effects")

    async def stop(self) -> None:
        await cancel(self._task)
        self._task = None
        await self.flush()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self._interval)
            self._wake.clear()
            try:
                await self.flush()
            except Exception:
                log.warning("recall side effects not written yet; retrying", exc_info=True)
                await asyncio.sleep(1.0)

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
