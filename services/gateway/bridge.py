"""The gateway's NATS side: one connection under the gateway's own NATS identity
(``shared.nats_auth.permissions.gateway_permissions``), over which every HTTP call becomes a
request-reply carrying the caller's ``Authorization`` header. It publishes nothing itself: the
gateway holds no signing keys, so a session is checked by ingest (``engram.session.submit``)
before anything of it is stored."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import nats
from nats.aio.client import Client
from nats.errors import ConnectionClosedError, NoRespondersError, OutboundBufferLimitError
from nats.errors import TimeoutError as NatsTimeout

from contracts.errors import Unavailable
from contracts.operations import OPERATIONS, Operation
from shared.nats_auth.permissions import GATEWAY, service_inbox
from shared.settings import EngramSettings
from shared.tls import client_tls_context

__all__ = ["Bridge"]

log = logging.getLogger(__name__)

#: What a readiness probe waits for one service's answer.
_PROBE_TIMEOUT_S = 2.0
#: NATS failures that mean "try again later", never a bug in the request.
_UNREACHABLE = (NoRespondersError, NatsTimeout, ConnectionClosedError, OutboundBufferLimitError)


class Bridge:
    def __init__(self, nc: Client, *, timeout_s: float) -> None:
        self._nc = nc
        self._timeout_s = timeout_s

    @classmethod
    async def connect(cls, settings: EngramSettings, nkey_seed: str) -> Bridge:
        """Connect as the gateway: ``nkey_seed`` is its NATS identity (empty on an open server);
        replies arrive under ``_INBOX_engram-gateway``, the only subject it may subscribe to."""
        options: dict[str, Any] = {
            "name": "engram-gateway",
            "inbox_prefix": service_inbox(GATEWAY),
            "max_reconnect_attempts": -1,
        }
        if nkey_seed:
            options["nkeys_seed_str"] = nkey_seed
        tls = client_tls_context(
            settings.nats_tls_ca_file, settings.nats_tls_cert_file, settings.nats_tls_key_file
        )
        if tls is not None:
            options["tls"] = tls
        nc = await nats.connect(settings.nats_servers(), **options)
        return cls(nc, timeout_s=settings.http_request_timeout_s)

    async def close(self) -> None:
        if not self._nc.is_closed:
            await self._nc.drain()

    @property
    def nats(self) -> Client:
        """The gateway's NATS connection (the MCP tools at ``/mcp`` send their requests over it)."""
        return self._nc

    @property
    def connected(self) -> bool:
        return bool(self._nc.is_connected)

    async def request(self, op: Operation[Any, Any], payload: bytes, authorization: str) -> bytes:
        """The service's reply bytes (a result or an error envelope), untouched."""
        try:
            reply = await self._nc.request(
                op.subject,
                payload,
                timeout=op.timeout_s or self._timeout_s,
                headers={"Authorization": authorization},
            )
        except NoRespondersError as exc:
            raise Unavailable(f"no service answers {op.name} right now; retry") from exc
        except _UNREACHABLE as exc:
            raise Unavailable(f"{op.name} did not answer in time; retry") from exc
        return bytes(reply.data)

    async def services_answering(self) -> dict[str, bool]:
        """Whether each service answers at all: one anonymous request per queue group, which the
        service refuses (``UNAUTHENTICATED``) — any answer proves it is there."""
        probes = {op.queue_group: op for op in reversed(OPERATIONS)}

        async def answers(op: Operation[Any, Any]) -> bool:
            try:
                await self._nc.request(op.subject, b"{}", timeout=_PROBE_TIMEOUT_S)
            except Exception:
                return False
            return True

        results = await asyncio.gather(*(answers(op) for op in probes.values()))
        return dict(zip(probes, results, strict=True))
