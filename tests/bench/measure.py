"""What every benchmark shares: percentile summaries and the yardstick — the bare NATS
request-reply round trip, measured on the same server in the same run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from nats.aio.client import Client
from nats.aio.msg import Msg

__all__ = ["nats_round_trip", "summary"]


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(ms: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(ms),
        "p50_ms": round(_pct(ms, 0.50), 3),
        "p99_ms": round(_pct(ms, 0.99), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


async def nats_round_trip(nc: Client, n: int) -> dict[str, float]:
    """Core-NATS request-reply to an echo responder on the same server (after a warm-up)."""

    async def echo(msg: Msg) -> None:
        await msg.respond(msg.data)

    sub = await nc.subscribe("bench.echo", cb=echo)
    payload = b"x" * 256
    for _ in range(200):
        await nc.request("bench.echo", payload, timeout=2)
    rtt = []
    for _ in range(n):
        started = time.perf_counter()
        await nc.request("bench.echo", payload, timeout=2)
        rtt.append((time.perf_counter() - started) * 1000)
    await sub.unsubscribe()
    return summary(rtt)
