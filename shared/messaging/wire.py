"""Turning bytes from the wire into typed models and errors into the SPEC 9 envelope."""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from asyncpg.exceptions import (
    AdminShutdownError,
    CannotConnectNowError,
    CrashShutdownError,
    InsufficientResourcesError,
    PostgresConnectionError,
    TooManyConnectionsError,
)
from asyncpg.exceptions import InterfaceError as AsyncpgInterfaceError
from nats import errors as nats_errors
from nats.js import errors as js_errors
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from contracts.errors import (
    EngramError,
    Internal,
    InvalidRequest,
    PayloadTooLarge,
    Unavailable,
    validation_details,
)
from contracts.json_rules import decode_json
from contracts.operations import MAX_REQUEST_BYTES

__all__ = ["MAX_REQUEST_BYTES", "dependency_down", "error_reply", "parse_model", "validation_details"]

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


def parse_model(model: type[M], body: bytes, *, max_bytes: int = MAX_REQUEST_BYTES) -> M:
    """Decode and validate a JSON body, raising ``PAYLOAD_TOO_LARGE`` or ``INVALID_REQUEST`` (also
    for JSON nested too deep and text no store can keep: ``contracts.json_rules``)."""
    if len(body) > max_bytes:
        raise PayloadTooLarge(f"payload of {len(body)} bytes exceeds {max_bytes}", {"limit": max_bytes})
    data = decode_json(body)
    if not isinstance(data, dict):
        raise InvalidRequest("payload must be a JSON object")
    try:
        # Strictly, as the documents state each field: a number is not a string, a boolean not a
        # number (``"wait": 1``, ``"max_entries": false`` were taken as ``true`` and ``0``). JSON
        # strings still carry UUIDs and times (docs/adr/0096-request-bounds.md).
        return model.model_validate_json(body, strict=True)
    except ValidationError as exc:
        raise InvalidRequest(f"invalid {model.__name__}", validation_details(exc)) from exc


#: What asyncpg raises while Postgres restarts: refusing connections while it starts or stops,
#: and the connections a fast shutdown terminates; and while it is out of a resource (SQLSTATE
#: class 53: its disk full — "could not extend file" —, its memory, its connection slots): the
#: statement was rolled back whole, and succeeds again once the resource is back.
_POSTGRES_GOING = (
    AdminShutdownError,
    CannotConnectNowError,
    CrashShutdownError,  # a backend crashed and the postmaster restarts the others
    PostgresConnectionError,
    InsufficientResourcesError,  # 53xxx: DiskFullError, OutOfMemoryError, TooManyConnectionsError
    TooManyConnectionsError,  # every slot taken while reconnecting after a restart
    PoolTimeout,  # no pooled connection came back in time: the server is not answering
)

#: What nats-py raises while the server is away or reconnecting, or JetStream has no leader yet.
_NATS_AWAY = (
    nats_errors.ConnectionClosedError,
    nats_errors.ConnectionDrainingError,
    nats_errors.ConnectionReconnectingError,
    nats_errors.NoServersError,
    nats_errors.StaleConnectionError,
    nats_errors.OutboundBufferLimitError,
    nats_errors.NoRespondersError,
    js_errors.ServiceUnavailableError,
    js_errors.NoStreamResponseError,
)


def _closed_connection(exc: BaseException) -> bool:
    """asyncpg's "connection is closed" (a pooled connection the restart cut, used before the
    pool noticed); its other interface errors are misuse, i.e. bugs."""
    return isinstance(exc, AsyncpgInterfaceError) and "connection is closed" in str(exc)


def dependency_down(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a store being unreachable right now — Postgres
    restarting, a dropped connection, its disk full, NATS reconnecting or JetStream out of storage
    (``insufficient resources``: a 503 API error) — rather than a bug: the caller may retry."""
    seen: BaseException | None = exc
    for _ in range(8):  # the cause chain, bounded
        if seen is None:
            return False
        if isinstance(seen, (ConnectionError, TimeoutError, *_POSTGRES_GOING, *_NATS_AWAY)):
            return True
        if _closed_connection(seen):
            return True
        if isinstance(seen, DBAPIError):
            if seen.connection_invalidated:
                return True
            seen = seen.orig  # the driver's own exception
            continue
        seen = seen.__cause__ or seen.__context__
    return False


def error_reply(exc: BaseException) -> dict[str, Any]:
    """The wire envelope for any exception: an outage of a store becomes ``UNAVAILABLE`` (503,
    retryable), anything else unexpected ``INTERNAL`` without detail."""
    if isinstance(exc, EngramError):
        return exc.to_wire()
    if dependency_down(exc):
        log.warning("a store is unreachable; answered UNAVAILABLE: %s", type(exc).__name__)
        return Unavailable("a store Engram depends on is unavailable; retry").to_wire()
    log.exception("unexpected error while handling a request", exc_info=exc)
    return Internal("internal error").to_wire()
