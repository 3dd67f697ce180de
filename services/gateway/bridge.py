"""The gateway's NATS side: one connection under the gateway's own NATS identity
(``shared.security.nats_auth.permissions.gateway_permissions``), over which every HTTP call becomes a
request-reply carrying the caller's ``Authorization`` header. It publishes nothing itself: the
gateway holds no signing keys, so a session is checked by ingest (``engram.session.submit``)
before anything of it is stored."""

from __future__ import annotations

import logging
import time
from typing import Any

import nats
from nats.aio.client import Client
from nats.errors import ConnectionClosedError, NoRespondersError, OutboundBufferLimitError
from nats.errors import TimeoutError as NatsTimeout

from contracts.errors import Unavailable
from contracts.operations import Operation
from shared.observability.liveness import services_alive
from shared.runtime.settings import EngramSettings
from shared.security.nats_auth.permissions import GATEWAY, SERVICES, service_inbox
from shared.security.tls import client_tls_context

__all__ = ["Bridge"]

log = logging.getLogger(__name__)

#: What a readiness probe waits for one service's answer.
_PROBE_TIMEOUT_S = 2.0
#: A service that answered one of this gateway's requests this recently, and has failed none
#: since, is answering: readiness needs no probe of it (Kubernetes probes every 5 s).
_ANSWERED_RECENTLY_S = 5.0
#: NATS failures that mean "try again later", never a bug in the request.
_UNREACHABLE = (NoRespondersError, NatsTimeout, ConnectionClosedError, OutboundBufferLimitError)


class Bridge:
    def __init__(self, nc: Client, *, timeout_s: float) -> None:
        self._nc = nc
        self._timeout_s = timeout_s
        #: Per queue group, when its service last answered this gateway, and last failed to.
        self._answered_at: dict[str, float] = {}
        self._failed_at: dict[str, float] = {}

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
            self._note(op.queue_group, answered=False)
            raise Unavailable(f"no service answers {op.name} right now; retry") from exc
        except _UNREACHABLE as exc:
            self._note(op.queue_group, answered=False)
            raise Unavailable(f"{op.name} did not answer in time; retry") from exc
        self._note(op.queue_group, answered=True)
        return bytes(reply.data)

    async def services_running(self) -> dict[str, bool]:
        """Whether some instance of each service runs. A service that answered one of this
        gateway's requests in the last few seconds, and failed none since, runs — its probe would
        only wait behind its work on a starved machine while it answers every request. The others
        are asked their liveness probe (``shared.observability.liveness``; distill and embed serve no
        request)."""
        running = {service: self._answered_recently(service) for service in SERVICES}
        ask = [service for service, known in running.items() if not known]
        if ask:
            running |= await services_alive(self._nc, ask, _PROBE_TIMEOUT_S)
        return running

    def _note(self, group: str, *, answered: bool) -> None:
        (self._answered_at if answered else self._failed_at)[group] = time.monotonic()

    def _answered_recently(self, group: str) -> bool:
        answered = self._answered_at.get(group)
        if answered is None or answered < self._failed_at.get(group, 0.0):
            return False
        return time.monotonic() - answered < _ANSWERED_RECENTLY_S
