"""How one operation's request is spread over an HTTP request, derived from its request model:
the fields the path names (``/v1/memories/{entry_id}``), and the rest in the JSON body (``POST``,
``PUT``, ``PATCH``) or the query (``GET``, ``DELETE``) — lists as repeated parameters, a principal
as its ref (``end_user:alice``), an object as JSON. The client builds requests with it; the gateway
(``services/gateway/payloads.py``) reads them back with the same shape."""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any, get_args, get_origin
from urllib.parse import quote

from engram_client.contracts.common import Principal
from engram_client.contracts.operations import Operation

__all__ = ["HttpShape"]


def _unwrap(annotation: Any) -> tuple[Any, ...]:
    """The alternatives of ``X | Y | None`` (or just ``X``)."""
    if get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(a for a in get_args(annotation) if a is not type(None))
    return (annotation,)


@dataclass(frozen=True)
class HttpShape:
    op: Operation[Any, Any]
    #: Fields that take several values: repeated query parameters (``?lifecycle=a&lifecycle=b``).
    list_fields: frozenset[str]
    #: Fields holding a principal: ``?principal=end_user:alice`` in a query.
    principal_fields: frozenset[str]
    #: Fields holding a JSON object: in a query, the object as JSON (``?metadata={"k":"v"}``).
    object_fields: frozenset[str]
    #: Whether the request travels in the JSON body (else in the query).
    in_body: bool

    @classmethod
    def of(cls, op: Operation[Any, Any]) -> typing.Self:
        return cls(op, *_classified(op))

    def path(self, payload: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The request's path (its ``{field}`` segments filled from ``payload``) and the fields left."""
        rest = dict(payload)
        path = self.op.http_path
        for name in self.op.path_params:
            path = path.replace("{" + name + "}", quote(str(rest.pop(name, "")), safe=""))
        return path, rest

    def to_query(self, fields: dict[str, Any]) -> list[tuple[str, str]]:
        """Query parameters for ``fields`` (a request model dumped as JSON, ``None`` left out)."""
        params: list[tuple[str, str]] = []
        for key, value in fields.items():
            if value is None:
                continue
            if key in self.list_fields:
                params.extend((key, _scalar(item)) for item in value)
            elif key in self.principal_fields and isinstance(value, dict):
                params.append((key, Principal.model_validate(value).ref))
            elif key in self.object_fields:
                params.append((key, json.dumps(value, separators=(",", ":"))))
            else:
                params.append((key, _scalar(value)))
        return params


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@cache
def _classified(op: Operation[Any, Any]) -> tuple[frozenset[str], frozenset[str], frozenset[str], bool]:
    """The list, principal and object fields of the operation's request, and whether it has a body."""
    fields = op.request.model_fields
    lists = {n for n, f in fields.items() if any(get_origin(a) is list for a in _unwrap(f.annotation))}
    principals = {
        n
        for n, f in fields.items()
        if any(isinstance(a, type) and issubclass(a, Principal) for a in _unwrap(f.annotation))
    }
    objects = {n for n, f in fields.items() if any(get_origin(a) is dict for a in _unwrap(f.annotation))}
    in_body = op.http_method in ("POST", "PUT", "PATCH")
    return frozenset(lists), frozenset(principals), frozenset(objects), in_body
