"""``engram.ops.dead_letters`` / ``engram.ops.lag``: what the pipeline could not process, and how
far behind its consumers are — read from JetStream, never from the database.

Dead letters need an unrestricted operator token (``memory.admin``, not an end user's, not
restricted to one agent config or session: letters belong to no agent config) and show the
caller's organization's — every letter, the system organization's included, to the deployment's
operator (``deployment.operator``), so what it is shown agrees with the stream's count. Lag counts
every tenant's messages: the deployment's operator's only (docs/adr/0082-operator-scoped-rejects.md).
"""

from __future__ import annotations

from uuid import UUID, uuid4

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from pydantic import ValidationError

from contracts.events import DeadLetter
from contracts.operations import CONSUMERS, JETSTREAMS
from contracts.ops import (
    ConsumerLag,
    DeadLetterPage,
    DeadLetterQuery,
    DeadLetterSummary,
    LagQuery,
    LagReply,
    StreamCount,
)
from contracts.subjects import dead_letter_subject
from shared.security.access import Caller
from shared.service.infra import Infra

__all__ = ["DLQ_STREAM", "dead_letters", "lag"]

DLQ_STREAM = "ENGRAM_DLQ"
_BATCH = 256


async def dead_letters(infra: Infra, caller: Caller, request: DeadLetterQuery) -> DeadLetterPage:
    """The letters the caller may see, newest first. Letters carry no index by organization, so
    this reads the stream (bounded by its 7-day retention) forward with an ephemeral consumer and
    keeps the last ``limit`` of the caller's before ``before_seq``."""
    caller.require_unrestricted("dead letters")
    # Whose letters: one organization's, or (None) the whole stream's for the deployment's operator.
    only = None if caller.credential.is_deployment_operator else caller.org_id
    # ">" is no filter (the stream holds only dead letters), and keeps wildcards out of the
    # consumer-create subject.
    subject = dead_letter_subject(request.source) if request.source else ">"
    kept: list[DeadLetterSummary] = []
    name = f"ops-{uuid4().hex}"
    sub = await infra.js.pull_subscribe(
        subject,
        stream=DLQ_STREAM,
        config=ConsumerConfig(
            name=name,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.NONE,
            # The server removes it once idle: a service may not delete consumers.
            inactive_threshold=10.0,
        ),
    )
    try:
        # The letters stored now; those arriving meanwhile are the next request's. Counting them
        # down ends the scan without waiting for a fetch to time out.
        left = (await sub.consumer_info()).num_pending or 0
        while left > 0:
            try:
                batch = await sub.fetch(min(_BATCH, left), timeout=5.0)
            except TimeoutError:
                # Some may have aged out meanwhile: what is left is what the server says.
                left = (await sub.consumer_info()).num_pending or 0
                continue
            left -= len(batch)
            for msg in batch:
                seq = msg.metadata.sequence.stream
                if request.before_seq is not None and seq >= request.before_seq:
                    left = 0
                    break
                letter = _visible_letter(msg.data, only, seq)
                if letter is not None:
                    kept.append(letter)
                    del kept[: -(request.limit + 1)]  # one more than a page: is there an older one?
    finally:
        await sub.unsubscribe()
    older = len(kept) > request.limit
    page = kept[-request.limit :][::-1]
    return DeadLetterPage(letters=page, next_before_seq=page[-1].seq if older else None)


def _visible_letter(data: bytes, only: UUID | None, seq: int) -> DeadLetterSummary | None:
    """The letter's summary if ``only`` (an organization; None: every one) may see it."""
    try:
        letter = DeadLetter.model_validate_json(data)
    except ValidationError:
        return None  # not a letter Engram wrote; nobody's
    # A tenant sees its own: never another's, nor the system organization's (no valid token named
    # one — the payload could claim to be anyone's).
    if only is not None and letter.org_id != only:
        return None
    return DeadLetterSummary(
        seq=seq,
        org_id=letter.org_id,
        occurred_at=letter.occurred_at,
        source_subject=letter.source_subject,
        original_event_id=letter.original_event_id,
        code=letter.code,
        reason=letter.reason,
        deliveries=letter.deliveries,
        original_sha256=letter.original_sha256,
    )


async def lag(infra: Infra, caller: Caller, request: LagQuery) -> LagReply:
    """Every stream's counts and every durable's backlog (the edge checked ``deployment.operator``)."""
    streams = []
    for definition in JETSTREAMS:
        state = (await infra.js.stream_info(definition.name)).state
        streams.append(
            StreamCount(
                stream=definition.name,
                messages=state.messages,
                bytes=state.bytes,
                first_seq=state.first_seq,
                last_seq=state.last_seq,
            )
        )
    consumers = []
    for stream, durable in ((c.stream.jetstream, c.durable) for c in CONSUMERS):
        try:
            info = await infra.js.consumer_info(stream, durable)
        except NotFoundError:
            continue
        consumers.append(
            ConsumerLag(
                stream=stream,
                durable=durable,
                num_pending=info.num_pending or 0,
                num_ack_pending=info.num_ack_pending or 0,
                num_redelivered=info.num_redelivered or 0,
            )
        )
    return LagReply(streams=streams, consumers=consumers)
