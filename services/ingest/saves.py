"""``engram.memory.save``: validate, durably accept onto JetStream, answer 202 at once (or the
outcome with ``wait: true``). The save itself happens in distill, on the one save path."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any
from uuid import uuid4

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from contracts.errors import Forbidden, InvalidRequest, error_for_code
from contracts.internal import AcceptedSave
from contracts.requests import Accepted, SaveOutcome, SaveRequest
from contracts.subjects import MEMORY_SAVE_ACCEPTED, save_result_subject
from shared.observability.telemetry import inject_trace_headers
from shared.security.access import Caller
from shared.service.infra import Infra
from shared.storage.deadletter import refuse_forged

__all__ = ["handle_save"]

#: The consumer name of dead letters of forged outcomes.
RESULT_CONSUMER = "ingest-save-result"
#: How long a ``wait: true`` caller is kept waiting before it gets the 202 it would have had.
WAIT_TIMEOUT_S = 10.0


async def handle_save(infra: Infra, caller: Caller, request: SaveRequest) -> Accepted | SaveOutcome:
    """``caller`` is authorized (``shared.security.access``); the owner of the saved memories is whom it
    acts for."""
    credential, owner = caller.credential, caller.principal
    if owner.kind == "service":
        raise InvalidRequest("memories belong to an end user, an actor or the shared pool, not a service")
    if owner.kind == "none" and credential.principal.kind not in {"service", "none"}:
        raise Forbidden("only a service or the shared principal may write the shared pool")

    request_id = request.request_id or uuid4()
    accepted = AcceptedSave(
        request_id=request_id,
        org_id=credential.org_id,
        agent_config_id=request.agent_config_id,
        owner=owner,
        session_id=request.session_id,
        entries=request.all_entries(),
        wait=request.wait,
        requested_by=credential.principal.ref,
    )
    subscription = None
    if request.wait:
        # Subscribe before publishing, so a fast outcome cannot slip past us.
        subscription = await infra.nc.subscribe(save_result_subject(str(request_id)))
    try:
        body = accepted.model_dump_json().encode()
        # No Nats-Msg-Id: platforms publish into this stream and could claim any id first.
        # distill's inbox (``<org>/save/<request_id>``) makes a retried save take effect once.
        headers = inject_trace_headers({})
        await infra.js.publish(
            MEMORY_SAVE_ACCEPTED, body, headers=infra.signer.sign(MEMORY_SAVE_ACCEPTED, body, headers)
        )
        if subscription is None:
            return Accepted(request_id=request_id)
        reply = await _genuine_outcome(infra, subscription)
        return Accepted(request_id=request_id) if reply is None else _outcome(json.loads(reply.data))
    finally:
        if subscription is not None:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()


async def _genuine_outcome(infra: Infra, subscription: Subscription) -> Msg | None:
    """distill's outcome, or None after ``WAIT_TIMEOUT_S``. An outcome distill did not sign is
    dead-lettered and the wait goes on: nobody else can answer a waiting caller."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_TIMEOUT_S
    while (left := deadline - loop.time()) > 0:
        try:
            reply = await subscription.next_msg(timeout=left)
        except TimeoutError:
            return None
        if await refuse_forged(infra.signer, infra.db, [reply], consumer=RESULT_CONSUMER):
            return reply
    return None


def _outcome(data: dict[str, Any]) -> SaveOutcome:
    if "error" in data:
        err = data["error"]
        raise error_for_code(err["code"], err["message"], err.get("details"))
    return SaveOutcome.model_validate(data)
