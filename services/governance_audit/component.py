"""governance-audit's part of a process: its router and the retention sweeper."""

from __future__ import annotations

from services.governance_audit.erasure_api import Erasures
from services.governance_audit.retention import RetentionSweeper
from services.governance_audit.router import build_router
from shared.component import Component, Ports
from shared.infra import Infra
from shared.purge_ledger import PurgeLedger

__all__ = ["build"]


def build(infra: Infra, ports: Ports) -> Component:
    # Erases vectors itself when the vector store is reachable from this process (the runtime
    # opened one for it); else embed does, on memory.purged.
    ledger = PurgeLedger(infra.settings.purge_ledger_path())
    ledger.create()
    erasures = Erasures(infra.db, index=ports.vector_index, results=ports.results, ledger=ledger)
    sweeper = RetentionSweeper(infra.db, erasures.after_commit, interval_s=infra.settings.retention_sweep_s)
    return Component(
        "governance-audit",
        routers=[build_router(infra, erasures, ports.results)],
        workers=[sweeper],
    )
