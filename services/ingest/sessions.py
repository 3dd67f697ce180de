"""``engram.session.ended``: verify, validate, dedupe, and hand valid sessions to distill.

The ack comes last (``shared.consumer`` acks after this returns): a crash anywhere before it means
redelivery, and every step is idempotent (``Nats-Msg-Id`` on the hand-off, the inbox row, the
dead-letter key), so nothing is lost or doubled.
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.msg import Msg
from sqlalchemy import bindparam, or_, update
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.errors import EngramError, Forbidden, InvalidRequest
from contracts.events import MAX_SESSION_BYTES, SessionEnded
from contracts.subjects import SESSION_VALIDATED
from shared import audit
from shared.auth import WRITE, Credential, act_as, bearer_from_headers
from shared.consumer import Batch
from shared.db.models import RECALLS
from shared.deadletter import Rejection
from shared.infra import Infra
from shared.outbox import claim_inbox_many, processed_of
from shared.telemetry import annotate_consumer, extract_context, inject_trace_headers, tracer
from shared.wire import parse_model

__all__ = ["CONSUMER", "handle_sessions_ended", "inbox_key"]

CONSUMER = "ingest"
log = logging.getLogger(__name__)
_tracer = tracer(__name__)


def inbox_key(session: SessionEnded) -> str:
    # Scoped by organization, so one tenant cannot pre-empt another's event id.
    return f"{session.org_id}/{session.event_id}"


def authorize(credential: Credential, session: SessionEnded) -> None:
    """The token must be allowed to write for this organization, agent config and principal."""
    credential.require(WRITE)
    if credential.org_id != session.org_id:
        raise Forbidden("org_id does not match the token")
    credential.require_agent_config(session.agent_config_id)
    credential.require_session(session.session_id)
    if session.principal.kind == "service":
        raise InvalidRequest("a session's principal is the end user, actor or none it ran for, not a service")
    act_as(credential, session.principal)


async def handle_sessions_ended(infra: Infra, batch: Batch) -> None:
    """A batch of ``session.ended``: rejects are dead-lettered; valid sessions are forwarded
    together and their inbox rows written in one transaction (the batch acks them after)."""
    valid: list[tuple[Msg, str, dict[str, str]]] = []
    ended: list[SessionEnded] = []
    rejected: list[tuple[Msg, Rejection]] = []
    for msg in batch.msgs:
        # Each message keeps its own trace: a span parented on what its publisher sent, whose
        # context travels on with the forwarded session.
        with _tracer.start_as_current_span(
            "engram.ingest.session", context=extract_context(msg.headers)
        ) as span:
            annotate_consumer(span, msg.subject, CONSUMER)
            checked = _check(infra, msg)
            if isinstance(checked, Rejection):
                rejected.append((msg, checked))
            else:
                key = inbox_key(checked)
                valid.append((msg, key, inject_trace_headers({"Nats-Msg-Id": key})))
                ended.append(checked)
    await batch.dead_letter(rejected)
    if not valid:
        return
    async with infra.db.read() as db:
        done = await processed_of(db, CONSUMER, [key for _, key, _ in valid])
    todo = [(msg, key, headers) for msg, key, headers in valid if key not in done]
    # Forward the verified bytes as they came (the caller's token stays behind), signed as
    # ingest's (distill believes nothing else); the msg id makes a re-forward after a crash a no-op.
    await asyncio.gather(
        *(
            infra.js.publish(
                SESSION_VALIDATED, m.data, headers=infra.signer.sign(SESSION_VALIDATED, m.data, h)
            )
            for m, _, h in todo
        )
    )
    async with infra.db.transaction() as db:
        claimed = await claim_inbox_many(db, CONSUMER, [key for _, key, _ in todo])
        await label_recalls(db, [s for s in ended if inbox_key(s) in claimed])


_LABEL = (
    update(RECALLS)
    .where(
        RECALLS.c.org_id == bindparam("org"),
        RECALLS.c.agent_config_id == bindparam("agent"),
        RECALLS.c.session_id == bindparam("session"),
        or_(RECALLS.c.label_source.is_(None), RECALLS.c.label_source == "session"),
    )
    .values(label=bindparam("label"), label_source="session")
)


async def label_recalls(db: AsyncSession, sessions: list[SessionEnded]) -> None:
    """SPEC 5.6: the recalls made for a session are labelled by how it ended — unless an explicit
    rating (``engram.memory.feedback``) already labelled them."""
    rows = [
        {"org": s.org_id, "agent": s.agent_config_id, "session": s.session_id, "label": s.status}
        for s in sessions
        if s.status in ("success", "failed")
    ]
    if rows:
        await db.execute(_LABEL, rows)


def _check(infra: Infra, msg: Msg) -> SessionEnded | Rejection:
    """The verified session, or why it is dead-lettered."""
    credential: Credential | None = None
    session: SessionEnded | None = None
    try:
        credential = infra.tokens.verify(bearer_from_headers(msg.headers))
        session = parse_model(SessionEnded, msg.data, max_bytes=MAX_SESSION_BYTES)
        authorize(credential, session)
    except EngramError as exc:
        log.info("session.ended rejected: %s %s", exc.code, exc.message)
        return Rejection.of(
            exc,
            # Only a verified token may put records into an organization's audit chain.
            org_id=credential.org_id if credential is not None else audit.SYSTEM_ORG,
            original_event_id=str(session.event_id) if session is not None else None,
            actor_ref=credential.principal.ref if credential is not None else None,
        )
    return session
