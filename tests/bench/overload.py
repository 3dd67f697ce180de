"""Overload (``make overload``): ``engram up`` driven at 5x its sustainable session rate for two
minutes while recalls continue, then left to drain. (ARCHITECTURE 7: under 5x overload nothing
is lost, memory stays bounded and recall keeps answering.)

``engram up`` runs as its own process (every service, as ``make run`` starts them) against a
fresh nats-server from the wheel and a throwaway Postgres database, as ``make soak`` runs it.

1. Calibrate: publish ``--calibrate`` sessions at once and time the pipeline (ingest, distill,
   embed) to drain them: that rate is the sustainable one.
2. Baseline: recalls alone for ``--baseline-s`` (p50/p99).
3. Overload: sessions at ``--factor`` x the sustainable rate (or at ``--rate``) for ``--seconds``,
   recalls going on; the service process's RSS sampled from ``/proc`` (and its peak, ``VmHWM``).
4. Drain: publishing stops; time until every consumer is drained, and until recall's p99 over
   a 5-second window is back within 2x the baseline's.
5. Count: every JetStream-acknowledged session must have its ``distill.completed`` audit record
   (sessions lost = published - completed), and the dead-letter stream stays empty.

Results go to ``bench-results/overload.json`` and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import nats
from nats.aio.client import Client

from tests.bench.measure import summary
from tests.bench.soak import CUES, ENGRAM, _connection, rss_mib
from tests.bench.write_path import _sessions
from tests.support.servers import nats_server, throwaway_database

DURABLES = (("ENGRAM_SESSIONS", "ingest"), ("ENGRAM_SESSIONS", "distill"), ("ENGRAM_MEMORY", "embed"))


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for {pid}")


async def backlog(nc: Client) -> int:
    """Messages not yet processed by the write path's durables (pending plus un-acked)."""
    js = nc.jetstream()
    total = 0
    for stream, durable in DURABLES:
        info = await js.consumer_info(stream, durable)
        total += (info.num_pending or 0) + (info.num_ack_pending or 0)
    return total


class Load:
    """Sessions at a rate (changeable) and recalls at a fixed rate, with timestamped latencies."""

    def __init__(self, nc: Client, info: dict[str, Any], recall_rate: float, strategies: list[str]) -> None:
        self.nc = nc
        self.org, self.agent = UUID(info["org_id"]), UUID(info["agent_config_id"])
        self.headers = {"Authorization": f"Bearer {info['token']}"}
        self.recall_rate = recall_rate
        self.strategies = strategies
        self.session_rate = 0.0
        self.published = 0
        self.publish_errors = 0
        #: (when, latency ms or None for an error/timeout)
        self.recalls: list[tuple[float, float | None]] = []
        self.stop_sessions = asyncio.Event()
        self.stop_recalls = asyncio.Event()
        self._batch = 0

    async def publish_now(self, n: int) -> None:
        js = self.nc.jetstream()
        payloads = _sessions(self.org, self.agent, n, f"ov{self._batch}")
        self._batch += 1

        async def one(payload: dict[str, Any]) -> None:
            try:
                await js.publish(
                    "engram.session.ended",
                    json.dumps(payload).encode(),
                    headers={**self.headers, "Nats-Msg-Id": payload["event_id"]},
                    timeout=30,
                )
                self.published += 1
            except Exception:
                self.publish_errors += 1

        await asyncio.gather(*(one(p) for p in payloads))

    async def sessions(self) -> None:
        """Each second, that second's sessions (a tick that overruns is not made up for)."""
        while not self.stop_sessions.is_set():
            tick = time.perf_counter()
            if self.session_rate > 0:
                await self.publish_now(int(self.session_rate))
            await asyncio.sleep(max(0.0, tick + 1.0 - time.perf_counter()))

    async def recall_loop(self) -> None:
        rng = random.Random(7)
        interval = 1.0 / self.recall_rate
        next_at = time.perf_counter()
        while not self.stop_recalls.is_set():
            strategy = rng.choice(self.strategies)
            body: dict[str, Any] = {"agent_config_id": str(self.agent), "strategy": strategy, "top_k": 10}
            if strategy != "last_k":
                body["cue"] = rng.choice(CUES)
            t0 = time.perf_counter()
            try:
                reply = await self.nc.request(
                    "engram.recall", json.dumps(body).encode(), headers=self.headers, timeout=5
                )
                ok = "error" not in json.loads(reply.data)
                self.recalls.append((t0, (time.perf_counter() - t0) * 1000 if ok else None))
            except Exception:
                self.recalls.append((t0, None))
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))

    def between(self, start: float, end: float) -> tuple[list[float], int]:
        """Recall latencies (ms) started in [start, end), and how many failed."""
        window = [ms for t, ms in self.recalls if start <= t < end]
        return [ms for ms in window if ms is not None], sum(1 for ms in window if ms is None)


def log(message: str) -> None:
    print(f"[overload] {message}", file=sys.stderr, flush=True)


async def wait_drained(nc: Client, limit_s: float) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        if await backlog(nc) == 0:
            return time.perf_counter() - started
        await asyncio.sleep(0.5)
    raise RuntimeError(f"not drained within {limit_s:.0f} s")


async def completed(db_url: str, org: UUID) -> int:
    conn = await asyncpg.connect(db_url)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM audit_log WHERE org_id = $1 AND kind = 'distill.completed'", org
            )
        )
    finally:
        await conn.close()


async def run(
    args: argparse.Namespace, proc: subprocess.Popen[bytes], nc: Client, info: dict[str, Any], db_url: str
) -> dict[str, Any]:
    load = Load(nc, info, args.recall_rate, args.strategies)

    # 1. Calibrate the sustainable rate: a burst, timed to drained.
    t0 = time.perf_counter()
    await load.publish_now(args.calibrate)
    await wait_drained(nc, args.drain_limit_s)
    took = time.perf_counter() - t0
    sustainable = args.calibrate / took
    log(f"sustainable ≈ {sustainable:.0f} sessions/s ({args.calibrate} drained in {took:.1f} s)")

    recalling = asyncio.create_task(load.recall_loop())
    # 2. Baseline recalls (no writes).
    base_start = time.perf_counter()
    await asyncio.sleep(args.baseline_s)
    baseline, baseline_errors = load.between(base_start, time.perf_counter())
    base = summary(baseline)
    log(f"baseline recall p50 {base['p50_ms']} ms, p99 {base['p99_ms']} ms")

    # 3. Overload.
    # A fixed --rate compares two commits at the same load (calibration moves with the machine).
    overload_rate = args.rate or args.factor * sustainable
    load.session_rate = overload_rate
    publishing = asyncio.create_task(load.sessions())
    over_start = time.perf_counter()
    rss: list[tuple[float, float]] = []
    max_backlog = 0
    while (elapsed := time.perf_counter() - over_start) < args.seconds:
        rss.append((round(elapsed, 1), round(rss_mib(proc.pid), 1)))
        now_backlog = await backlog(nc)
        max_backlog = max(max_backlog, now_backlog)
        window, failed = load.between(time.perf_counter() - args.sample_s, time.perf_counter())
        recent = summary(window) if window else {"p50_ms": "-", "p99_ms": "-"}
        log(
            f"t={elapsed:5.0f}s rss={rss[-1][1]:.0f} MiB backlog={now_backlog} published={load.published} "
            f"recall p50/p99 {recent['p50_ms']}/{recent['p99_ms']} ms ({failed} failed)"
        )
        await asyncio.sleep(args.sample_s)
    load.stop_sessions.set()
    await publishing
    over_end = time.perf_counter()
    during, during_errors = load.between(over_start, over_end)

    # 4. Drain, recalls going on; then when recall latency is back to normal.
    drain_rss: list[float] = []

    async def sample_rss() -> None:
        while True:
            drain_rss.append(rss_mib(proc.pid))
            await asyncio.sleep(args.sample_s)

    sampler = asyncio.create_task(sample_rss())
    drained_after = await wait_drained(nc, args.drain_limit_s)
    sampler.cancel()
    drain_end = time.perf_counter()
    draining, draining_errors = load.between(over_end, drain_end)
    normal_after = None
    window_start = over_end
    while normal_after is None and time.perf_counter() - over_end < drained_after + 120:
        await asyncio.sleep(1.0)
        while window_start + 5 <= time.perf_counter():
            window, _ = load.between(window_start, window_start + 5)
            if len(window) >= 5 and summary(window)["p99_ms"] <= 2 * max(base["p99_ms"], 1.0):
                normal_after = window_start + 5 - over_end
                break
            window_start += 1.0
    load.stop_recalls.set()
    await recalling

    # 5. Count.
    done = await completed(db_url, load.org)
    dlq = await nc.jetstream().stream_info("ENGRAM_DLQ")
    return {
        "sustainable_sessions_per_s": round(sustainable, 1),
        "factor": round(overload_rate / sustainable, 1),
        "overload_sessions_per_s": round(overload_rate, 1),
        "overload_seconds": args.seconds,
        "recall_rate": args.recall_rate,
        "sessions_published": load.published,
        "publish_errors": load.publish_errors,
        "sessions_completed": done,
        "sessions_lost": load.published - done,
        "dead_letters": dlq.state.messages,
        "max_backlog_messages": max_backlog,
        "rss_mib": {
            "samples": rss,
            "max_sampled": round(max([r for _, r in rss] + drain_rss), 1),
            "peak_vmhwm": round(peak_rss_mib(proc.pid), 1),
        },
        "recall_ms": {
            "baseline": {**base, "errors": baseline_errors},
            "overload": {**summary(during), "errors": during_errors} if during else {"errors": during_errors},
            "draining": {**summary(draining), "errors": draining_errors}
            if draining
            else {"errors": draining_errors},
        },
        "drained_after_load_s": round(drained_after, 1),
        "recall_normal_after_load_s": None if normal_after is None else round(normal_after, 1),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="engram-overload-") as tmp:
        async with (
            nats_server(Path(tmp) / "nats") as server,
            throwaway_database(os.environ.get("ENGRAM_TEST_DATABASE_URL"), Path(tmp)) as db_url,
        ):
            data_dir = Path(tmp) / "data"
            env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
            env.update(dict(pair.split("=", 1) for pair in args.env))
            proc = subprocess.Popen(
                [
                    str(ENGRAM),
                    "up",
                    "--data-dir",
                    str(data_dir),
                    "--nats-url",
                    server.url,
                    "--database-url",
                    db_url,
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(Path(tmp) / "engram.log", "wb"),  # noqa: SIM115 (closed with the process)
            )
            try:
                info = await _connection(data_dir, proc)
                nc = await nats.connect(server.url)
                try:
                    return await run(args, proc, nc, info, db_url)
                finally:
                    await nc.drain()
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()


def render(r: dict[str, Any]) -> str:
    ms = r["recall_ms"]

    def cell(name: str) -> str:
        m = ms[name]
        return f"{m.get('p50_ms', '-')} / {m.get('p99_ms', '-')} ms ({m['errors']} errors)"

    return "\n".join(
        [
            "| measurement | value |",
            "|---|---|",
            f"| sustainable rate (calibrated) | {r['sustainable_sessions_per_s']} sessions/s |",
            f"| overload | {r['overload_sessions_per_s']} sessions/s ({r['factor']}x) for "
            f"{r['overload_seconds']:.0f} s, {r['recall_rate']} recalls/s |",
            f"| sessions published / completed / lost | {r['sessions_published']} / "
            f"{r['sessions_completed']} / {r['sessions_lost']} (dead letters {r['dead_letters']}) |",
            f"| peak backlog | {r['max_backlog_messages']} messages |",
            f"| engram up RSS: max sampled / peak (VmHWM) | {r['rss_mib']['max_sampled']} / "
            f"{r['rss_mib']['peak_vmhwm']} MiB |",
            f"| recall p50 / p99: baseline | {cell('baseline')} |",
            f"| recall p50 / p99: during overload | {cell('overload')} |",
            f"| recall p50 / p99: while draining | {cell('draining')} |",
            f"| drained after the load stopped | {r['drained_after_load_s']} s |",
            f"| recall p99 back within 2x baseline after | {r['recall_normal_after_load_s']} s |",
        ]
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calibrate", type=int, default=1000, help="sessions in the calibration burst")
    parser.add_argument("--factor", type=float, default=5.0)
    parser.add_argument(
        "--rate", type=float, default=0, help="overload sessions/s (default: --factor x the calibrated rate)"
    )
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--baseline-s", type=float, default=15)
    parser.add_argument("--sample-s", type=float, default=5)
    parser.add_argument("--recall-rate", type=float, default=20)
    parser.add_argument("--drain-limit-s", type=float, default=1800)
    parser.add_argument("--out", type=Path, default=Path("bench-results/overload.json"))
    parser.add_argument(
        "--strategies", nargs="+", default=["last_k", "last_k", "semantic", "hybrid"], help="recall mix"
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="ENGRAM_X=value", help="settings for engram up"
    )
    arguments = parser.parse_args()
    results = asyncio.run(main(arguments))
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    arguments.out.write_text(json.dumps(results, indent=2))
    print(render(results))
    print(f"\n(full results: {arguments.out})")
