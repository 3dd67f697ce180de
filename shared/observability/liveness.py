"""Which services are running somewhere: each service a process runs answers
``engram.health.<service>`` in that service's queue group for as long as it runs, and
:func:`services_alive` asks. The gateway's ``/readyz`` uses it for every service, distill and
embed too, which serve no request of the operation table and so could not be probed by one
(docs/adr/0057-readiness.md).

The answer is ``{"service": "<name>"}`` and nothing more; a probe needs no token, because only the
gateway's NATS identity may ask (``shared.security.nats_auth.permissions``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from contracts.subjects import health_subject

__all__ = ["LivenessResponder", "services_alive"]


class LivenessResponder:
    """Answers the liveness probes of ``services`` on a connection, from :meth:`start` until
    :meth:`stop` (the runtime stops it first, so a draining process no longer counts)."""

    def __init__(self, services: Sequence[str]) -> None:
        self.services = tuple(services)
        self._subscriptions: list[Subscription] = []

    async def start(self, nc: Client) -> None:
        for service in self.services:
            answer = json.dumps({"service": service}).encode()

            async def respond(msg: Msg, answer: bytes = answer) -> None:
                if msg.reply:
                    await msg.respond(answer)

            self._subscriptions.append(await nc.subscribe(health_subject(service), queue=service, cb=respond))

    async def stop(self) -> None:
        subscriptions, self._subscriptions = self._subscriptions, []
        for sub in subscriptions:
            # A connection already gone has taken its subscriptions with it.
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


async def services_alive(nc: Client, services: Sequence[str], timeout_s: float) -> dict[str, bool]:
    """Whether some instance of each of ``services`` answers its probe within ``timeout_s``."""

    async def answers(service: str) -> bool:
        try:
            await nc.request(health_subject(service), b"", timeout=timeout_s)
        except Exception:  # no responders, a timeout, a closed connection: not there
            return False
        return True

    results = await asyncio.gather(*(answers(service) for service in services))
    return dict(zip(services, results, strict=True))
