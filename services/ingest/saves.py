"""``engram.memory.save``: validate, durably accept onto JetStream, answer 202 at once (or the
outcome with ``wait: true``). The save itself happens in distill, on the one save path."""

from __future__ import annotations

import contextlib
import json
from typing import Any
from uuid import uuid4

from contracts.errors import Forbidden, InvalidRequest, error_for_code
from contracts.internal import AcceptedSave
from contracts.requests import Accepted, SaveOutcome, SaveRequest
from contracts.subjects import MEMORY_SAVE_ACCEPTED, save_result_subject
from shared.auth import WRITE, Credential, act_as
from shared.config_store import load_config
from shared.infra import Infra
from shared.telemetry import inject_trace_headers

__all__ = ["handle_save"]

#: How long a ``wait: true`` caller is kept waiting before it gets the 202 it would have had.
WAIT_TIMEOUT_S = 10.0


async def handle_save(infra: Infra, credential: Credential, request: SaveRequest) -> Accepted | SaveOutcome:
    credential.require(WRITE)
    credential.require_agent_config(request.agent_config_id)
    credential.require_session(request.session_id)
    owner = act_as(credential, request.principal)
    if owner.kind == "service":
        raise InvalidRequest("memories belong to an end user, an actor or the shared pool, not a service")
    async with infra.db.read() as db:
        # Refuses an agent config of another organization before anything is accepted.
        await load_config(db, credential.org_id, request.agent_config_id)
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
        subscription = await infra.nc.subscribe(save_result_subject(str(request_id)), max_msgs=1)
    try:
        await infra.js.publish(
            MEMORY_SAVE_ACCEPTED,
            accepted.model_dump_json().encode(),
            headers=inject_trace_headers({"Nats-Msg-Id": f"{credential.org_id}/save/{request_id}"}),
        )
        if subscription is None:
            return Accepted(request_id=request_id)
        try:
            reply = await subscription.next_msg(timeout=WAIT_TIMEOUT_S)
        except TimeoutError:
            return Accepted(request_id=request_id)
        return _outcome(json.loads(reply.data))
    finally:
        if subscription is not None:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()


def _outcome(data: dict[str, Any]) -> SaveOutcome:
    if "error" in data:
        err = data["error"]
        raise error_for_code(err["code"], err["message"], err.get("details"))
    return SaveOutcome.model_validate(data)
