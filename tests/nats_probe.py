"""Asking a nats-server what it allows: an operation is refused when the server answers it with
``-ERR 'Permissions Violation …'``, which nats-py hands to the error callback (the connection
stays open). To decide "allowed" without waiting for an error that never comes, each operation
is followed by a publish no test user may make (a barrier): the server answers in order, so once
the barrier's error has arrived, whatever the operation caused has arrived before it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

import nats
from nats.aio.client import Client

__all__ = ["Probe", "cannot_connect", "quiet"]


@dataclass
class Probe:
    """One user's connection and the permission errors the server sent it, in order."""

    nc: Client
    errors: list[str] = field(default_factory=list)

    @classmethod
    async def connect(cls, url: str, name: str, **options: Any) -> Probe:
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(url, name=name, error_cb=on_error, allow_reconnect=False, **options)
        return cls(nc, errors)

    async def refused(self, kind: str, subject: str, op: Callable[[], Awaitable[Any]]) -> bool:
        """Run ``op`` and tell whether the server refused it (``kind``: publish | subscription)."""
        start = len(self.errors)
        await op()
        barrier = f"zz.barrier.{uuid4().hex}"
        await self.nc.publish(barrier, b"")
        await self.nc.flush()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while not any(barrier in e for e in self.errors[start:]):
            assert loop.time() < deadline, f"the barrier publish was not refused: {self.errors[start:]}"
            await asyncio.sleep(0.002)
        seen = self.errors[start:]
        seen = seen[: next(i for i, e in enumerate(seen) if barrier in e)]
        # nats-py lower-cases the server's message.
        mine = f'permissions violation for {kind} to "{subject.lower()}"'
        unrelated = [e for e in seen if mine not in e]
        assert not unrelated, f"unexpected errors after {kind} {subject}: {unrelated}"
        return bool(seen)

    async def publish_refused(
        self, subject: str, data: bytes = b"", headers: dict[str, str] | None = None
    ) -> bool:
        return await self.refused("publish", subject, lambda: self.nc.publish(subject, data, headers=headers))

    async def subscribe_refused(self, subject: str, queue: str | None) -> bool:
        subs = []

        async def subscribe() -> None:
            subs.append(await self.nc.subscribe(subject, queue=queue or ""))

        refused = await self.refused("subscription", subject, subscribe)
        for sub in subs:
            await sub.unsubscribe()
        return refused


async def quiet(exc: Exception) -> None:
    """A refused login is the expected outcome here; nats-py's default callback would log it."""


async def cannot_connect(url: str, **options: Any) -> bool:
    try:
        nc = await nats.connect(url, allow_reconnect=False, connect_timeout=5, error_cb=quiet, **options)
    except Exception as exc:  # nats-py raises a plain Error for 'Authorization Violation'
        return "authorization violation" in str(exc).lower()
    await nc.close()
    return False
