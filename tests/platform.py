"""What a platform team would write with a raw nats-py client: JSON bytes and headers, no
Engram code. Integration tests use this rather than ``EngramClient`` on purpose."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import httpx
from nats.aio.client import Client

__all__ = ["eventually", "publish_session", "request", "session_payload", "until_nothing_missing"]


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
    check: Callable[[], Awaitable[bool] | bool],
    *,
    timeout: float = 30.0,
    interval: float = 0.1,
    what: str | Callable[[], str] = "",
) -> None:
    """Poll ``check`` (a coroutine function or a plain condition) until true; fail with ``what``
    if it never is (a bound, not a speed claim). ``what`` may be a function, called at each failed
    look, to say what was seen last (STYLE 22)."""

    async def missing() -> list[str]:
        seen = check()  # a coroutine's answer, or a plain condition's
        if await seen if inspect.isawaitable(seen) else seen:
            return []
        return [what() if callable(what) else "the condition was still false"]

    label = what if isinstance(what, str) and what else repr(check)
    await until_nothing_missing(missing, what=label, timeout=timeout, interval=interval)


async def until_nothing_missing(
    missing: Callable[[], Awaitable[Sequence[str]]],
    *,
    what: str,
    timeout: float,
    interval: float = 0.1,
    transient: tuple[type[BaseException], ...] = (),
) -> None:
    """Poll ``missing`` — what is not there yet, empty once the condition holds — until it is
    empty. A timeout fails naming ``what`` and everything still missing at the last look, so a red
    run says which part never came. A ``transient`` error raised by a look counts as "not yet",
    and is what that look saw (a probe may fail while the thing it probes recovers)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            seen = list(await missing())
        except transient as exc:
            seen = [f"the look itself failed: {type(exc).__name__}: {exc}"]
        if not seen:
            return
        if loop.time() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for: {what}; still missing at the last look:\n  - "
                + "\n  - ".join(seen)
            )
        await asyncio.sleep(interval)


async def save_over_http(http: httpx.AsyncClient, token: str, agent: UUID, text: str) -> str:
    """Save ``text`` for end user alice through the gateway and wait for it; its entry id."""
    reply = await http.post(
        "/v1/memories",
        json={
            "agent_config_id": str(agent),
            "principal": {"kind": "end_user", "id": "alice"},
            "content": text,
            "wait": True,
        },
        headers={"Authorization": f"Bearer {token}"},
    )
    assert reply.status_code == 200, reply.text
    return str(reply.json()["ids"][0])
