"""The retention sweeper (SPEC 7.2): deletes expired entries off the recall hot path.

Recall already hides an entry the moment ``expires_at`` passes (its SQL predicate); the sweeper
only reclaims the rows, vectors and cached results later, through the one erase path
(``memory.purged`` with reason ``expired``, audit ``memory.expired``). Several governance
instances may sweep at once: ``FOR UPDATE SKIP LOCKED`` hands each a disjoint batch.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from uuid import UUID

from shared.observability.metrics import RETENTION_SWEEPS, RETENTION_SWEPT
from shared.runtime.background import PeriodicWorker
from shared.runtime.time import utcnow
from shared.storage.db.engine import Database
from shared.storage.entries import EntryStore, with_ids
from shared.storage.erasure import Erased, erase

__all__ = ["RetentionSweeper"]

log = logging.getLogger(__name__)

AfterErase = Callable[[UUID, Erased], Awaitable[object]]


class RetentionSweeper(PeriodicWorker):
    name = "retention-sweeper"

    def __init__(
        self, db: Database, after_erase: AfterErase, *, interval_s: float = 30.0, batch: int = 500
    ) -> None:
        super().__init__(interval_s)
        self.retry_s = interval_s  # nothing is waiting for a sweep: Postgres away, try next round
        self._db = db
        self._after = after_erase
        self._batch = batch
        self.swept = 0

    async def sweep_once(self) -> int:
        """Erase every entry expired by now, batch by batch; returns how many."""
        total = 0
        while True:
            done: list[tuple[UUID, Erased]] = []
            async with self._db.transaction() as session:
                rows = await EntryStore(session).expired(utcnow(), self._batch)
                by_org: dict[UUID, list[UUID]] = {}
                for entry_id, org_id in rows:
                    by_org.setdefault(org_id, []).append(entry_id)
                # Organizations in a fixed order: their chain locks are taken in that order.
                for org_id in sorted(by_org, key=str):
                    erased = await erase(
                        session,
                        org_id=org_id,
                        where=with_ids(by_org[org_id]),
                        reason="expired",
                        requested_by="engram:retention",
                        audit_kind="memory.expired",
                    )
                    done.append((org_id, erased))
            for org_id, erased in done:
                await self._after(org_id, erased)
                total += len(erased.ids)
            if len(rows) < self._batch:
                break
        self.swept += total
        RETENTION_SWEEPS.inc()
        RETENTION_SWEPT.inc(total)
        return total

    async def tick(self) -> None:
        swept = await self.sweep_once()
        if swept:
            log.info("retention sweeper erased %d expired entries", swept)
