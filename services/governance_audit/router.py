"""governance-audit's request-reply handlers (queue group, so instances share load): one route per
operation of the table, served by the edge (``shared.service.edge``)."""

from __future__ import annotations

from faststream.nats import NatsRouter

from contracts import operations as ops
from contracts.governance import ManageReply, ManageRequest
from contracts.requests import ConfigPut, ConfigReply
from services.governance_audit.admin_api import Admin
from services.governance_audit.audit_api import query_audit, verify_audit
from services.governance_audit.config_api import get_config, set_config
from services.governance_audit.erasure_api import Erasures
from services.governance_audit.export import export_page
from services.governance_audit.inspect import get_entry, list_entries
from services.governance_audit.manage import manage_entry
from services.governance_audit.ops_api import dead_letters, lag
from services.governance_audit.webhooks.api import Webhooks
from services.governance_audit.webhooks.fanout import subscribe_fanout
from shared.security.access import Caller
from shared.security.page_tokens import PageTokens
from shared.service.edge import route
from shared.service.infra import Infra
from shared.storage.cache import ResultCache

__all__ = ["build_router"]

QUEUE = "governance-audit"


def build_router(
    infra: Infra, erasures: Erasures, webhooks: Webhooks, results: ResultCache | None = None
) -> NatsRouter:
    router = NatsRouter()
    subscribe_fanout(router, infra, webhooks.wake)
    pages = PageTokens(infra.settings.signing_keys(), ttl_s=infra.settings.page_token_ttl_s)
    db = infra.db

    async def manage(caller: Caller, request: ManageRequest) -> ManageReply:
        async with db.transaction() as session:
            reply = await manage_entry(session, caller, request)
        if results is not None:
            await results.invalidate(caller.org_id, [request.agent_config_id])
        return reply

    async def put_config(caller: Caller, request: ConfigPut) -> ConfigReply:
        reply = await set_config(infra, caller, request)
        if results is not None:
            await results.invalidate(caller.org_id, [request.agent_config_id])
        return reply

    admin = Admin(infra)
    infra.edge.serve_group(
        QUEUE,
        [
            # Administration of tenants (tenant.admin, checked by authorize).
            route(ops.ADMIN_ORG_CREATE, admin.create_org),
            route(ops.ADMIN_ORG_LIST, admin.list_orgs),
            route(ops.ADMIN_ORG_DISABLE, admin.disable_org),
            route(ops.ADMIN_AGENT_CONFIG_CREATE, admin.create_agent_config),
            route(ops.ADMIN_AGENT_CONFIG_LIST, admin.list_agent_configs),
            route(ops.ADMIN_CLIENT_MINT, admin.mint_client),
            route(ops.ADMIN_CLIENT_ROTATE, admin.rotate_client),
            route(ops.ADMIN_CLIENT_REVOKE, admin.revoke_client),
            route(ops.ADMIN_CLIENT_LIST, admin.list_clients),
            route(ops.ADMIN_TOKEN_MINT, admin.mint_token),
            route(ops.ADMIN_TOKEN_REVOKE, admin.revoke_token),
            route(ops.CONFIG_GET, lambda c, r: get_config(infra, c, r)),
            route(ops.CONFIG_PUT, put_config),
            route(ops.AUDIT_QUERY, lambda c, r: query_audit(infra, c, r)),
            route(ops.AUDIT_VERIFY, lambda c, r: verify_audit(infra, c, r)),
            route(ops.OPS_DEAD_LETTERS, lambda c, r: dead_letters(infra, c, r)),
            route(ops.OPS_LAG, lambda c, r: lag(infra, c, r)),
            # Each checks the agent config's organization before its handler (authorize).
            route(ops.MEMORY_LIST, lambda c, r: list_entries(db, pages, c, r)),
            route(ops.MEMORY_GET, lambda c, r: get_entry(db, c, r)),
            route(ops.MEMORY_EXPORT, lambda c, r: export_page(db, pages, c, r)),
            route(ops.MEMORY_MANAGE, manage),
            route(ops.MEMORY_DELETE, erasures.delete),
            route(ops.MEMORY_PURGE, erasures.purge),
            route(ops.MEMORY_PRUNE, erasures.prune),
            route(ops.WEBHOOKS_REGISTER, webhooks.register),
            route(ops.WEBHOOKS_LIST, webhooks.list),
            route(ops.WEBHOOKS_DELETE, webhooks.delete),
            route(ops.WEBHOOKS_REPLAY, webhooks.replay),
        ],
    )
    return router
