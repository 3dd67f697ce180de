"""governance-audit's part of a process: its router, the retention sweeper and the webhook
delivery worker."""

from __future__ import annotations

from services.governance_audit.erasure_api import Erasures
from services.governance_audit.retention import RetentionSweeper
from services.governance_audit.router import build_router
from services.governance_audit.webhooks.api import Webhooks
from services.governance_audit.webhooks.delivery import WebhookDelivery
from shared.service.component import Component, Ports
from shared.service.infra import Infra
from shared.storage.purge_ledger import PurgeLedger

__all__ = ["build"]


def build(infra: Infra, ports: Ports) -> Component:
    # Erases vectors itself when the vector store is reachable from this process (the runtime
    # opened one for it); else embed does, on memory.purged.
    ledger = PurgeLedger(infra.settings.purge_ledger_path())
    ledger.create()
    erasures = Erasures(infra.db, index=ports.vector_index, results=ports.results, ledger=ledger)
    sweeper = RetentionSweeper(infra.db, erasures.after_commit, interval_s=infra.settings.retention_sweep_s)
    settings = infra.settings
    delivery = WebhookDelivery(
        infra.db,
        attempts=settings.webhook_attempts,
        backoff_s=settings.webhook_backoff_s,
        timeout_s=settings.webhook_timeout_s,
        allow_private=settings.webhook_allow_private_networks,
    )
    webhooks = Webhooks(infra.db, allow_private=settings.webhook_allow_private_networks, wake=delivery.wake)
    return Component(
        "governance-audit",
        routers=[build_router(infra, erasures, webhooks, ports.results)],
        workers=[sweeper, delivery],
    )
