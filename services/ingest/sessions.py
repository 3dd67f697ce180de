"""Sessions in: ``engram.session.ended`` (JetStream, a batch at a time) and
``engram.session.submit`` (request-reply, ``POST /v1/sessions``) — verify, validate, dedupe, and
hand valid sessions to distill.

Deduplication is by the inbox row ``<org>/<event_id>``, claimed only for a session whose token
verified: an id a publisher chose (``Nats-Msg-Id``) decides nothing, so no caller can make another
organization's session disappear by publishing its event_id first (docs/adr/0081-session-dedupe.md).
The stream's ack comes last (``shared.service.consumer`` acks after this returns), a request's answer
after the commit: a crash anywhere before means redelivery or a retry, and every step is
idempotent (the inbox rows of ingest and distill, the dead-letter key), so nothing is lost or
doubled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.errors import NotJSMessageError
from sqlalchemy import bindparam, or_, update
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.errors import EngramError, Forbidden, InvalidRequest, RateLimited
from contracts.events import MAX_SESSION_BYTES, SessionEnded
from contracts.operations import INGEST_SESSIONS
from contracts.requests import SessionAccepted
from contracts.subjects import SESSION_VALIDATED
from shared.messaging.wire import parse_model
from shared.observability.telemetry import annotate_consumer, extract_context, inject_trace_headers, tracer
from shared.security.access import Caller
from shared.security.auth import WRITE, Credential, act_as, bearer_from_headers
from shared.service.consumer import Batch
from shared.service.infra import Infra
from shared.storage import audit
from shared.storage.db.models import RECALLS
from shared.storage.deadletter import Rejection
from shared.storage.outbox import claim_inbox_many, first_of_each, processed_of

__all__ = ["CONSUMER", "handle_sessions_ended", "inbox_key", "submit_session"]

#: Its inbox rows are named after its durable consumer.
CONSUMER = INGEST_SESSIONS.durable
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


@dataclass(frozen=True)
class Verified:
    """A session whose token, payload and tenancy passed, as it goes on to distill: ``body``
    without the caller's token, ``headers`` its own trace context."""

    session: SessionEnded
    body: bytes
    headers: dict[str, str]

    @property
    def key(self) -> str:
        return inbox_key(self.session)


async def handle_sessions_ended(infra: Infra, batch: Batch) -> None:
    """A batch of ``session.ended``: valid sessions within their organization's budget are
    forwarded, then the rejects dead-lettered (the batch acks them after)."""
    verified: list[tuple[Msg, Verified, Credential]] = []
    rejected: list[tuple[Msg, Rejection]] = []
    for msg in batch.msgs:
        # Each message keeps its own trace: a span parented on what its publisher sent, whose
        # context travels on with the forwarded session.
        with _tracer.start_as_current_span(
            "engram.ingest.session", context=extract_context(msg.headers)
        ) as span:
            annotate_consumer(span, msg.subject, CONSUMER)
            checked = await _check(infra, msg)
            if isinstance(checked, Rejection):
                rejected.append((msg, checked))
            else:
                session, credential = checked
                # The verified bytes as they came; the caller's token stays behind.
                verified.append((msg, Verified(session, msg.data, inject_trace_headers({})), credential))
    within = await _within_budget(infra, verified, rejected)
    # Those taken go first: a flood's dead letters do not delay the others' sessions.
    await forward(infra, within)
    if not rejected:
        return
    # The rejects are written behind the next batch, not in front of it: the sessions taken are
    # acked now, and the batch's dead letters (then its acks) are a task of their own — one at a
    # time, so a flood's letters never pile up more than a batch behind.
    previous = _letters.pop(id(infra), None)
    if previous is not None:
        await previous
    refused = {id(m) for m, _ in rejected}
    await batch.ack(m for m in batch.msgs if id(m) not in refused)

    why = {id(m): rejection for m, rejection in rejected}

    async def letters(each: Batch) -> None:  # the batch, or one message of it when retried alone
        await each.dead_letter([(m, why[id(m)]) for m in each.msgs if id(m) in why])

    task = asyncio.create_task(batch.hand_over().settle(letters), name="ingest dead letters")
    _letters[id(infra)] = task
    task.add_done_callback(lambda t: _letters.pop(id(infra), None) if _letters.get(id(infra)) is t else None)


#: Per process (its Infra), the batch of rejects being dead-lettered now, if any.
_letters: dict[int, asyncio.Task[bool]] = {}


async def _within_budget(
    infra: Infra, verified: list[tuple[Msg, Verified, Credential]], rejected: list[tuple[Msg, Rejection]]
) -> list[Verified]:
    """The sessions within their organization's session budget (``shared.runtime.quotas``), judged by
    when each was published, so a backlog taken at once is not a burst; a session taken before (a
    redelivery) is not charged again. The others join ``rejected`` as ``RATE_LIMITED``
    (dead-lettered, replayable)."""
    if not infra.quotas.enabled:
        return [v for _, v, _ in verified]
    async with infra.db.read() as db:
        taken = await processed_of(db, CONSUMER, [v.key for _, v, _ in verified])
    within: list[Verified] = []
    for msg, v, credential in verified:
        if v.key not in taken:
            try:
                await infra.quotas.charge(
                    "sessions", v.session.org_id, credential.token_id, at=_published_at(msg)
                )
            except RateLimited as exc:
                rejected.append((msg, _rejection(exc, credential, v.session)))
                continue
        within.append(v)
    return within


async def submit_session(infra: Infra, caller: Caller, session: SessionEnded) -> SessionAccepted:
    """``engram.session.submit``: the edge verified the token; tenancy is checked here as for a
    published session, and a refusal is answered rather than dead-lettered. The answer comes once
    the session is durably on its way (or was before: ``duplicate``)."""
    authorize(caller.credential, session)
    verified = Verified(session, session.model_dump_json().encode(), inject_trace_headers({}))
    taken = await forward(infra, [verified])
    seq = taken.get(verified.key)
    return SessionAccepted(event_id=session.event_id, stream_seq=seq, duplicate=seq is None)


async def forward(infra: Infra, verified: Sequence[Verified]) -> dict[str, int]:
    """Hand verified sessions to distill, each organization's event once, and label their recalls:
    the forwards first, then their inbox rows and labels in one transaction. Returns the keys this
    call took, with the stream sequence of each forward (the others were taken before)."""
    first = first_of_each(verified, lambda v: v.key)
    if not first:
        return {}
    async with infra.db.read() as db:
        done = await processed_of(db, CONSUMER, [v.key for v in first])
    todo = [v for v in first if v.key not in done]
    if not todo:
        return {}
    # Signed as ingest's (distill believes nothing else), and without a Nats-Msg-Id: the stream
    # platforms publish to would let anyone claim one first. A re-forward after a crash reaches
    # distill again, whose inbox drops it.
    acks = await asyncio.gather(
        *(
            infra.js.publish(
                SESSION_VALIDATED, v.body, headers=infra.signer.sign(SESSION_VALIDATED, v.body, v.headers)
            )
            for v in todo
        )
    )
    async with infra.db.transaction() as db:
        claimed = await claim_inbox_many(db, CONSUMER, [v.key for v in todo])
        await label_recalls(db, [v.session for v in todo if v.key in claimed])
    return {v.key: int(ack.seq) for v, ack in zip(todo, acks, strict=True) if v.key in claimed}


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


def _published_at(msg: Msg) -> float | None:
    """When JetStream stored ``msg`` (seconds since the epoch); None for a core message."""
    try:
        return msg.metadata.timestamp.timestamp()
    except NotJSMessageError:
        return None


async def _check(infra: Infra, msg: Msg) -> tuple[SessionEnded, Credential] | Rejection:
    """The verified session and its caller, or why it is dead-lettered."""
    credential: Credential | None = None
    session: SessionEnded | None = None
    try:
        credential = await infra.tokens.verify(bearer_from_headers(msg.headers))
        published = _published_at(msg)
        if published is not None and infra.quotas.enabled and msg.metadata.num_delivered <= 1:
            # Right after the token: a session whose organization's budget is known to be spent
            # is refused before it is read (a flood costs a token check and a dead letter each).
            # One that may fit is read first, so that a session taken before spends nothing —
            # and so is a redelivery, which may have been taken on its first delivery.
            infra.quotas.refuse_known("sessions", credential.org_id, credential.token_id, at=published)
        session = parse_model(SessionEnded, msg.data, max_bytes=MAX_SESSION_BYTES)
        authorize(credential, session)
    except EngramError as exc:
        if not isinstance(exc, RateLimited):  # a flood is counted (dead letters), not logged each
            log.info("session.ended rejected: %s %s", exc.code, exc.message)
        return _rejection(exc, credential, session)
    return session, credential


def _rejection(exc: EngramError, credential: Credential | None, session: SessionEnded | None) -> Rejection:
    return Rejection.of(
        exc,
        # Only a verified token may put records into an organization's audit chain.
        org_id=credential.org_id if credential is not None else audit.SYSTEM_ORG,
        original_event_id=str(session.event_id) if session is not None else None,
        actor_ref=credential.principal.ref if credential is not None else None,
    )
