"""``engram.session.validated``: gate → trace summary → distiller → the save path.

The model call happens outside any transaction; the effect (inbox row, entries, outbox, audit)
commits as one. A distiller that keeps failing never fails the session: the event is retried
with backoff and, after ``max_deliver`` attempts, dead-lettered with its reason.
"""

from __future__ import annotations

import json
import logging
from uuid import UUID

from nats.aio.msg import Msg
from pydantic import ValidationError

from contracts.errors import EngramError, Forbidden
from contracts.events import SessionEnded, ToolCall
from services.distill.gate import distill_gate
from services.distill.save_path import Draft, SaveContext, save_entries
from services.distill.summary import summarize_trace
from shared import audit
from shared.config_store import claim_agent_config, org_memory_enabled
from shared.deadletter import dead_letter
from shared.infra import Infra
from shared.outbox import already_processed, claim_inbox
from shared.ports import Distiller, Lesson

__all__ = ["CONSUMER", "handle_validated_session", "observation_drafts"]

CONSUMER = "distill"
log = logging.getLogger(__name__)

#: Observations are raw activity: cheap to keep, short-lived, and ranked below lessons.
OBSERVATION_IMPORTANCE = 0.3
_OBS_FIELD_CHARS = 300


def observation_drafts(session: SessionEnded) -> list[Draft]:
    """One ``layer="observation"`` entry per tool call of the trace."""
    return [_observation(i, call) for i, call in enumerate(session.tool_trace)]


def _observation(index: int, call: ToolCall) -> Draft:
    def short(value: object) -> str:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        return text if len(text) <= _OBS_FIELD_CHARS else text[:_OBS_FIELD_CHARS] + "…"

    outcome = f"error: {short(call.error)}" if call.error else f"-> {short(call.output)}"
    return Draft(
        text=f"{call.tool}({short(call.input)}) {outcome}",
        importance=OBSERVATION_IMPORTANCE,
        memory_type="episodic",
        layer="observation",
        metadata={"call_index": index, "tool": call.tool, "failed": call.error is not None},
    )


def _lesson_draft(lesson: Lesson) -> Draft:
    return Draft(text=lesson.text, importance=lesson.importance, memory_type=lesson.memory_type)


async def handle_validated_session(infra: Infra, distiller: Distiller, msg: Msg) -> None:
    try:
        session = SessionEnded.model_validate_json(msg.data)
    except ValidationError as exc:  # only ingest publishes here; this is a bug or a version skew
        await _dead_letter(
            infra, msg, audit.SYSTEM_ORG, "INVALID_REQUEST", f"unreadable session: {exc.error_count()} errors"
        )
        return
    key = f"{session.org_id}/{session.event_id}"
    try:
        async with infra.db.transaction() as db:
            if await already_processed(db, CONSUMER, key):
                await msg.ack()
                return
            config, _ = await claim_agent_config(db, session.org_id, session.agent_config_id, by="distill")
            org_enabled = await org_memory_enabled(db, session.org_id)
    except Forbidden as exc:
        await _dead_letter(infra, msg, session.org_id, exc.code.value, exc.message, session)
        return

    skip = distill_gate(session, config, org_enabled)
    lessons: list[Lesson] = []
    summary_note: dict[str, object] = {}
    if skip is None:
        summary = summarize_trace(session)
        summary_note = {"kept_calls": list(summary.kept_indexes), "total_calls": summary.total_calls}
        try:
            lessons = (await distiller.distill(session, summary))[:5]
        except EngramError as exc:
            await _retry_or_dead_letter(infra, msg, session, exc)
            return

    keep_observations = config.keep_observations and skip not in {
        "memory_disabled",
        "org_memory_disabled",
        "write_disabled",
    }
    drafts = [_lesson_draft(lesson) for lesson in lessons]
    if keep_observations:
        drafts += observation_drafts(session)
    ctx = SaveContext(
        org_id=session.org_id,
        agent_config_id=session.agent_config_id,
        owner=session.principal,
        session_id=session.session_id,
        source="distill",
        requested_by=session.principal.ref,
        source_agent=distiller.name,
        provenance={"event_id": str(session.event_id), "session_id": session.session_id},
    )
    details: dict[str, object] = {"event_id": str(session.event_id)}
    if skip:
        details["reason"] = skip
    else:
        details.update(distiller=distiller.name, lessons=len(lessons), **summary_note)
    outcome = audit.AuditEntry(
        kind="distill.skipped" if skip else "distill.completed",
        actor_ref=session.principal.ref,
        agent_config_id=session.agent_config_id,
        session_id=session.session_id,
        details=details,
    )
    async with infra.db.transaction() as db:
        if not await claim_inbox(db, CONSUMER, key):
            await msg.ack()  # another instance finished it first
            return
        if drafts:
            await save_entries(db, ctx, drafts, config, also_audit=[outcome])
        else:
            await audit.append(db, session.org_id, [outcome])
    infra.relay.wake()
    await msg.ack()


async def _retry_or_dead_letter(infra: Infra, msg: Msg, session: SessionEnded, exc: EngramError) -> None:
    deliveries = msg.metadata.num_delivered
    if deliveries < infra.settings.max_deliver:
        delay = infra.backoff(deliveries)
        log.warning("distill failed (%s), attempt %d, retrying in %.1fs", exc.message, deliveries, delay)
        await msg.nak(delay=delay)
        return
    await _dead_letter(infra, msg, session.org_id, exc.code.value, f"distill failed: {exc.message}", session)


async def _dead_letter(
    infra: Infra, msg: Msg, org_id: UUID, code: str, reason: str, session: SessionEnded | None = None
) -> None:
    async with infra.db.transaction() as db:
        await dead_letter(
            db,
            msg,
            consumer=CONSUMER,
            source="distill",
            org_id=org_id,
            code=code,
            reason=reason,
            original_event_id=str(session.event_id) if session else None,
            actor_ref=session.principal.ref if session else None,
        )
    infra.relay.wake()
    await msg.ack()
