"""The one background-worker base (shared/runtime/background.py): a stop lets the loop finish what it
holds, is bounded when the loop does not end, and runs the last flush once."""

from __future__ import annotations

import asyncio

import pytest

from shared.runtime.background import PeriodicWorker, Worker


class Ticks(PeriodicWorker):
    name = "ticks"

    def __init__(self, fail_first: int = 0) -> None:
        super().__init__(interval_s=3600.0)  # only a wake (or the start) makes it tick
        self.retry_s = 0.0
        self.ticks = 0
        self.fail_first = fail_first
        self.ticked = asyncio.Event()
        self.finished_calls = 0

    async def tick(self) -> None:
        self.ticks += 1
        if self.ticks <= self.fail_first:
            raise ConnectionError("the dependency is away")
        self.ticked.set()

    async def finished(self) -> None:
        self.finished_calls += 1


async def test_a_periodic_worker_ticks_when_woken_and_stops_without_waiting_its_interval() -> None:
    worker = Ticks()
    await worker.start()
    await asyncio.wait_for(worker.ticked.wait(), 30)  # the first tick runs at once
    worker.ticked.clear()
    worker.wake()
    await asyncio.wait_for(worker.ticked.wait(), 30)
    assert worker.ticks == 2
    # An hour-long interval: a stop that waited for it would hit the test's timeout.
    await asyncio.wait_for(worker.stop(), 30)
    assert worker.finished_calls == 1
    await worker.stop()  # a second stop is a no-op
    assert worker.finished_calls == 1


async def test_a_failing_tick_is_tried_again() -> None:
    worker = Ticks(fail_first=2)
    await worker.start()
    await asyncio.wait_for(worker.ticked.wait(), 30)
    assert worker.ticks == 3
    await worker.stop()


class Stuck(Worker):
    """A loop that never looks at ``stopping`` (a dependency that never answers)."""

    name = "stuck"
    stop_within_s = 0.01

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = False
        self.flushed = False

    async def run(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    async def finished(self) -> None:
        self.flushed = True


async def test_a_loop_that_does_not_end_is_cancelled_after_the_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = Stuck()
    await worker.start()
    await worker.stop()
    assert worker.cancelled
    assert worker.flushed
    assert "stuck did not stop within" in caplog.text


async def test_a_worker_never_started_stops_at_once() -> None:
    worker = Stuck()
    await worker.stop()
    assert not worker.flushed
