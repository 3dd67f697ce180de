"""Dead-lettering: an event that cannot be processed is recorded with its reason and an audit
record, in one transaction, and the consumer moves on. Nothing invalid is silently dropped.

JetStream consumers dead-letter through their batch (``shared.service.consumer.Batch.dead_letter``), which
also acks; :func:`dead_letter_all` is the one write both it and ``shared.security.provenance`` use."""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid4, uuid5

from nats.aio.msg import Msg
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.errors import EngramError
from contracts.events import DeadLetter
from contracts.subjects import dead_letter_subject
from shared.observability.metrics import DEAD_LETTERS, on_commit
from shared.security.provenance import FORGED_SOURCE, MessageSigner
from shared.storage import audit
from shared.storage.db.engine import Database
from shared.storage.outbox import claim_inbox_many, enqueue_many
from shared.text.policy import redact_pii

__all__ = [
    "Rejection",
    "dead_letter",
    "dead_letter_all",
    "delivery_key",
    "is_jetstream",
    "record_dead_letter",
    "refuse_forged",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rejection:
    """Why a message is dead-lettered, and whose it was as far as it is known."""

    code: str
    reason: str
    #: The organization whose event it was; the system organization when nothing believable
    #: names one (no valid token, an unreadable or forged message).
    org_id: UUID = audit.SYSTEM_ORG
    original_event_id: str | None = None
    actor_ref: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        exc: EngramError,
        *,
        org_id: UUID = audit.SYSTEM_ORG,
        original_event_id: str | None = None,
        actor_ref: str | None = None,
        reason: str | None = None,
    ) -> Rejection:
        """The rejection an error says: its code, message (or ``reason``) and details."""
        return cls(
            code=exc.code.value,
            reason=exc.message if reason is None else reason,
            org_id=org_id,
            original_event_id=original_event_id,
            actor_ref=actor_ref,
            details=exc.details,
        )


def is_jetstream(msg: Msg) -> bool:
    """Whether ``msg`` was delivered by a JetStream consumer (it can be acked, and redelivered)."""
    return bool(msg.reply) and msg.reply.startswith("$JS.ACK.")


def delivery_key(msg: Msg) -> str:
    """A key unique to one stored message (stream sequence plus its store timestamp). A core NATS
    message is never redelivered, so each one gets a key of its own."""
    if not is_jetstream(msg):
        return f"core:{uuid4()}"
    meta = msg.metadata
    return f"{meta.stream}:{meta.sequence.stream}:{meta.timestamp}"


async def dead_letter_all(
    db: Database, rejected: Sequence[tuple[Msg, Rejection]], *, consumer: str, source: str
) -> None:
    """Dead-letter each message with its rejection, all in one transaction (whose commit wakes
    the outbox relay). Settling the messages is the caller's."""
    if not rejected:
        return
    async with db.transaction() as session:
        await _dead_letter_many(session, rejected, consumer=consumer, source=source)


async def dead_letter(
    session: AsyncSession, msg: Msg, rejection: Rejection, *, consumer: str, source: str
) -> bool:
    """Queue ``msg`` for the dead-letter stream and audit it; False if this delivery was already
    dead-lettered (a redelivery after a crash), in which case nothing is written twice."""
    return bool(await _dead_letter_many(session, [(msg, rejection)], consumer=consumer, source=source))


async def record_dead_letter(
    session: AsyncSession,
    *,
    key: str,
    subject: str,
    data: bytes,
    deliveries: int,
    rejection: Rejection,
    consumer: str,
    source: str,
) -> bool:
    """Queue what failed (``data`` as published on ``subject``, tried ``deliveries`` times) for
    the dead-letter stream and audit it, once per ``key`` of ``consumer``; False if it already was
    (also what a worker that is no stream consumer uses: webhook deliveries)."""
    failed = _Failed(key, subject, data, deliveries, rejection)
    return bool(await _record_many(session, [failed], consumer=consumer, source=source))


@dataclass(frozen=True)
class _Failed:
    key: str
    subject: str
    data: bytes
    deliveries: int
    rejection: Rejection


async def _dead_letter_many(
    session: AsyncSession, rejected: Sequence[tuple[Msg, Rejection]], *, consumer: str, source: str
) -> int:
    failed = [
        _Failed(
            delivery_key(msg),
            msg.subject,
            msg.data,
            msg.metadata.num_delivered if is_jetstream(msg) else 1,
            rejection,
        )
        for msg, rejection in rejected
    ]
    return await _record_many(session, failed, consumer=consumer, source=source)


async def _record_many(
    session: AsyncSession, failed: Sequence[_Failed], *, consumer: str, source: str
) -> int:
    """:func:`record_dead_letter` for several failures in a handful of statements whatever their
    number (one inbox claim, one audit append per organization, one outbox insert): a flood
    refused a batch at a time costs its neighbours little. Returns how many were not
    dead-lettered before."""
    keyed: dict[str, _Failed] = {}
    for each in failed:
        keyed.setdefault(each.key, each)
    claimed = await claim_inbox_many(session, f"{consumer}:dlq", list(keyed))
    todo = [each for key, each in keyed.items() if key in claimed]
    by_org: dict[UUID, list[audit.AuditEntry]] = {}
    letters: list[tuple[str, BaseModel, UUID, dict[str, str] | None]] = []
    for each in todo:
        rejection = each.rejection
        by_org.setdefault(rejection.org_id, []).append(
            audit.AuditEntry(
                kind=f"{source}.rejected",
                actor_ref=rejection.actor_ref,
                details={
                    "code": rejection.code,
                    "reason": rejection.reason,
                    "event_id": rejection.original_event_id,
                    "delivery": each.key,
                    "deliveries": each.deliveries,
                },
            )
        )
        kept, kinds = redact_pii(each.data.decode("utf-8", "replace"))
        letter = DeadLetter(
            event_id=uuid5(NAMESPACE_URL, f"engram-dlq:{consumer}:{each.key}"),
            source_subject=each.subject,
            original_event_id=rejection.original_event_id,
            code=rejection.code,
            reason=rejection.reason,
            details=rejection.details,
            deliveries=each.deliveries,
            original_b64=base64.b64encode(kept.encode()).decode(),
            original_sha256=hashlib.sha256(each.data).hexdigest(),
            redactions=kinds,
            org_id=rejection.org_id,
        )
        letters.append((dead_letter_subject(source), letter, letter.event_id, None))
        # The code, not the free-text reason, labels the metric: a bounded set.
        on_commit(session, DEAD_LETTERS.labels(source, rejection.code).inc)
    for org_id in sorted(by_org):  # one order for every transaction: chains locked without deadlock
        await audit.append(session, org_id, by_org[org_id])
    await enqueue_many(session, letters)
    return len(todo)


async def refuse_forged(
    signer: MessageSigner, db: Database, msgs: Sequence[Msg], *, consumer: str
) -> list[Msg]:
    """The messages of ``msgs`` that a service produced. Every other one is dead-lettered with an
    ``internal.rejected`` audit record (system chain: nothing in it can be believed, its
    organization least of all), so it has no effect; settling it (the ack of a JetStream message)
    is the caller's — ``shared.service.consumer.Batch`` does it for the stream consumers."""
    genuine: list[Msg] = []
    forged: list[Msg] = []
    for msg in msgs:
        (genuine if signer.verify(msg.subject, msg.data, msg.headers) else forged).append(msg)
    if forged:
        log.warning(
            "%s: refused %d internal message(s) without a valid producer signature", consumer, len(forged)
        )
        await dead_letter_all(
            db,
            [(m, Rejection("UNAUTHENTICATED", f"{m.subject}: no valid producer signature")) for m in forged],
            consumer=consumer,
            source=FORGED_SOURCE,
        )
    return genuine
