"""A webhook receiver for tests: a small HTTP/1.1 server on 127.0.0.1 that verifies every request
with the ``standardwebhooks`` library (as a tenant's receiver would) and records what it got.

Each path is one endpoint (``/a``, ``/b`` …) with its own secret (set after registration) and its
own behaviour: answer 2xx, fail the first ``fail_first`` attempts of every event, or fail all."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

__all__ = ["Endpoint", "Receiver", "webhook_receiver"]


@dataclass
class Endpoint:
    secret: str = ""
    #: Fail (HTTP 503) the first this-many attempts of each webhook-id.
    fail_first: int = 0
    fail_all: bool = False
    #: Verified deliveries: the parsed body, with the headers (``_headers``), bytes (``_body``) and
    #: arrival (``_at``, ``time.perf_counter()``).
    received: list[dict[str, Any]] = field(default_factory=list)
    #: Attempts per webhook-id (failed ones included).
    attempts: dict[str, int] = field(default_factory=dict)
    #: Requests whose signature did not verify.
    forged: int = 0

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.received if kind is None or r["type"] == kind]


class Receiver:
    def __init__(self) -> None:
        self.endpoints: dict[str, Endpoint] = {}
        self.port = 0

    def url(self, path: str) -> str:
        self.endpoints.setdefault(path, Endpoint())
        return f"http://127.0.0.1:{self.port}{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in lines:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                status = self._handle(request_line.split(" ")[1], headers, body)
                writer.write(f"HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n".encode())
                await writer.drain()
        writer.close()

    def _handle(self, path: str, headers: dict[str, str], body: bytes) -> int:
        endpoint = self.endpoints.get(path)
        if endpoint is None:
            return 404
        msg_id = headers.get("webhook-id", "")
        endpoint.attempts[msg_id] = endpoint.attempts.get(msg_id, 0) + 1
        if endpoint.fail_all or endpoint.attempts[msg_id] <= endpoint.fail_first:
            return 503
        try:
            payload = Webhook(endpoint.secret).verify(body, headers)
        except WebhookVerificationError:
            endpoint.forged += 1
            return 401
        endpoint.received.append({**payload, "_headers": headers, "_body": body, "_at": time.perf_counter()})
        return 204


@asynccontextmanager
async def webhook_receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    server = await asyncio.start_server(receiver._serve, "127.0.0.1", 0)
    receiver.port = server.sockets[0].getsockname()[1]
    try:
        yield receiver
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2.0)
