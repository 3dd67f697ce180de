"""How the durables pull from JetStream: a long wait for the first message, a short one for company.

FastStream's pull loops fetch with the subscriber's ``timeout`` over and over: a batch consumer's
20 ms window for company made an idle ``engram up`` ask the server for messages ~250 times a
second (5 durables), about a tenth of a core with its NATS server's share (record 0089). Here
each round starts with a lingering pull for one message that the server answers the moment one
is there, or after :data:`IDLE_PULL_S` with nothing; only then does the batch gather company for
the subscriber's ``timeout`` (what FastStream did). A message arriving after idle is taken as fast
as before; an idle durable costs one request every :data:`IDLE_PULL_S`.

A pull outlives a subscriber that stops (or a connection that breaks) on the server until it
expires, but the server hands no message to a pull whose inbox has no subscriber; after a
reconnect a durable resumes within :data:`IDLE_PULL_S`.
"""

from __future__ import annotations

import asyncio
from time import monotonic
from typing import Any

from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError
from nats.js.errors import ServiceUnavailableError

__all__ = ["IDLE_PULL_S", "patch_pull_loops"]

#: How long an idle durable's pull waits on the server for its first message.
IDLE_PULL_S = 5.0
#: A one-at-a-time consumer's wait for more messages once one came (it takes what is there).
_TOP_UP_S = 0.01
#: The pause before asking again when the connection is closed or JetStream is away.
_AWAY_S = 0.5


async def _first(subscription: Any) -> list[Msg]:
    """One message as soon as there is one; none after :data:`IDLE_PULL_S`, or after a short
    pause when the connection is closed or JetStream is away (the loop asks again)."""
    try:
        messages: list[Msg] = await subscription.fetch(batch=1, timeout=IDLE_PULL_S)
    except TimeoutError:
        return []
    except (ConnectionClosedError, ServiceUnavailableError):
        await asyncio.sleep(_AWAY_S)  # these come at once: not a loop spinning until they end
        return []
    return messages


async def _top_up(subscription: Any, messages: list[Msg], batch_size: int, window_s: float) -> list[Msg]:
    """Add what arrives within ``window_s`` until ``batch_size``; a broken connection drops the
    batch (unacknowledged, the server redelivers it)."""
    deadline = monotonic() + window_s
    while len(messages) < batch_size and (remaining := deadline - monotonic()) > 0:
        try:
            messages += await subscription.fetch(batch=batch_size - len(messages), timeout=remaining)
        except TimeoutError:
            break
        except (ConnectionClosedError, ServiceUnavailableError):
            return []
    return messages


async def _consume_batches(self: Any) -> None:
    """``BatchPullStreamSubscriber._consume_pull``: one handler call per batch."""
    batch_size, window_s = self.pull_sub.batch_size, self.pull_sub.timeout
    while self.running:
        messages = await _first(self.subscription)
        if messages:
            messages = await _top_up(self.subscription, messages, batch_size, window_s)
        if messages and self.running:
            await self.consume(messages)


async def _consume_each(self: Any, cb: Any) -> None:
    """``PullStreamSubscriber._consume_pull``: the pulled messages handled concurrently."""
    import anyio

    batch_size = self.pull_sub.batch_size
    while self.running:
        messages = await _first(self.subscription)
        if messages:
            messages = await _top_up(self.subscription, messages, batch_size, _TOP_UP_S)
        if messages:
            async with anyio.create_task_group() as tg:
                for msg in messages:
                    tg.start_soon(cb, msg)


def patch_pull_loops() -> None:
    """Install these loops in FastStream's pull subscribers (0.7.8; replaces theirs, which also
    let nats-py 2.16's builtin ``TimeoutError`` of an empty fetch kill the loop's task)."""
    from faststream.nats.subscriber.usecases import stream_pull_subscriber as pull

    pull.BatchPullStreamSubscriber._consume_pull = _consume_batches  # type: ignore[method-assign]
    pull.PullStreamSubscriber._consume_pull = _consume_each  # type: ignore[method-assign]
