"""Background loops of the services (outbox relay, recall side effects, retention sweeper, embed's
pipeline, the Qdrant Edge maintainer): one :class:`Worker` base owns their start and their stop.

A stop is cooperative and bounded: the loop is told to stop (and woken), may finish what it holds
for up to ``stop_within_s``, and is cancelled after that — a stuck dependency never holds a
shutdown hostage. :meth:`Worker.finished` then runs once (a last flush)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod

__all__ = ["PeriodicWorker", "Worker", "cancel"]

log = logging.getLogger(__name__)


async def cancel(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` and wait until it has stopped (its ``CancelledError`` is expected)."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class Worker(ABC):
    """One background task: :meth:`start` runs :meth:`run`, :meth:`stop` ends it within a bound."""

    #: The task's name (in task dumps and log lines).
    name = "worker"
    #: How long :meth:`stop` lets the loop finish what it holds before cancelling it.
    stop_within_s = 10.0

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def start(self) -> None:
        self._stopping.clear()
        self._task = asyncio.create_task(self.run(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping.set()
        try:
            await asyncio.wait_for(self._finish(task), self.stop_within_s)
        except TimeoutError:
            log.warning("%s did not stop within %.0f s; cancelled", self.name, self.stop_within_s)
        await cancel(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s ended with an error", self.name, exc_info=task.exception())
        await self.finished()

    async def _finish(self, task: asyncio.Task[None]) -> None:
        await self.request_stop()
        await asyncio.wait({task})

    async def request_stop(self) -> None:  # noqa: B027 (a hook; most loops need nothing)
        """Tell the loop to end (``stopping`` is already set): wake it where it waits."""

    async def finished(self) -> None:  # noqa: B027 (a hook; most loops owe nothing)
        """After the loop has ended: what a clean shutdown still owes (a last flush)."""

    @abstractmethod
    async def run(self) -> None:
        """The loop; returns once ``stopping`` is set (or is cancelled after the bound)."""


class PeriodicWorker(Worker):
    """A loop that runs :meth:`tick` every ``interval_s`` (``None``: only when woken), sooner when
    :meth:`wake` is called. A failing tick is logged and tried again after ``retry_s`` (its
    dependency may be away)."""

    retry_s = 1.0

    def __init__(self, interval_s: float | None) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def request_stop(self) -> None:
        self._wake.set()

    @abstractmethod
    async def tick(self) -> None: ...

    async def run(self) -> None:
        while not self.stopping:
            try:
                await self.tick()
            except Exception:
                log.warning("%s failed; retrying", self.name, exc_info=True)
                await self._pause(self.retry_s)
                continue
            await self._pause(self.interval_s)

    async def _pause(self, seconds: float | None) -> None:
        """Wait ``seconds`` (``None``: no limit), or until woken or told to stop."""
        if self.stopping:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        self._wake.clear()
