"""Long loops on the event loop give other work a turn: :class:`TimeSlice`.

``engram up`` runs every service on one event loop, so a batch handler that loops over hundreds
of items without awaiting holds every request-reply caller for the whole loop: under 5x overload
distill's save path (a batch of 100 sessions: PII and injection checks, row and event building)
held recall for 0.3-2 s at a time on the 2-core test machine. Awaiting ``TimeSlice.turn()`` in
such a loop hands the event loop over once a slice has been used, so a waiting recall answers in
between; the batch itself stays one transaction. Measured in docs/benchmarks.md,
"2026-12-01 — Overload before and after".
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["TimeSlice"]


class TimeSlice:
    """Call :meth:`turn` once per item of a long synchronous loop; it yields to the event loop
    after every ``slice_s`` of work (never in between: each yield costs a round of the loop)."""

    def __init__(self, slice_s: float = 0.005) -> None:
        self._slice_s = slice_s
        self._since = time.perf_counter()

    async def turn(self) -> None:
        if time.perf_counter() - self._since >= self._slice_s:
            await asyncio.sleep(0)
            self._since = time.perf_counter()
