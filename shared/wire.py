"""Turning bytes from the wire into typed models and errors into the SPEC 9 envelope."""

from __future__ import annotations

import json
import logging
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from contracts.errors import EngramError, Internal, InvalidRequest, PayloadTooLarge

__all__ = ["error_reply", "parse_model", "validation_details"]

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)

MAX_REQUEST_BYTES = 256 * 1024


def validation_details(exc: ValidationError) -> dict[str, Any]:
    """Where and why validation failed. Never the input values: they could be secrets."""
    return {
        "errors": [
            {"loc": ".".join(str(p) for p in err["loc"]), "msg": err["msg"]} for err in exc.errors()[:20]
        ]
    }


def parse_model(model: type[M], body: bytes, *, max_bytes: int = MAX_REQUEST_BYTES) -> M:
    """Decode and validate a JSON body, raising ``PAYLOAD_TOO_LARGE`` or ``INVALID_REQUEST``."""
    if len(body) > max_bytes:
        raise PayloadTooLarge(f"payload of {len(body)} bytes exceeds {max_bytes}", {"limit": max_bytes})
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequest("payload is not valid JSON") from exc
    if not isinstance(data, dict):
        raise InvalidRequest("payload must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(f"invalid {model.__name__}", validation_details(exc)) from exc


def error_reply(exc: BaseException) -> dict[str, Any]:
    """The wire envelope for any exception; unexpected ones become ``INTERNAL`` without detail."""
    if isinstance(exc, EngramError):
        return exc.to_wire()
    log.exception("unexpected error while handling a request", exc_info=exc)
    return Internal("internal error").to_wire()
