"""What a platform team would write with a raw nats-py client: JSON bytes and headers, no
Engram code. Integration tests use this rather than ``EngramClient`` on purpose."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

from nats.aio.client import Client

__all__ = ["eventually", "publish_session", "request", "session_payload"]


def session_payload(org_id: UUID, agent_config_id: UUID, **overrides: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "event_id": str(uuid4()),
        "schema_version": 1,
        "org_id": str(org_id),
        "agent_config_id": str(agent_config_id),
        "session_id": f"s-{uuid4().hex[:8]}",
        "status": "failed",
        "principal": {"kind": "end_user", "id": "alice"},
        "steps": 3,
        "task": "Ship the release",
        "tool_trace": [],
        "ended_at": datetime.now(UTC).isoformat(),
    }
    payload.update(overrides)
    return payload


async def publish_session(
    nc: Client, payload: dict[str, Any] | bytes, token: str | None, *, msg_id: str | None = None
) -> None:
    """As the README publishes: the token in ``Authorization``, no ``Nats-Msg-Id`` (ingest takes
    each organization's event once); ``msg_id`` sets one anyway, as a publisher may."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers: dict[str, str] = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if msg_id is not None:
        headers["Nats-Msg-Id"] = msg_id
    await nc.jetstream().publish("engram.session.ended", body, headers=headers or None)


async def request(
    nc: Client, subject: str, payload: dict[str, Any] | bytes, token: str | None, timeout: float = 10.0
) -> dict[str, Any]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload, default=str).encode()
    headers = {"Authorization": f"Bearer {token}"} if token is not None else None
    reply = await nc.request(subject, body, timeout=timeout, headers=headers)
    data: dict[str, Any] = json.loads(reply.data)
    return data


async def eventually(
    check: Callable[[], Awaitable[bool]], *, timeout: float = 30.0, interval: float = 0.1, what: str = ""
) -> None:
    """Poll ``check`` until true; fail with ``what`` if it never is (a bound, not a speed claim)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await check():
            return
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for: {what or check}")
