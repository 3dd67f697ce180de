"""``engram.save.accepted``: elective saves that ingest verified and durably accepted, a batch at
a time.

Per batch: one transaction reads which saves are already done, claims the agent configs, claims
the inbox rows and runs every save through the save path (entries, outbox, audit) — one
transaction, one audit append and one outbox insert for the batch instead of one of each per save
(docs/adr/0101-write-path-throughput.md). After the commit each waiting caller gets its own
outcome and the batch acks them. A save that cannot be saved (its agent config belongs to another
organization) is dead-lettered and its caller told why; a batch that fails otherwise is tried
again one save at a time (``shared.service.consumer``), where a save's own error is that save's answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from uuid import UUID

from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.trace import Span

from contracts.config import MemoryConfig
from contracts.errors import EngramError
from contracts.internal import AcceptedSave
from contracts.operations import DISTILL_SAVES
from contracts.requests import SaveOutcome
from contracts.subjects import save_result_subject
from services.distill.save_path import Draft, SaveContext, SaveItem, SaveResult, save_batch
from shared.observability.telemetry import annotate_consumer, extract_context, inject_trace_headers, tracer
from shared.ports import SupersessionJudge
from shared.service.consumer import Batch, is_outage
from shared.service.infra import Infra
from shared.storage import audit
from shared.storage.config_store import claim_agent_config, org_memory_enabled
from shared.storage.deadletter import Rejection
from shared.storage.outbox import claim_inbox_many, first_of_each, processed_of

__all__ = ["CONSUMER", "handle_accepted_saves"]

#: Its inbox rows are named after its durable consumer.
CONSUMER = DISTILL_SAVES.durable
_tracer = tracer(__name__)


@dataclass
class _Save:
    msg: Msg
    request: AcceptedSave
    span: Span

    @property
    def key(self) -> str:
        # Scoped by organization, so one tenant cannot pre-empt another's request id.
        return f"{self.request.org_id}/save/{self.request.request_id}"

    @property
    def pair(self) -> tuple[UUID, UUID]:
        return self.request.org_id, self.request.agent_config_id


async def handle_accepted_saves(infra: Infra, batch: Batch, judge: SupersessionJudge | None = None) -> None:
    """The batch's saves through the save path in one transaction, each outcome sent to a
    caller who waits; the batch acks them after."""
    work: list[_Save] = []
    for msg, request in await batch.parse(AcceptedSave, what="accepted save"):
        # One span per save, parented on the trace of the request (via ingest).
        span = _tracer.start_span("engram.distill.save", context=extract_context(msg.headers))
        annotate_consumer(span, msg.subject, CONSUMER)
        work.append(_Save(msg, request, span))
    try:
        # Later copies of one request are left out, and acked with the batch after it commits.
        unique = first_of_each(work, lambda w: w.key)
        try:
            replies = await _process(infra, batch, unique, judge)
        except EngramError as exc:
            # Alone (or tried alone after its batch failed): a save's own error is its answer.
            if is_outage(exc) or len(unique) != 1:
                raise
            replies = [(unique[0], await _refuse(batch, unique[0], exc))]
        for save, reply in replies:
            await _answer(infra, save.request, reply)
    finally:
        for item in work:
            item.span.end()


async def _process(
    infra: Infra, batch: Batch, work: list[_Save], judge: SupersessionJudge | None = None
) -> list[tuple[_Save, dict[str, object]]]:
    """Save what is not done yet, in one transaction; the replies owed once it has committed."""
    replies: list[tuple[_Save, dict[str, object]]] = []
    refused: list[tuple[_Save, EngramError]] = []
    async with infra.db.transaction() as db:
        done = await processed_of(db, CONSUMER, [w.key for w in work])
        todo = [w for w in work if w.key not in done]
        configs: dict[tuple[UUID, UUID], tuple[MemoryConfig, bool]] = {}
        for pair in dict.fromkeys(w.pair for w in todo):
            by = next(w.request.requested_by for w in todo if w.pair == pair)
            try:
                configs[pair] = await claim_agent_config(db, pair[0], pair[1], by=by)
            except EngramError as exc:  # e.g. the agent config moved to another org since ingest checked
                if is_outage(exc):
                    raise
                refused.extend((w, exc) for w in todo if w.pair == pair)
        enabled = {org: await org_memory_enabled(db, org) for org in {w.request.org_id for w in todo}}
        ready = [w for w in todo if w.pair in configs]
        # Another instance may have taken some of these meanwhile: only what we claimed is saved.
        claimed = await claim_inbox_many(db, CONSUMER, [w.key for w in ready])
        ready = [w for w in ready if w.key in claimed]
        created = {pair for pair, (_, new) in configs.items() if new}
        items: list[tuple[_Save, SaveItem, list[str]]] = []
        for w in ready:
            config, _ = configs[w.pair]
            warnings = ["agent_config_created"] if w.pair in created else []
            created.discard(w.pair)  # told to the first save of the pair, as one at a time did
            writable = config.memory_enabled and config.memory_write_enabled and enabled[w.request.org_id]
            items.append((w, _item(w, config, writable), warnings))
        results = await save_batch(db, [item for _, item, _ in items], judge=judge)
    for (w, item, warnings), result in zip(items, results, strict=True):
        replies.append((w, _outcome(w.request, item, result, warnings).model_dump(mode="json")))
    for w, error in refused:
        replies.append((w, await _refuse(batch, w, error)))
    return replies


def _item(save: _Save, config: MemoryConfig, writable: bool) -> SaveItem:
    request, msg = save.request, save.msg
    ctx = SaveContext(
        org_id=request.org_id,
        agent_config_id=request.agent_config_id,
        owner=request.owner,
        session_id=request.session_id,
        source="elective",
        requested_by=request.requested_by,
        provenance={"request_id": str(request.request_id)},
        trace_headers=_headers_of(save.span),
        # When JetStream stored the accepted save: an erasure after that covers it.
        observed_at=msg.metadata.timestamp,
    )
    if not writable:
        skipped = audit.AuditEntry(
            kind="save.skipped",
            actor_ref=request.requested_by,
            agent_config_id=request.agent_config_id,
            session_id=request.session_id,
            details={"reason": "write_disabled", "count": len(request.entries)},
        )
        return SaveItem(ctx, [], config, also_audit=[skipped])
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
    return SaveItem(ctx, drafts, config)


def _outcome(request: AcceptedSave, item: SaveItem, result: SaveResult, warnings: list[str]) -> SaveOutcome:
    if not item.drafts:  # writing is off: nothing saved, every entry skipped
        return SaveOutcome(
            request_id=request.request_id,
            saved=0,
            skipped=len(request.entries),
            reinforced=0,
            ids=[],
            warnings=warnings,
        )
    return SaveOutcome(
        request_id=request.request_id,
        saved=result.saved,
        skipped=result.skipped,
        reinforced=result.reinforced,
        ids=result.ids,
        quarantined=len(set(result.quarantined)),
        redacted=result.redacted,
        warnings=warnings,
    )


async def _refuse(batch: Batch, save: _Save, exc: EngramError) -> dict[str, object]:
    """Dead-letter a save that cannot be saved; its caller is told why."""
    request = save.request
    rejection = Rejection.of(
        exc,
        org_id=request.org_id,
        original_event_id=str(request.request_id),
        actor_ref=request.requested_by,
    )
    # Acked with the batch, after the reply: a reply that could not be sent is sent again.
    await batch.dead_letter([(save.msg, rejection)], ack=False)
    return exc.to_wire()


async def _answer(infra: Infra, request: AcceptedSave, reply: dict[str, object]) -> None:
    if request.wait:
        # Core NATS: the waiting caller is live or gone; the stored outcome is the durable part.
        subject, body = save_result_subject(str(request.request_id)), json.dumps(reply).encode()
        await infra.nc.publish(subject, body, headers=infra.signer.sign(subject, body))


def _headers_of(span: Span) -> dict[str, str]:
    with trace.use_span(span, end_on_exit=False):
        return inject_trace_headers({})
