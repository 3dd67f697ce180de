"""``engram.memory.feedback`` (SPEC 5.6): how a recalled memory worked out.

For one entry, ``success=false`` multiplies its reliability by its type's ``decay_on_failure``
and deletes it when that falls below ``prune_below`` (announced on ``memory.purged``);
``success=true`` leaves it unchanged. For a session, the rating labels that session's recall
records, replacing the label its end gave them.
"""

from __future__ import annotations

from sqlalchemy import update

from contracts.errors import InvalidRequest, NotFound
from contracts.recall import FeedbackReply, FeedbackRequest
from shared.security.access import Caller
from shared.security.tenancy import visible_owner_keys
from shared.storage import audit
from shared.storage.config_store import load_config
from shared.storage.db.engine import Database
from shared.storage.db.models import RECALLS
from shared.storage.entries import EntryStore
from shared.storage.erasure import decay_or_erase

__all__ = ["give_feedback"]


async def give_feedback(db: Database, caller: Caller, request: FeedbackRequest) -> FeedbackReply:
    """``caller`` is authorized (``shared.security.access``): a session-restricted token rates, and gives
    feedback within, its own session only."""
    credential = caller.credential
    if request.entry_id is None and request.session_id is None:
        raise InvalidRequest("give an entry_id (entry feedback) or a session_id (session rating)")
    updated = deleted = labelled = 0
    async with db.transaction() as session:
        config, _ = await load_config(session, credential.org_id, request.agent_config_id)
        entries: list[audit.AuditEntry] = []
        if request.entry_id is not None:
            owner_keys = visible_owner_keys(caller.principal, config.scope, request.session_id)
            row = await EntryStore(session).visible(
                credential.org_id, request.agent_config_id, owner_keys, request.entry_id
            )
            if row is None:
                raise NotFound("no such entry for this caller")
            if not request.success:
                _, erased = await decay_or_erase(
                    session,
                    org_id=credential.org_id,
                    agent_config_id=request.agent_config_id,
                    entry=row,
                    policy=config.type_policy(row.memory_type),
                    requested_by=caller.ref,
                )
                if erased is not None:
                    entries.extend(erased.audit)
                    deleted = 1
                else:
                    updated = 1
            entries.append(
                audit.AuditEntry(
                    kind="memory.feedback",
                    actor_ref=caller.ref,
                    agent_config_id=request.agent_config_id,
                    session_id=request.session_id,
                    entry_ids=[request.entry_id],
                    details={"success": request.success, "deleted": bool(deleted)},
                )
            )
        elif request.session_id is not None:
            mine = (
                # The platform (a service token) and operators rate any session; an end user or
                # an actor relabels only the recalls it made itself, never another's session.
                []
                if credential.principal.kind == "service" or credential.is_operator
                else [RECALLS.c.caller_ref == caller.ref]
            )
            result = await session.execute(
                update(RECALLS)
                .where(
                    RECALLS.c.org_id == credential.org_id,
                    RECALLS.c.agent_config_id == request.agent_config_id,
                    RECALLS.c.session_id == request.session_id,
                    *mine,
                )
                .values(label="success" if request.success else "failed", label_source="rating")
            )
            labelled = int(result.rowcount or 0)  # type: ignore[attr-defined]
            entries.append(
                audit.AuditEntry(
                    kind="session.rated",
                    actor_ref=caller.ref,
                    agent_config_id=request.agent_config_id,
                    session_id=request.session_id,
                    details={"success": request.success, "labelled": labelled},
                )
            )
        await audit.append(session, credential.org_id, entries)
    return FeedbackReply(updated=updated, deleted=deleted, labelled=labelled)
