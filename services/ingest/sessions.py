"""``engram.session.ended``: verify, validate, dedupe, and hand valid sessions to distill.

The ack comes last: a crash anywhere before it means redelivery, and every step is idempotent
(``Nats-Msg-Id`` on the hand-off, the inbox row, the dead-letter key), so nothing is lost or doubled.
"""

from __future__ import annotations

import logging

from nats.aio.msg import Msg

from contracts.errors import EngramError, Forbidden, InvalidRequest
from contracts.events import MAX_SESSION_BYTES, SessionEnded
from contracts.subjects import SESSION_VALIDATED
from shared import audit
from shared.auth import WRITE, Credential, act_as, bearer_from_headers
from shared.deadletter import dead_letter
from shared.infra import Infra
from shared.outbox import already_processed, claim_inbox
from shared.telemetry import inject_trace_headers
from shared.wire import parse_model

__all__ = ["CONSUMER", "handle_session_ended", "inbox_key"]

CONSUMER = "ingest"
log = logging.getLogger(__name__)


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


async def handle_session_ended(infra: Infra, msg: Msg) -> None:
    credential: Credential | None = None
    session: SessionEnded | None = None
    try:
        credential = infra.tokens.verify(bearer_from_headers(msg.headers))
        session = parse_model(SessionEnded, msg.data, max_bytes=MAX_SESSION_BYTES)
        authorize(credential, session)
    except EngramError as exc:
        await _reject(infra, msg, exc, credential, session)
        return

    key = inbox_key(session)
    async with infra.db.read() as db:
        if await already_processed(db, CONSUMER, key):
            await msg.ack()
            return
    # Forward the verified bytes as they came; the msg id makes a re-forward after a crash a no-op.
    await infra.js.publish(
        SESSION_VALIDATED,
        msg.data,
        headers=inject_trace_headers({"Nats-Msg-Id": key}),
    )
    async with infra.db.transaction() as db:
        await claim_inbox(db, CONSUMER, key)
    await msg.ack()


async def _reject(
    infra: Infra,
    msg: Msg,
    exc: EngramError,
    credential: Credential | None,
    session: SessionEnded | None,
) -> None:
    # Only a verified token may put records into an organization's audit chain.
    org_id = credential.org_id if credential is not None else audit.SYSTEM_ORG
    log.info("session.ended rejected: %s %s", exc.code, exc.message)
    async with infra.db.transaction() as db:
        await dead_letter(
            db,
            msg,
            consumer=CONSUMER,
            source="session",
            org_id=org_id,
            code=exc.code.value,
            reason=exc.message,
            original_event_id=str(session.event_id) if session is not None else None,
            actor_ref=credential.principal.ref if credential is not None else None,
            details=exc.details,
        )
    infra.relay.wake()
    await msg.ack()
