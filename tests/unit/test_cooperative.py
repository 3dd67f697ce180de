"""TimeSlice: a long loop on the event loop lets other tasks run once per slice, and only then."""

from __future__ import annotations

import asyncio
import time

from shared.runtime.cooperative import TimeSlice


async def _count_turns_of_another_task(slicer: TimeSlice, *, until: int, at_most: int) -> int:
    """Call ``slicer.turn()`` in a loop (``at_most`` times, or until the other task ran ``until``
    times); how often the other task ran meanwhile."""
    ran = 0

    async def other() -> None:
        nonlocal ran
        while True:
            ran += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    ran = 0
    try:
        for _ in range(at_most):
            if ran >= until:
                break
            time.sleep(0.0005)  # an item's synchronous work
            await slicer.turn()
    finally:
        task.cancel()
    return ran


async def test_a_long_loop_hands_the_event_loop_over_once_a_slice_is_used() -> None:
    assert await _count_turns_of_another_task(TimeSlice(0.001), until=3, at_most=10_000) >= 3


async def test_within_a_slice_the_loop_keeps_the_event_loop() -> None:
    assert await _count_turns_of_another_task(TimeSlice(3_600), until=1, at_most=200) == 0
