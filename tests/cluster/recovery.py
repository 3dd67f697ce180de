"""What "the deployment serving again" means after a fault, condition by condition — and, while
it does not hold yet, what is missing: which process is not ready (its ``/readyz`` answer), which
transport has not succeeded since the fault (with its last error), whether a session published
since has come out of the pipeline distilled. A wait that times out shows this list (STYLE 22).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from uuid import UUID

from sqlmodel import col, select

from shared.security.nats_auth.permissions import GATEWAY
from shared.storage.db.engine import Database
from shared.storage.db.models import AuditRecord
from tests.cluster.harness import Cluster
from tests.cluster.workload import Outcome, Publish, Workload

__all__ = ["Recovery"]


class Recovery:
    """The conditions of recovery for ``cluster`` under ``work`` (sessions of ``org``)."""

    def __init__(self, cluster: Cluster, work: Workload, db: Database, org: UUID) -> None:
        self._cluster = cluster
        self._work = work
        self._db = db
        self._org = org

    async def missing(self, since: float) -> list[str]:
        """Everything not back yet after a fault at ``since`` (empty: serving again): every
        process ready; a recall over NATS and a governance request answered, a recall answered
        by each gateway, a session acknowledged over NATS and over HTTP — each issued after
        ``since`` (a stream still electing its leader refuses publishes while recall answers) —
        and one of those sessions distilled (the consumers behind the streams take work again)."""
        return [
            *await self.processes_not_ready(),
            *self.requests_missing(since, "recall", "governance"),
            *self.gateways_missing(since),
            *self.publishes_missing(since),
            *await self.distilled_missing(since),
        ]

    async def processes_not_ready(self) -> list[str]:
        """One line per process whose ``/readyz`` is not 200: its status and failing checks (and
        how long the workload's own requests took meanwhile, to tell slow from absent)."""
        processes = self._cluster.processes
        answers = await asyncio.gather(*(asyncio.to_thread(p.readiness) for p in processes))
        lines = [f"{p.label} not ready: {seen}" for p, seen in zip(processes, answers, strict=True) if seen]
        if lines:
            lines.append(self.latencies())
        return lines

    def latencies(self, last: int = 50) -> str:
        """How the workload's last ``last`` requests of each kind fared (answer time, failures)."""
        parts = []
        for kind in sorted({o.kind for o in self._work.outcomes}):
            recent = [o for o in self._work.outcomes if o.kind == kind][-last:]
            times = sorted(o.seconds for o in recent)
            failed = sum(1 for o in recent if not o.ok)
            parts.append(
                f"{kind}: p50 {times[len(times) // 2]:.1f} s, max {times[-1]:.1f} s, "
                f"{failed} of {len(recent)} failed"
            )
        return "meanwhile, the workload's last requests: " + "; ".join(parts)

    def requests_missing(self, since: float, *kinds: str) -> list[str]:
        """Each request kind (over NATS) with no answer issued after ``since``."""
        return [
            line
            for kind in kinds
            if (line := _none_ok(f"NATS {kind}", [o for o in self._since(since) if o.kind == kind]))
        ]

    def gateways_missing(self, since: float) -> list[str]:
        """Each gateway replica that has answered no HTTP recall issued after ``since``."""
        lines = []
        for gateway in self._cluster.of((GATEWAY,)):
            tried = [o for o in self._since(since) if o.kind == "http-recall" and o.via == gateway.base_url]
            if line := _none_ok(f"HTTP recall via {gateway.label}", tried):
                lines.append(line)
        return lines

    def publishes_missing(self, since: float) -> list[str]:
        """Each transport ("nats", "http") with no session acknowledged after ``since``."""
        attempts = [p for p in self._work.publishes if p.at >= since]
        lines = []
        for transport in ("nats", "http"):
            tried = [p for p in attempts if p.transport == transport]
            if line := _none_ok(f"{transport.upper()} session publish", tried):
                lines.append(line)
        return lines

    async def distilled_missing(self, since: float) -> list[str]:
        """Empty once a session acknowledged after ``since`` has its ``distill.completed``."""
        acked = [p.session_id for p in self._work.publishes if p.ok and p.at >= since]
        if not acked:
            return ["a session published since the fault distilled: none acknowledged yet"]
        if await self._any_distilled(acked):
            return []
        return [f"a session published since the fault distilled: none of {len(acked)} acknowledged is yet"]

    async def _any_distilled(self, session_ids: Iterable[str]) -> bool:
        query = (
            select(col(AuditRecord.session_id))
            .where(
                col(AuditRecord.org_id) == self._org,
                col(AuditRecord.kind) == "distill.completed",
                col(AuditRecord.session_id).in_(list(session_ids)),
            )
            .limit(1)
        )
        async with self._db.read() as s:
            return (await s.execute(query)).first() is not None

    def _since(self, since: float) -> list[Outcome]:
        return [o for o in self._work.outcomes if o.at >= since]


def _none_ok(what: str, tried: list[Outcome] | list[Publish]) -> str:
    """ "" when one of ``tried`` succeeded; else a line naming ``what`` and the last error."""
    if any(t.ok for t in tried):
        return ""
    if not tried:
        return f"{what}: none issued since the fault"
    return f"{what}: none of {len(tried)} since the fault succeeded; the last: {tried[-1].error}"
