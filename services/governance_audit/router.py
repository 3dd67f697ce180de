"""governance-audit's request-reply handlers (queue group, so instances share load)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from faststream.nats import NatsRouter
from faststream.nats.annotations import NatsMessage
from pydantic import BaseModel

from contracts.governance import (
    DeleteRequest,
    ExportRequest,
    GetRequest,
    ListRequest,
    ManageReply,
    ManageRequest,
    PruneRequest,
    PurgeRequest,
)
from contracts.requests import AuditQuery, AuditVerify, ConfigGet, ConfigPut
from contracts.subjects import (
    AUDIT_QUERY,
    AUDIT_VERIFY,
    CONFIG_GET,
    CONFIG_PUT,
    MEMORY_DELETE,
    MEMORY_EXPORT,
    MEMORY_GET,
    MEMORY_LIST,
    MEMORY_MANAGE,
    MEMORY_PRUNE,
    MEMORY_PURGE,
)
from services.governance_audit.access import Caller, resolve_caller
from services.governance_audit.audit_api import query_audit, verify_audit
from services.governance_audit.config_api import get_config, set_config
from services.governance_audit.erasure_api import Erasures
from services.governance_audit.export import export_page
from services.governance_audit.inspect import get_entry, list_entries
from services.governance_audit.manage import manage_entry
from shared.auth import Credential
from shared.cache import ResultCache
from shared.handlers import answer
from shared.infra import Infra
from shared.page_tokens import PageTokens

__all__ = ["build_router"]

QUEUE = "governance-audit"
M = TypeVar("M", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)


def _as_caller(
    handler: Callable[[Caller, M], Awaitable[R]],
) -> Callable[[Credential, M], Awaitable[R]]:
    """Resolve whom the request acts for (``principal``, service tokens only) before the handler."""

    async def run(credential: Credential, request: M) -> R:
        return await handler(resolve_caller(credential, getattr(request, "principal", None)), request)

    return run


def build_router(infra: Infra, erasures: Erasures, results: ResultCache | None = None) -> NatsRouter:
    router = NatsRouter()
    pages = PageTokens(infra.settings.signing_keys(), ttl_s=infra.settings.page_token_ttl_s)

    def serve(subject: str, model: type[M], handler: Callable[[Credential, M], Awaitable[Any]]) -> None:
        @router.subscriber(subject, queue=QUEUE, title=f"governance:{subject.removeprefix('engram.')}")
        async def on_request(msg: NatsMessage) -> dict[str, Any]:
            return await answer(infra.tokens, msg.headers, msg.body, model, handler)

    async def manage(caller: Caller, request: ManageRequest) -> ManageReply:
        async with infra.db.transaction() as session:
            reply = await manage_entry(session, caller, request)
        infra.relay.wake()
        if results is not None:
            await results.invalidate(caller.org_id, [request.agent_config_id])
        return reply

    async def put_config(credential: Credential, request: ConfigPut) -> Any:
        reply = await set_config(infra, credential, request)
        if results is not None:
            await results.invalidate(credential.org_id, [request.agent_config_id])
        return reply

    serve(CONFIG_GET, ConfigGet, lambda c, r: get_config(infra, c, r))
    serve(CONFIG_PUT, ConfigPut, put_config)
    serve(AUDIT_QUERY, AuditQuery, lambda c, r: query_audit(infra, c, r))
    serve(AUDIT_VERIFY, AuditVerify, lambda c, r: verify_audit(infra, c, r))
    serve(MEMORY_LIST, ListRequest, _as_caller(lambda c, r: list_entries(infra.db, pages, c, r)))
    serve(MEMORY_GET, GetRequest, _as_caller(lambda c, r: get_entry(infra.db, c, r)))
    serve(MEMORY_EXPORT, ExportRequest, _as_caller(lambda c, r: export_page(infra.db, pages, c, r)))
    serve(MEMORY_MANAGE, ManageRequest, _as_caller(manage))
    serve(MEMORY_DELETE, DeleteRequest, _as_caller(erasures.delete))
    serve(MEMORY_PURGE, PurgeRequest, _as_caller(erasures.purge))
    serve(MEMORY_PRUNE, PruneRequest, _as_caller(erasures.prune))
    return router
