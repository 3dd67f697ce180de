"""Write-path benchmark (``make bench``): sessions/s and lessons/s through ingest → distill →
saved with the built-in distiller, and publish → ``memory.written`` latency, with the bare NATS
request-reply round trip and JetStream publish measured in the same run as the yardstick.

Everything runs on this machine: a fresh nats-server from the wheel, a throwaway Postgres
database, and the services in-process (as ``engram up`` runs them). Results go to
``bench-results/write_path.json`` and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any
from uuid import uuid4

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.runtime import running_services
from shared.runtime.process_memory import settle_heap
from tests.bench import measure
from tests.platform import session_payload


async def yardstick(nc: Client, n: int) -> dict[str, Any]:
    """Bare core-NATS request-reply and JetStream publish→ack on the same server."""

    rtt = await measure.nats_round_trip(nc, n)
    payload = b"x" * 256
    js = nc.jetstream()
    await js.add_stream(name="BENCH", subjects=["bench.js"])
    pub, _ = await measure.time_each(range(min(n, 1000)), lambda _: js.publish("bench.js", payload))
    await js.delete_stream("BENCH")
    return {"nats_request_reply": rtt, "jetstream_publish_ack": measure.summary(pub)}


def _sessions(org: Any, agent: Any, n: int, tag: str) -> list[dict[str, Any]]:
    """Sessions shaped like real ones: a few calls, one failure, one explicit statement —
    the built-in distiller turns each into 2-3 lessons."""
    owners = [{"kind": "end_user", "id": f"user-{i}"} for i in range(50)] + [{"kind": "none"}]
    out = []
    for i in range(n):
        trace = [
            {"tool": "search_kb", "input": {"q": f"{tag} topic {i}"}, "output": "3 hits", "duration_ms": 40},
            {
                "tool": "http_get",
                "input": {"url": f"https://api.example.com/v1/items/{i}"},
                "error": f"HTTP 503 from upstream shard {i % 13}",
                "duration_ms": 900,
            },
            {
                "tool": "http_get",
                "input": {"url": f"https://api.example.com/v2/items/{i}"},
                "output": "200 OK",
            },
        ]
        transcript = [
            {"role": "user", "content": f"Remember: order {tag}-{i} ships from the Lyon warehouse."}
        ]
        out.append(
            session_payload(
                org,
                agent,
                status="success",
                principal=owners[i % len(owners)],
                tool_trace=trace,
                transcript=transcript,
                task=f"Resolve ticket {tag}-{i}",
                session_id=f"{tag}-{i}",
            )
        )
    return out


class WrittenWatcher:
    """Arrival time of the first memory.written per session, and the count of all of them."""

    def __init__(self) -> None:
        self.first: dict[str, float] = {}
        self.count = 0

    async def on_message(self, msg: Msg) -> None:
        self.count += 1
        session_id = json.loads(msg.data).get("session_id")
        self.first.setdefault(session_id, time.perf_counter())


async def _publish(nc: Client, token: str, payload: dict[str, Any]) -> float:
    sent = time.perf_counter()
    await nc.jetstream().publish(
        "engram.session.ended",
        json.dumps(payload).encode(),
        headers={"Authorization": f"Bearer {token}", "Nats-Msg-Id": payload["event_id"]},
    )
    return sent


async def _wait_for(watcher: WrittenWatcher, session_ids: list[str], timeout: float) -> None:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if all(s in watcher.first for s in session_ids):
            return
        await asyncio.sleep(0.02)
    missing = sum(1 for s in session_ids if s not in watcher.first)
    raise RuntimeError(f"{missing} sessions produced no memory.written within {timeout}s")


async def throughput(
    nc: Client, token: str, org: Any, agent: Any, n: int, watcher: WrittenWatcher
) -> dict[str, Any]:
    """Publish n sessions as fast as possible; time until every one has its lessons saved."""
    sessions = _sessions(org, agent, n, f"burst{uuid4().hex[:6]}")
    before = watcher.count
    start = time.perf_counter()
    sent = await asyncio.gather(*(_publish(nc, token, s) for s in sessions))
    publish_s = time.perf_counter() - start
    await _wait_for(watcher, [s["session_id"] for s in sessions], timeout=600)
    # The last lesson of the last session may trail its first one by a moment.
    await asyncio.sleep(0.5)
    elapsed = max(watcher.first[s["session_id"]] for s in sessions) - start
    lessons = watcher.count - before
    latency = [(watcher.first[s["session_id"]] - t) * 1000 for s, t in zip(sessions, sent, strict=True)]
    return {
        "sessions": n,
        "lessons_written": lessons,
        "elapsed_s": round(elapsed, 3),
        "publish_s": round(publish_s, 3),
        "sessions_per_s": round(n / elapsed, 1),
        "lessons_per_s": round(lessons / elapsed, 1),
        "latency_under_burst": measure.summary(latency),
    }


async def steady(
    nc: Client, token: str, org: Any, agent: Any, rate: float, seconds: float, watcher: WrittenWatcher
) -> dict[str, Any]:
    """Publish at a fixed rate; publish → first memory.written latency per session."""
    sessions = _sessions(org, agent, int(rate * seconds), f"steady{uuid4().hex[:6]}")
    sent: list[float] = []
    start = time.perf_counter()
    for i, payload in enumerate(sessions):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        sent.append(await _publish(nc, token, payload))
    await _wait_for(watcher, [s["session_id"] for s in sessions], timeout=120)
    latency = [(watcher.first[s["session_id"]] - t) * 1000 for s, t in zip(sessions, sent, strict=True)]
    return {"rate_per_s": rate, "sessions": len(sessions), "latency": measure.summary(latency)}


async def uncapped(nc: Client, token: str, agent: Any, timeout: float) -> None:
    """Raise the agent config's entry cap, so pruning does not interfere with counting."""
    config = {"retention": {"max_entries": 1_000_000}}
    await nc.request(
        "engram.config.put",
        json.dumps({"agent_config_id": str(agent), "config": config}).encode(),
        headers={"Authorization": f"Bearer {token}"},
        timeout=timeout,
    )


async def main(args: argparse.Namespace) -> dict[str, Any]:
    # The default embedder (all-MiniLM-L6-v2), as `engram up` runs: it shares the cores.
    async with measure.running_stack() as stack:
        nc = await nats.connect(stack.nats.url)
        results: dict[str, Any] = {"machine": measure.machine()}
        results["yardstick"] = await yardstick(nc, args.rtt_samples)
        async with running_services(stack.settings):
            settle_heap()  # start-up is done, as `engram up` settles it (shared/runtime/process_memory.py)
            org, agent = uuid4(), uuid4()
            token = measure.bench_token(org, "service:b")
            await uncapped(nc, token, agent, timeout=5)
            watcher = WrittenWatcher()
            await nc.subscribe("engram.memory.written", cb=watcher.on_message)
            await throughput(nc, token, org, agent, 100, watcher)  # warm-up
            results["steady"] = await steady(nc, token, org, agent, args.rate, args.seconds, watcher)
            results["burst"] = await throughput(nc, token, org, agent, args.sessions, watcher)
        await nc.drain()
    return results


def render(results: dict[str, Any]) -> str:
    y, b, s = results["yardstick"], results["burst"], results["steady"]
    rows = [
        "| measurement | value |",
        "|---|---|",
        f"| bare NATS request-reply p50 / p99 | {y['nats_request_reply']['p50_ms']} / "
        f"{y['nats_request_reply']['p99_ms']} ms |",
        f"| JetStream publish→ack p50 / p99 | {y['jetstream_publish_ack']['p50_ms']} / "
        f"{y['jetstream_publish_ack']['p99_ms']} ms |",
        f"| burst: sessions/s | {b['sessions_per_s']} ({b['sessions']} sessions in {b['elapsed_s']} s) |",
        f"| burst: lessons/s (memory.written) | {b['lessons_per_s']} ({b['lessons_written']} lessons) |",
        f"| burst: publish→memory.written p50 / p99 | {b['latency_under_burst']['p50_ms']} / "
        f"{b['latency_under_burst']['p99_ms']} ms |",
        f"| steady {s['rate_per_s']}/s: publish→memory.written p50 / p99 | {s['latency']['p50_ms']} / "
        f"{s['latency']['p99_ms']} ms |",
    ]
    return "\n".join(rows)


if __name__ == "__main__":
    parser = measure.bench_parser(__doc__, "bench-results/write_path.json")
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=20.0, help="steady-state sessions per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rtt-samples", type=int, default=5000)
    measure.run_bench(parser, main, render)
