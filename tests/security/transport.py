"""How an attack reaches Engram. An :class:`Interface` sends a request — subject, body, bearer
token (or raw headers) — and returns the reply as a NATS caller would read it (the SPEC 9 envelope
on errors); it also publishes sessions. :class:`OverNats` sends over NATS; :class:`OverHttp` sends
the same request through the HTTP gateway (the operation table's route for the subject). The
``interface`` fixture (``tests/security/conftest.py``) runs each attack of the suite once per
interface, unchanged: the gateway adds transport, never rules, so the counts must be the same
zeros. Sessions differ in when they are judged: a JetStream publish is stored first and checked by
ingest after; ``POST /v1/sessions`` (``engram.session.submit``) is checked before it is stored."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx
from nats.aio.client import Client

from contracts.operations import MEMORY_EXPORT, SESSION_SUBMIT, by_subject
from tests.platform import publish_session

__all__ = ["INTERFACES", "Interface", "OverHttp", "OverNats", "query_value"]

#: The interfaces every attack runs through (the ``interface`` fixture's parameters).
INTERFACES = ("nats", "http")


class Interface:
    """One way in. ``await interface(subject, body, token)`` is one request; ``name`` tells the
    interfaces apart in test ids and report names."""

    name = ""
    #: Whether a session whose token or tenancy does not pass is refused before it is stored
    #: (rather than stored, then dead-lettered).
    checks_sessions_first = False

    def __init__(self) -> None:
        self.requests = 0

    async def __call__(self, subject: str, body: dict[str, Any], token: str | None) -> dict[str, Any]:
        return await self.with_headers(
            subject, body, {"Authorization": f"Bearer {token}"} if token is not None else {}
        )

    async def with_headers(
        self, subject: str, body: dict[str, Any], headers: dict[str, str]
    ) -> dict[str, Any]:
        """The request with exactly these headers (an attacker's Authorization header as it is)."""
        raise NotImplementedError

    async def publish_session(self, payload: dict[str, Any], token: str | None) -> bool:
        """Publish ``engram.session.ended``; whether it was taken in for processing."""
        raise NotImplementedError

    def label(self, attack: str) -> str:
        """The attack's report name on this interface (NATS's names are the bare ones)."""
        return attack if self.name == "nats" else f"{self.name}-{attack}"

    def counts(self) -> dict[str, Any]:
        """What the interface itself found, for the attack's report."""
        return {}

    def problems(self) -> list[str]:
        """What the interface found wrong (asserted empty after each test)."""
        return []


class OverNats(Interface):
    name = "nats"

    def __init__(self, nc: Client) -> None:
        super().__init__()
        self.nc = nc

    async def with_headers(
        self, subject: str, body: dict[str, Any], headers: dict[str, str]
    ) -> dict[str, Any]:
        self.requests += 1
        reply = await self.nc.request(
            subject, json.dumps(body, default=str).encode(), timeout=10, headers=headers or None
        )
        data: dict[str, Any] = json.loads(reply.data)
        return data

    async def publish_session(self, payload: dict[str, Any], token: str | None) -> bool:
        await publish_session(self.nc, payload, token)  # JetStream acknowledged it
        return True


def query_value(key: str, value: Any) -> str:
    """A body value as a query string value (the gateway's reading of it is the inverse)."""
    if key == "principal" and isinstance(value, dict):
        ident = value.get("id")
        return str(value.get("kind")) if ident is None else f"{value.get('kind')}:{ident}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


class OverHttp(Interface):
    """Through the gateway. Every reply is also checked as HTTP: an error's HTTP status is the
    envelope's (``status_mismatches``), and no answer is a 5xx but a named outage
    (``server_errors``)."""

    name = "http"
    checks_sessions_first = True

    def __init__(self, http: httpx.AsyncClient) -> None:
        super().__init__()
        self.http = http
        self.status_mismatches: list[str] = []
        self.server_errors: list[str] = []

    async def with_headers(
        self, subject: str, body: dict[str, Any], headers: dict[str, str]
    ) -> dict[str, Any]:
        # An HTTP field value carries no surrounding whitespace (RFC 9110 5.5; httpx refuses it):
        # ``Bearer `` arrives as ``Bearer``.
        headers = {key: value.strip() for key, value in headers.items()}
        op = by_subject(subject)
        rest = dict(body)
        path = op.http_path
        for name in op.path_params:
            path = path.replace("{" + name + "}", quote(str(rest.pop(name, "")), safe=""))
        if op.http_method in ("GET", "DELETE"):
            params = [
                (key, query_value(key, item))
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

    async def publish_session(self, payload: dict[str, Any], token: str | None) -> bool:
        """POST /v1/sessions: ingest checks the token and the session first, so a forged, foreign
        or missing token is refused (401, 403) and nothing is stored; a good one is taken (202)."""
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        reply = await self.http.post(
            SESSION_SUBMIT.http_path, content=json.dumps(payload, default=str), headers=headers
        )
        self.requests += 1
        self._check(SESSION_SUBMIT.subject, reply.status_code, reply.json())
        return reply.status_code == 202

    def counts(self) -> dict[str, Any]:
        return {
            "http_requests": self.requests,
            "status_mismatches": len(self.status_mismatches),
            "server_errors": len(self.server_errors),
            "http_problems": self.problems()[:10],
        }

    def problems(self) -> list[str]:
        return self.status_mismatches + self.server_errors

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
