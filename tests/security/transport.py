"""How an attack reaches Engram: a ``Send`` takes a subject, the request body and a bearer token
and returns the reply as a NATS caller would read it. :func:`over_nats` sends it over NATS;
:class:`OverHttp` sends the same request through the HTTP gateway (the operation table's route
for the subject), so each attack of the suite runs unchanged over both interfaces."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import httpx
from nats.aio.client import Client

from contracts.operations import MEMORY_EXPORT, by_subject
from tests.platform import request

__all__ = ["OverHttp", "Send", "over_nats"]

Send = Callable[[str, dict[str, Any], str | None], Awaitable[dict[str, Any]]]


def over_nats(nc: Client) -> Send:
    async def send(subject: str, body: dict[str, Any], token: str | None) -> dict[str, Any]:
        return await request(nc, subject, body, token)

    return send


def _query_value(key: str, value: Any) -> str:
    """A body value as a query string value (the gateway's reading of it is the inverse)."""
    if key == "principal" and isinstance(value, dict):
        ident = value.get("id")
        return str(value.get("kind")) if ident is None else f"{value.get('kind')}:{ident}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


class OverHttp:
    """``Send`` through the gateway. Every reply is also checked as HTTP: an error's HTTP status
    is the envelope's (``status_mismatches``), and no answer is a 5xx but a named outage
    (``server_errors``)."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.requests = 0
        self.status_mismatches: list[str] = []
        self.server_errors: list[str] = []

    async def __call__(self, subject: str, body: dict[str, Any], token: str | None) -> dict[str, Any]:
        return await self.with_headers(
            subject, body, {"Authorization": f"Bearer {token}"} if token is not None else {}
        )

    async def with_headers(
        self, subject: str, body: dict[str, Any], headers: dict[str, str]
    ) -> dict[str, Any]:
        """The request with exactly these headers (an attacker's Authorization header as it is)."""
        op = by_subject(subject)
        rest = dict(body)
        path = op.http_path
        for name in op.path_params:
            path = path.replace("{" + name + "}", quote(str(rest.pop(name, "")), safe=""))
        if op.http_method in ("GET", "DELETE"):
            params = [
                (key, _query_value(key, item))
                for key, value in rest.items()
                if value is not None
                for item in (value if isinstance(value, list) else [value])
            ]
            reply = await self.http.request(op.http_method, path, params=params, headers=headers)
        else:
            reply = await self.http.request(op.http_method, path, json=rest, headers=headers)
        self.requests += 1
        data = self._decode(op is MEMORY_EXPORT, reply)
        self._check(subject, reply.status_code, data)
        return data

    @staticmethod
    def _decode(export: bool, reply: httpx.Response) -> dict[str, Any]:
        if export and reply.status_code == 200:
            # JSON Lines: every entry of every page; an error on a later page is the last line.
            lines = [json.loads(line) for line in reply.text.splitlines() if line.strip()]
            if lines and "error" in lines[-1]:
                return dict(lines[-1])
            return {"entries": lines, "next_page_token": None}
        data: dict[str, Any] = reply.json()
        return data

    def _check(self, subject: str, status: int, data: dict[str, Any]) -> None:
        error = data.get("error")
        if status >= 500 and (not isinstance(error, dict) or error.get("code") == "INTERNAL"):
            self.server_errors.append(f"{subject}: {status} {str(data)[:160]}")
        if isinstance(error, dict) and error.get("status") != status:
            self.status_mismatches.append(f"{subject}: HTTP {status}, envelope {error.get('status')}")
        if not isinstance(error, dict) and status not in (200, 202):
            self.status_mismatches.append(f"{subject}: HTTP {status} without an error envelope")
