"""governance-audit's request-reply handlers (queue group, so instances share load)."""

from __future__ import annotations

from typing import Any

from faststream.nats import NatsRouter
from faststream.nats.annotations import NatsMessage

from contracts.requests import AuditQuery, AuditVerify, ConfigGet, ConfigPut
from contracts.subjects import AUDIT_QUERY, AUDIT_VERIFY, CONFIG_GET, CONFIG_PUT
from services.governance_audit.audit_api import query_audit, verify_audit
from services.governance_audit.config_api import get_config, set_config
from shared.handlers import answer
from shared.infra import Infra

__all__ = ["build_router"]

QUEUE = "governance-audit"


def build_router(infra: Infra) -> NatsRouter:
    router = NatsRouter()

    @router.subscriber(CONFIG_GET, queue=QUEUE, title="governance:config.get")
    async def on_config_get(msg: NatsMessage) -> dict[str, Any]:
        return await answer(
            infra.tokens, msg.headers, msg.body, ConfigGet, lambda c, r: get_config(infra, c, r)
        )

    @router.subscriber(CONFIG_PUT, queue=QUEUE, title="governance:config.put")
    async def on_config_put(msg: NatsMessage) -> dict[str, Any]:
        return await answer(
            infra.tokens, msg.headers, msg.body, ConfigPut, lambda c, r: set_config(infra, c, r)
        )

    @router.subscriber(AUDIT_QUERY, queue=QUEUE, title="governance:audit.query")
    async def on_audit_query(msg: NatsMessage) -> dict[str, Any]:
        return await answer(
            infra.tokens, msg.headers, msg.body, AuditQuery, lambda c, r: query_audit(infra, c, r)
        )

    @router.subscriber(AUDIT_VERIFY, queue=QUEUE, title="governance:audit.verify")
    async def on_audit_verify(msg: NatsMessage) -> dict[str, Any]:
        return await answer(
            infra.tokens, msg.headers, msg.body, AuditVerify, lambda c, r: verify_audit(infra, c, r)
        )

    return router
