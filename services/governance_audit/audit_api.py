"""``engram.audit.query`` / ``engram.audit.verify``: read and check the caller's own chain.

Both need ``memory.admin`` on an operator token (not an end user's). A token restricted to one
agent config (or session) reads only that agent config's (session's) records, and cannot verify
the whole chain, whose counts would describe the rest of the organization.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlmodel import col

from contracts.requests import AuditQuery, AuditQueryReply, AuditVerify, AuditVerifyReply, BrokenLink
from shared.security.access import Caller
from shared.service.infra import Infra
from shared.storage import audit
from shared.storage.db.models import AuditRecord

__all__ = ["query_audit", "verify_audit"]


async def query_audit(infra: Infra, caller: Caller, request: AuditQuery) -> AuditQueryReply:
    # The edge bounded the request by the token: a restricted token's agent config is the request's.
    credential, agent_config_id = caller.credential, request.agent_config_id
    conditions = [col(AuditRecord.org_id) == credential.org_id, col(AuditRecord.seq) > request.after_seq]
    if request.kind is not None:
        conditions.append(col(AuditRecord.kind) == request.kind)
    if agent_config_id is not None:
        conditions.append(col(AuditRecord.agent_config_id) == agent_config_id)
    if credential.session_id is not None:
        conditions.append(col(AuditRecord.session_id) == credential.session_id)
    async with infra.db.read() as db:
        rows = (
            (
                await db.execute(
                    select(AuditRecord).where(*conditions).order_by(col(AuditRecord.seq)).limit(request.limit)
                )
            )
            .scalars()
            .all()
        )
    records = [audit.to_event(row).model_dump(mode="json") for row in rows]
    next_seq = rows[-1].seq if len(rows) == request.limit else None
    return AuditQueryReply(records=records, next_after_seq=next_seq)


async def verify_audit(infra: Infra, caller: Caller, request: AuditVerify) -> AuditVerifyReply:
    caller.require_unrestricted("verifying the organization's whole chain")
    async with infra.db.read() as db:
        report = await audit.verify(db, caller.org_id)
    broken = (
        BrokenLink(seq=report.broken_seq, record_id=report.broken_id, reason=report.reason or "")
        if report.broken_seq is not None
        else None
    )
    return AuditVerifyReply(ok=report.ok, checked=report.checked, first_broken=broken)
