"""``engram.save.accepted``: elective saves that ingest verified and durably accepted."""

from __future__ import annotations

import json

from nats.aio.msg import Msg

from contracts.errors import EngramError
from contracts.internal import AcceptedSave
from contracts.operations import DISTILL_SAVES
from contracts.requests import SaveOutcome
from contracts.subjects import save_result_subject
from services.distill.save_path import Draft, SaveContext, save_entries
from shared import audit
from shared.config_store import claim_agent_config, org_memory_enabled
from shared.consumer import Batch
from shared.deadletter import Rejection
from shared.infra import Infra
from shared.outbox import claim_inbox
from shared.ports import SupersessionJudge

__all__ = ["CONSUMER", "handle_accepted_saves"]

#: Its inbox rows are named after its durable consumer.
CONSUMER = DISTILL_SAVES.durable


async def handle_accepted_saves(infra: Infra, batch: Batch, judge: SupersessionJudge | None = None) -> None:
    """Each accepted save through the save path, its outcome sent to a caller who waits; the
    batch acks them after."""
    for msg, request in await batch.parse(AcceptedSave, what="accepted save"):
        await _save(infra, batch, msg, request, judge)


async def _save(
    infra: Infra, batch: Batch, msg: Msg, request: AcceptedSave, judge: SupersessionJudge | None
) -> None:
    ctx = SaveContext(
        org_id=request.org_id,
        agent_config_id=request.agent_config_id,
        owner=request.owner,
        session_id=request.session_id,
        source="elective",
        requested_by=request.requested_by,
        provenance={"request_id": str(request.request_id)},
        # When JetStream stored the accepted save: an erasure after that covers it.
        observed_at=msg.metadata.timestamp,
    )
    drafts = [
        Draft(
            text=e.text,
            importance=e.importance,
            memory_type=e.memory_type,
            layer=e.layer,
            metadata=dict(e.metadata),
            occurred_at=e.occurred_at,
        )
        for e in request.entries
    ]
    reply: dict[str, object]
    try:
        async with infra.db.transaction() as db:
            if not await claim_inbox(db, CONSUMER, f"{request.org_id}/save/{request.request_id}"):
                return  # saved before (a redelivery): only the ack is left
            config, created = await claim_agent_config(
                db, request.org_id, request.agent_config_id, by=request.requested_by
            )
            enabled = config.memory_enabled and config.memory_write_enabled
            enabled = enabled and await org_memory_enabled(db, request.org_id)
            if enabled:
                result = await save_entries(db, ctx, drafts, config, judge=judge)
                outcome = SaveOutcome(
                    request_id=request.request_id,
                    saved=result.saved,
                    skipped=result.skipped,
                    reinforced=result.reinforced,
                    ids=result.ids,
                    quarantined=len(set(result.quarantined)),
                    redacted=result.redacted,
                    warnings=["agent_config_created"] if created else [],
                )
            else:
                await audit.append(
                    db,
                    request.org_id,
                    [
                        audit.AuditEntry(
                            kind="save.skipped",
                            actor_ref=request.requested_by,
                            agent_config_id=request.agent_config_id,
                            session_id=request.session_id,
                            details={"reason": "write_disabled", "count": len(drafts)},
                        )
                    ],
                )
                outcome = SaveOutcome(
                    request_id=request.request_id,
                    saved=0,
                    skipped=len(drafts),
                    reinforced=0,
                    ids=[],
                    warnings=["agent_config_created"] if created else [],
                )
        reply = outcome.model_dump(mode="json")
    except EngramError as exc:  # e.g. the agent config moved to another org since ingest checked
        rejection = Rejection.of(
            exc,
            org_id=request.org_id,
            original_event_id=str(request.request_id),
            actor_ref=request.requested_by,
        )
        # Acked with the batch, after the reply: a reply that could not be sent is sent again.
        await batch.dead_letter([(msg, rejection)], ack=False)
        reply = exc.to_wire()
    if request.wait:
        # Core NATS: the waiting caller is live or gone; the stored outcome is the durable part.
        subject, body = save_result_subject(str(request.request_id)), json.dumps(reply).encode()
        await infra.nc.publish(subject, body, headers=infra.signer.sign(subject, body))
