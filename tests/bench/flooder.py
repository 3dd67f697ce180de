"""The noisy neighbour's flooding organization, in a process of its own.

``python -m tests.bench.flooder SPEC.json``: connects, prints ``ready``, then sends recalls and
publishes sessions at their rates for the phase (open loop: a slow answer does not slow the
arrivals) and prints what it got back as one JSON line. A client is not the service: in the
services' process the flood's own request handling would share their event loop and be counted
as theirs. It imports nothing of Engram's, so it starts in a moment; it stops by itself (every
request has a timeout, the phase a length).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import nats
from nats.aio.client import Client

RECALL = "engram.recall"


async def recall(
    nc: Client, token: str, agent: str, cue: str, timeout: float, strategy: str
) -> tuple[str, float]:
    """One recall: its answer's code (``OK``, an error code, ``TIMEOUT``) and milliseconds."""
    body = json.dumps({"agent_config_id": agent, "strategy": strategy, "cue": cue}).encode()
    started = time.perf_counter()
    try:
        reply = await nc.request(RECALL, body, headers={"Authorization": f"Bearer {token}"}, timeout=timeout)
    except TimeoutError:
        return "TIMEOUT", (time.perf_counter() - started) * 1000
    data = json.loads(reply.data)
    code = data["error"]["code"] if "error" in data else "OK"
    return code, (time.perf_counter() - started) * 1000


async def publish(nc: Client, token: str, payload: dict[str, Any]) -> float:
    """Publish one ``session.ended`` to JetStream; when it was sent (``perf_counter``)."""
    sent = time.perf_counter()
    await nc.jetstream().publish(
        "engram.session.ended",
        json.dumps(payload).encode(),
        headers={"Authorization": f"Bearer {token}", "Nats-Msg-Id": payload["event_id"]},
    )
    return sent


async def paced(rate: float, seconds: float, one: Callable[[int], Awaitable[Any]]) -> list[Any]:
    """Start ``one(i)`` ``rate`` times a second for ``seconds`` (open loop), and gather what
    they return."""
    tasks: list[asyncio.Future[Any]] = []
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(i)))
    return list(await asyncio.gather(*tasks))


async def flood(spec: dict[str, Any]) -> dict[str, Any]:
    nc = await nats.connect(spec["nats_url"])
    print("ready", flush=True)
    recalls: Counter[str] = Counter()
    published = 0
    sessions = spec["sessions"]

    async def a_recall(i: int) -> None:
        token, agent, timeout = spec["token"], spec["agent"], spec["timeout"]
        code, _ = await recall(nc, token, agent, f"topic {i}", timeout, spec["strategy"])
        recalls[code] += 1

    async def a_session(i: int) -> None:
        nonlocal published
        await publish(nc, spec["token"], sessions[i])
        published += 1

    try:
        await asyncio.gather(
            paced(spec["recall_rate"], spec["seconds"], a_recall),
            paced(len(sessions) / spec["seconds"], spec["seconds"], a_session),
        )
    finally:
        await nc.drain()
    return {"recalls": dict(recalls), "sessions_published": published}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(json.dumps(asyncio.run(flood(json.load(f)))), flush=True)
