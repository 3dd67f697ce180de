"""``GET /v1/events``: the caller's organization's feed as Server-Sent Events (SPEC 11,
docs/adr/0102-tenant-feeds.md).

Each event is one message of ``engram.feed.<org_id>.>`` in the ``ENGRAM_FEED`` stream: ``id`` is
its stream sequence, ``event`` what it is (``memory.written``, ``memory.purged``,
``audit.<kind>``), ``data`` its JSON — ids and metadata, never memory text. A client that
reconnects with ``Last-Event-ID`` (or ``?last_event_id=``) resumes right after that event, so
nothing is lost while the stream keeps it (7 days); without one it gets what happens from now on
(``?from_start=true``: everything the stream still keeps).

Who may: the same as ``GET /v1/audit`` (the feed carries the audit records) — ``memory.admin`` on
an operator token (not an end user's) that is not restricted to an agent config or session. The
gateway verifies the token itself here (the services answer request-reply, not streams); which
organization's feed is read comes from the verified token only. The stream ends when the token
expires; the client reconnects with a fresh one and its ``Last-Event-ID``.

Reading: an ephemeral pull consumer per connection (no acks; the server removes it once idle),
filtered to the organization's subjects — the only filter the gateway's NATS identity may create.
A pull waits up to ``_KEEPALIVE_S`` for events, and a comment line is sent when none came, so
idle connections stay open through proxies without waking anything more often.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import jwt
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from contracts import subjects as s
from contracts.errors import Forbidden, InvalidRequest, Unauthenticated
from contracts.operations import FEED
from services.gateway.bridge import Bridge
from shared.messaging.feed import org_of_feed_subject
from shared.security.auth import Credential, TokenVerifier

__all__ = ["EVENTS_PATH", "events_endpoint", "sse_frame"]

log = logging.getLogger(__name__)

EVENTS_PATH = "/v1/events"
#: Seconds a pull waits for events before a keep-alive comment is sent.
_KEEPALIVE_S = 15.0
_BATCH = 100
#: The server removes a connection's consumer this long after its last pull.
_INACTIVE_S = 60.0


def sse_frame(seq: int, event: str, data: bytes) -> bytes:
    """One Server-Sent Event. ``data`` is one line of JSON (the feed's payloads are compact JSON;
    a newline would end the field, so any is escaped away by re-encoding)."""
    line = data.replace(b"\r", b"").replace(b"\n", b" ")
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (seq, event.encode(), line)


def _caller(credential: Credential) -> Credential:
    credential.require_operator()
    if credential.agent_config_id is not None or credential.session_id is not None:
        raise Forbidden("the event feed needs a token not restricted to an agent config or session")
    return credential


def _start(request: Request) -> tuple[DeliverPolicy, int | None]:
    """Where the feed starts: after ``Last-Event-ID``, from the start, or from now on."""
    last = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
    if last:
        try:
            seq = int(last)
        except ValueError:
            raise InvalidRequest("Last-Event-ID is a stream position: an integer") from None
        if not 0 <= seq < 2**63:
            raise InvalidRequest("Last-Event-ID is out of range")
        return DeliverPolicy.BY_START_SEQUENCE, seq + 1
    if request.query_params.get("from_start", "").lower() in ("1", "true", "yes"):
        return DeliverPolicy.ALL, None
    return DeliverPolicy.NEW, None


def events_endpoint(
    bridge: Bridge, tokens: TokenVerifier, error_response: Callable[[BaseException], Response]
) -> Callable[[Request], Awaitable[Response]]:
    """The Starlette endpoint of ``GET /v1/events`` on the gateway's NATS connection."""

    async def endpoint(request: Request) -> Response:
        try:
            scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthenticated("send Authorization: Bearer <token>")
            credential = _caller(await tokens.verify(token.strip()))
            policy, start = _start(request)
            config = ConsumerConfig(
                deliver_policy=policy,
                opt_start_seq=start,
                ack_policy=AckPolicy.NONE,
                inactive_threshold=_INACTIVE_S,
            )
            sub = await bridge.nats.jetstream().pull_subscribe(
                s.feed_subject(credential.org_id), stream=FEED.jetstream, config=config
            )
        except Exception as exc:
            return error_response(exc)
        deadline = _expiry(token.strip())

        async def frames() -> AsyncIterator[bytes]:
            try:
                yield b": the feed of organization %s\n\n" % str(credential.org_id).encode()
                while deadline is None or time.time() < deadline:
                    wait = (
                        _KEEPALIVE_S
                        if deadline is None
                        else max(0.1, min(_KEEPALIVE_S, deadline - time.time()))
                    )
                    try:
                        msgs = await sub.fetch(_BATCH, timeout=wait)
                    except TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    for msg in msgs:
                        org, event = org_of_feed_subject(msg.subject)
                        if org != credential.org_id:  # the filter says so; never trust one check only
                            log.error("feed message of another organization on a filtered consumer")
                            continue
                        yield sse_frame(msg.metadata.sequence.stream, event, msg.data)
            finally:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

        return StreamingResponse(
            frames(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    return endpoint


def _expiry(token: str) -> float | None:
    """The token's ``exp`` (already verified), so the stream ends when the token would."""
    try:
        exp = jwt.decode(token, options={"verify_signature": False}).get("exp")
    except jwt.PyJWTError:
        return None
    return float(exp) if isinstance(exp, int | float) else None
