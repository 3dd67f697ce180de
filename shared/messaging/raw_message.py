"""How a subscriber gets FastStream's whole message (headers, raw nats-py ``Msg``) cheaply.

FastStream 0.7's usual way, a parameter annotated ``NatsMessage`` (``Context("message")``), is
resolved by fast_depends as a synchronous custom field, and fast_depends runs those in a worker
thread (``anyio.to_thread``) — a thread hand-over on every message. On this machine that cost
0.3 ms a message under load (docs/benchmarks.md, "2026-12-01 — Recall's hot path"), more than the
bare NATS round trip. A decoder that returns the message itself hands the handler the same object
as its body, on the event loop.

    @router.subscriber(subject, decoder=whole_message)
    async def on_event(body: object) -> None:
        msg = as_message(body)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

from faststream.nats.message import NatsMessage

__all__ = ["as_message", "whole_message"]


async def whole_message(msg: NatsMessage, original: Callable[[NatsMessage], Awaitable[Any]]) -> NatsMessage:
    """A FastStream decoder: the message, undecoded (the handler reads ``body``/``headers``)."""
    return msg


def as_message(body: object) -> NatsMessage:
    """The handler's argument under :func:`whole_message`, typed (FastStream refuses to inject a
    parameter annotated with its message class, so handlers take ``object``)."""
    return cast(NatsMessage, body)
