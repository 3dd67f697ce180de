"""Background loops of the services (outbox relay, recall side effects, retention sweeper)."""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["cancel"]


async def cancel(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` and wait until it has stopped (its ``CancelledError`` is expected)."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
