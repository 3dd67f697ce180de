"""The console's only way to data: an operation of the table, through the gateway's bridge, under
the signed-in user's token — exactly what that token may do over NATS or HTTP, nothing more."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from contracts.errors import InvalidRequest, error_for_code
from contracts.operations import Operation
from services.gateway.bridge import Bridge
from shared.messaging.wire import validation_details

__all__ = ["call", "request_of"]

Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)


def request_of(op: Operation[Req, Any], fields: dict[str, Any]) -> Req:
    """``op``'s request model from form fields; a bad field is ``INVALID_REQUEST`` with the
    validator's details, as a service would answer it."""
    try:
        return op.request.model_validate(fields)
    except ValidationError as exc:
        raise InvalidRequest(f"invalid {op.name} request", validation_details(exc)) from exc


async def call(bridge: Bridge, op: Operation[Req, Rep], fields: dict[str, Any], authorization: str) -> Rep:
    """``op``'s reply, or the service's SPEC 9 error raised as its typed exception."""
    request = request_of(op, {k: v for k, v in fields.items() if v is not None})
    payload = request.model_dump_json(exclude_none=True).encode()
    reply = json.loads(await bridge.request(op, payload, authorization))
    if isinstance(reply, dict) and isinstance(reply.get("error"), dict):
        error = reply["error"]
        raise error_for_code(str(error.get("code")), str(error.get("message", "")), error.get("details"))
    return op.parse_reply(reply)
