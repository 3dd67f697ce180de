"""HTTP request → the operation's NATS payload, generated from the request model: query
parameters (``GET``, ``DELETE``) or the JSON body (``POST``, ``PUT``, ``PATCH``), plus the fields
the path names (``/v1/memories/{entry_id}``). Values pass as the caller wrote them; the service
validates them against the model, exactly as on NATS."""

from __future__ import annotations

import re
import sys
import typing
from dataclasses import dataclass
from typing import Any, get_args, get_origin

from engram_client.http_shape import HttpShape, _unwrap
from pydantic import BaseModel

from contracts.errors import InvalidRequest, PayloadTooLarge
from contracts.json_rules import decode_json

__all__ = ["Shape", "decode_object", "read_limited"]


@dataclass(frozen=True)
class Shape(HttpShape):
    """How one operation's request is spread over the HTTP request (``engram_client.http_shape``,
    the same shape the client builds requests with), read back into the NATS payload."""

    @property
    def query_fields(self) -> dict[str, Any]:
        """The request model's fields a query may carry (documents list them as parameters)."""
        model: type[BaseModel] = self.op.request
        return {n: f for n, f in model.model_fields.items() if n not in self.op.path_params}

    def from_query(self, items: list[tuple[str, str]], path: dict[str, str]) -> dict[str, Any]:
        payload: dict[str, Any] = {}
        for key, value in items:
            if key in self.op.path_params:
                raise InvalidRequest(f"{key} is given by the path, not the query")
            if key in self.list_fields:
                payload.setdefault(key, []).append(value)
            elif key in payload:
                raise InvalidRequest(f"query parameter {key} is given more than once")
            elif key in self.principal_fields:
                kind, _, ident = value.partition(":")
                payload[key] = {"kind": kind, "id": ident or None}
            elif key in self.object_fields:
                payload[key] = _json_query_value(key, value)
            else:
                field = self.op.request.model_fields.get(key)
                payload[key] = value if field is None else _scalar(field.annotation, value)
        return {**payload, **path}

    def with_path(self, body: dict[str, Any], path: dict[str, str]) -> dict[str, Any]:
        for key, value in path.items():
            if key in body and str(body[key]) != value:
                raise InvalidRequest(f"{key} in the body differs from the path")
        return {**body, **path}


_INTEGER = re.compile(r"-?[0-9]+")
_MAX_DIGITS = sys.get_int_max_str_digits() or 4300
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")


def _scalar(annotation: Any, value: str) -> Any:
    """A query value as the JSON its field takes (services validate strictly: ``"5"`` is not a
    number): an integer or number as written in JSON, ``true``/``false``; anything else, and a
    value that is not what its field takes, stays the string, for the service to refuse."""
    kinds = {get_args(a)[0] if get_origin(a) is typing.Annotated else a for a in _unwrap(annotation)}
    # Python converts at most ``sys.get_int_max_str_digits()`` digits (a plain ValueError past
    # them): a longer integer stays the string, which its field refuses.
    if int in kinds and _INTEGER.fullmatch(value) and len(value) <= _MAX_DIGITS:
        return int(value)
    if float in kinds and _NUMBER.fullmatch(value):
        return float(value)
    if bool in kinds and value in ("true", "false"):
        return value == "true"
    return value


def _json_query_value(key: str, value: str) -> Any:
    try:
        return decode_json(value)
    except InvalidRequest as exc:
        raise InvalidRequest(f"query parameter {key} must be a JSON object: {exc.message}") from exc


def decode_object(body: bytes) -> dict[str, Any]:
    """A JSON object from a request body (an empty body is ``{}``), refused as the services refuse
    it (``shared.messaging.wire.decode_json``: not JSON, nested too deep, text no store can keep)."""
    if not body.strip():
        return {}
    data = decode_json(body)
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object")
    return data


async def read_limited(chunks: typing.AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
    """The whole body, refusing (``PAYLOAD_TOO_LARGE``) more than ``limit`` bytes — by the declared
    length before reading anything, else as soon as the stream passes the limit."""
    too_large = PayloadTooLarge(f"the body exceeds {limit} bytes", {"limit": limit})
    if declared is not None:
        try:
            length = int(declared)
        except ValueError as exc:
            raise InvalidRequest("Content-Length is not a number") from exc
        if length > limit:
            raise too_large
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)
