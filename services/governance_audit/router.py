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
from contracts.ops import DeadLetterQuery, LagQuery
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
    OPS_DEAD_LETTERS,
    OPS_LAG,
)
from services.governance_audit.access import Caller, resolve_caller
from services.governance_audit.audit_api import query_audit, verify_audit
from services.governance_audit.config_api import get_config, set_config
from services.governance_audit.erasure_api import Erasures
from services.governance_audit.export import export_page
from services.governance_audit.inspect import get_entry, list_entries
from services.governance_audit.manage import manage_entry
from services.governance_audit.ops_api import dead_letters, lag
from shared.auth import Credential
from shared.cache import ResultCache
from shared.config_store import load_config
from shared.db.engine import Database
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


def _own_agent_config(
    db: Database, handler: Callable[[Caller, M], Awaitable[R]]
) -> Callable[[Caller, M], Awaitable[R]]:
    """An agent config of another organization is refused as such (``FORBIDDEN``), before the
    handler — the same answer recall, save and config give, instead of an empty page."""

    async def run(caller: Caller, request: M) -> R:
        agent_config_id = getattr(request, "agent_config_id", None)
        if agent_config_id is not None:
            async with db.read() as session:
                await load_config(session, caller.org_id, agent_config_id)
        return await handler(caller, request)

    return run


def build_router(infra: Infra, erasures: Erasures, results: ResultCache | None = None) -> NatsRouter:
    router = NatsRouter()
    pages = PageTokens(infra.settings.signing_keys(), ttl_s=infra.settings.page_token_ttl_s)

    def serve(subject: str, model: type[M], handler: Callable[[Credential, M], Awaitable[Any]]) -> None:
        @router.subscriber(subject, queue=QUEUE, title=f"governance:{subject.removeprefix('engram.')}")
        async def on_request(msg: NatsMessage) -> dict[str, Any]:
            return await answer(
                infra.tokens, msg.headers, msg.body, model, handler, operation=subject, group=QUEUE
            )

    async def manage(caller: Caller, request: ManageRequest) -> ManageReply:
        async with infra.db.transaction() as session:
            reply = await manage_entry(session, caller, request)
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
    serve(OPS_DEAD_LETTERS, DeadLetterQuery, lambda c, r: dead_letters(infra, c, r))
    serve(OPS_LAG, LagQuery, lambda c, r: lag(infra, c, r))

    def serve_memory(subject: str, model: type[M], handler: Callable[[Caller, M], Awaitable[Any]]) -> None:
        """A management request: whom it acts for, then the agent config's organization, then it."""
        serve(subject, model, _as_caller(_own_agent_config(infra.db, handler)))

    serve_memory(MEMORY_LIST, ListRequest, lambda c, r: list_entries(infra.db, pages, c, r))
    serve_memory(MEMORY_GET, GetRequest, lambda c, r: get_entry(infra.db, c, r))
    serve_memory(MEMORY_EXPORT, ExportRequest, lambda c, r: export_page(infra.db, pages, c, r))
    serve_memory(MEMORY_MANAGE, ManageRequest, manage)
    serve_memory(MEMORY_DELETE, DeleteRequest, erasures.delete)
    serve_memory(MEMORY_PURGE, PurgeRequest, erasures.purge)
    serve_memory(MEMORY_PRUNE, PruneRequest, erasures.prune)
    return router
