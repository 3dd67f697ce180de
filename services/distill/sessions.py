"""``engram.session.validated``, a batch at a time: gate → trace summary → distiller → the save path.

Per batch: one transaction reads which sessions are already done and the agent configs; the
distiller runs outside any transaction; then one transaction claims the inbox rows and saves every
session's lessons (entries, outbox, audit) — and only then does the batch ack them. A distiller
that keeps failing never fails the session: that message alone is retried with backoff and, after
``max_deliver`` attempts, dead-lettered with its reason, while the rest of the batch goes on.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from uuid import UUID

from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.trace import Span

from contracts.config import MemoryConfig
from contracts.errors import EngramError, Forbidden
from contracts.events import SessionEnded
from contracts.operations import DISTILL_SESSIONS
from services.distill.gate import distill_gate
from services.distill.observations import observation_drafts
from services.distill.save_path import Draft, SaveContext, SaveItem, save_batch
from services.distill.summary import summarize_trace
from shared.observability.telemetry import (
    annotate_consumer,
    annotate_memory_operation,
    extract_context,
    inject_trace_headers,
    tracer,
)
from shared.ports import Distiller, Lesson, SupersessionJudge
from shared.service.consumer import Batch
from shared.service.infra import Infra
from shared.storage import audit
from shared.storage.config_store import claim_agent_config, org_memory_enabled
from shared.storage.deadletter import Rejection
from shared.storage.outbox import claim_inbox_many, first_of_each, processed_of

__all__ = ["CONSUMER", "handle_validated_sessions"]

#: Its inbox rows are named after its durable consumer.
CONSUMER = DISTILL_SESSIONS.durable
MAX_LESSONS = 5
_tracer = tracer(__name__)
#: Skips for which not even raw activity may be kept.
_WRITE_OFF = {"memory_disabled", "org_memory_disabled", "write_disabled"}


@dataclass
class _Work:
    msg: Msg
    session: SessionEnded
    span: Span

    @property
    def key(self) -> str:
        # Scoped by organization, so one tenant cannot pre-empt another's event id.
        return f"{self.session.org_id}/{self.session.event_id}"


async def handle_validated_sessions(
    infra: Infra, distiller: Distiller, batch: Batch, judge: SupersessionJudge | None = None
) -> None:
    work: list[_Work] = []
    # Only ingest publishes here: an unreadable session is a bug or a version skew.
    for msg, session in await batch.parse(SessionEnded, what="session"):
        # One span per session, parented on the trace the platform started (via ingest).
        span = _tracer.start_span("engram.distill.session", context=extract_context(msg.headers))
        annotate_consumer(span, msg.subject, CONSUMER)
        annotate_memory_operation(span, msg.subject, session)
        work.append(_Work(msg, session, span))
    try:
        # Later copies of one event are left out, and acked with the batch after it commits.
        await _process(infra, distiller, batch, first_of_each(work, lambda w: w.key), judge)
    finally:
        for item in work:
            item.span.end()


async def _process(
    infra: Infra, distiller: Distiller, batch: Batch, work: list[_Work], judge: SupersessionJudge | None
) -> None:
    configs: dict[tuple[UUID, UUID], MemoryConfig] = {}
    forbidden: dict[tuple[UUID, UUID], Forbidden] = {}
    async with infra.db.transaction() as db:
        done = await processed_of(db, CONSUMER, [w.key for w in work])
        todo = [w for w in work if w.key not in done]
        for pair in {(w.session.org_id, w.session.agent_config_id) for w in todo}:
            try:
                configs[pair], _ = await claim_agent_config(db, pair[0], pair[1], by="distill")
            except Forbidden as exc:  # the agent config belongs to another organization
                forbidden[pair] = exc
        enabled = {org: await org_memory_enabled(db, org) for org in {w.session.org_id for w in todo}}
    # Already done (by another instance, or before a crash): nothing to hold them for.
    await batch.ack(w.msg for w in work if w.key in done)

    ready: list[_Work] = []
    refused: list[tuple[Msg, Rejection]] = []
    for item in todo:
        pair = (item.session.org_id, item.session.agent_config_id)
        if pair in forbidden:
            refused.append((item.msg, _rejection(forbidden[pair], item.session)))
        else:
            ready.append(item)
    await batch.dead_letter(refused)

    outcomes = await asyncio.gather(
        *(
            _distill(
                distiller,
                w,
                configs[(w.session.org_id, w.session.agent_config_id)],
                enabled[w.session.org_id],
            )
            for w in ready
        ),
        return_exceptions=True,
    )
    items: list[tuple[_Work, SaveItem]] = []
    for item, outcome in zip(ready, outcomes, strict=True):
        if isinstance(outcome, EngramError):
            # A distiller failure (the model down, slow, unreadable) fails this session alone.
            reason = f"distill failed: {outcome.message}"
            await batch.retry_or_dead_letter(item.msg, _rejection(outcome, item.session, reason))
        elif isinstance(outcome, BaseException):
            raise outcome  # unexpected: settled by shared.service.consumer (each session tried alone)
        else:
            items.append((item, outcome))
    if not items:
        return

    async with infra.db.transaction() as db:
        claimed = await claim_inbox_many(db, CONSUMER, [w.key for w, _ in items])
        # Another instance may have finished some of these meanwhile: only what we claimed is saved.
        await save_batch(db, [save for w, save in items if w.key in claimed], judge=judge)


async def _distill(distiller: Distiller, work: _Work, config: MemoryConfig, org_enabled: bool) -> SaveItem:
    """The gate, and the distiller if it lets the session through: what to save and audit."""
    session = work.session
    skip = distill_gate(session, config, org_enabled)
    lessons: list[Lesson] = []
    details: dict[str, object] = {"event_id": str(session.event_id)}
    if skip is None:
        summary = summarize_trace(session)
        lessons = (await distiller.distill(session, summary))[:MAX_LESSONS]
        details.update(
            distiller=distiller.name,
            lessons=len(lessons),
            kept_calls=list(summary.kept_indexes),
            total_calls=summary.total_calls,
        )
    else:
        details["reason"] = skip
    drafts = [
        Draft(
            text=x.text, importance=x.importance, memory_type=x.memory_type, occurred_at=session.occurred_at
        )
        for x in lessons
    ]
    if config.keep_observations and skip not in _WRITE_OFF:
        drafts += observation_drafts(session)
    work.span.set_attribute("engram.lessons", len(lessons))
    ctx = SaveContext(
        org_id=session.org_id,
        agent_config_id=session.agent_config_id,
        owner=session.principal,
        session_id=session.session_id,
        source="distill",
        requested_by=session.principal.ref,
        source_agent=distiller.name,
        provenance={"event_id": str(session.event_id), "session_id": session.session_id},
        trace_headers=_headers_of(work.span),
        # The session's own end, bounded by when Engram stored it: a platform clock running
        # ahead cannot carry an erased session past the erasure.
        observed_at=min(session.occurred_at, work.msg.metadata.timestamp)
        if session.occurred_at is not None
        else work.msg.metadata.timestamp,
    )
    outcome = audit.AuditEntry(
        kind="distill.skipped" if skip else "distill.completed",
        actor_ref=session.principal.ref,
        agent_config_id=session.agent_config_id,
        session_id=session.session_id,
        details=details,
    )
    return SaveItem(ctx, drafts, config, also_audit=[outcome])


def _headers_of(span: Span) -> dict[str, str]:
    with trace.use_span(span, end_on_exit=False):
        return inject_trace_headers({})


def _rejection(exc: EngramError, session: SessionEnded, reason: str | None = None) -> Rejection:
    return Rejection.of(
        exc,
        org_id=session.org_id,
        original_event_id=str(session.event_id),
        actor_ref=session.principal.ref,
        reason=reason,
    )
