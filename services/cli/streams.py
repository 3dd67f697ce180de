"""Reading a JetStream stream from the command line (``engram audit tail``, ``engram dlq``):
an ephemeral pull consumer on the named stream, which is all a reader's NATS identity may
create (it may not look a stream up by subject, nor answer push flow control)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from contracts.nats_connect import connect_nats

__all__ = ["read_stream", "wait_for_signal"]


async def wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def read_stream(
    url: str,
    nats_options: dict[str, Any],
    *,
    subject: str,
    stream: str,
    from_start: bool,
    follow: bool,
    limit: int,
    show: Callable[[Msg], bool],
) -> int:
    """Pass each message to ``show`` (True: it counted) until ``limit`` counted ones (0: no
    limit); without ``follow``, stop once the consumer has nothing pending; with it and no limit,
    at Ctrl-C. Returns how many counted."""
    nc = await connect_nats(url, **nats_options)  # a refused identity fails at once
    seen = 0
    try:
        sub = await nc.jetstream().pull_subscribe(
            subject,
            stream=stream,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.ALL if from_start else DeliverPolicy.NEW,
                ack_policy=AckPolicy.NONE,
            ),
        )
        stop = asyncio.ensure_future(wait_for_signal()) if follow and limit == 0 else None
        while limit == 0 or seen < limit:
            if stop is not None and stop.done():
                break
            try:
                batch = await sub.fetch(100, timeout=0.5)
            except TimeoutError:
                # Caught up is what the server says, not a quiet half second on a busy machine.
                if not follow and (await sub.consumer_info()).num_pending == 0:
                    break
                continue
            for msg in batch:
                seen += show(msg)
                if limit and seen >= limit:
                    break
    finally:
        await nc.close()
    return seen
