"""Recall latency of two checkouts, interleaved request by request (``A`` and ``B``: e.g. main
before a change and the branch after it), so that a busy machine slows both alike.

One throwaway Postgres database seeded as ``tests.bench.recall`` seeds it (no vectors: this times
the strategies that need none, ``last_k``, ``importance`` and ``full``), and one nats-server per
checkout. Each checkout runs ``engram serve recall`` from its own virtualenv against its own
server and the shared database. Every round sends one request of each (size, strategy) cell to A
and to B, in random order, plus a bare request-reply to an echo responder on each server (the
yardstick). Reported per checkout: p50/p99 and p50 / RTT, and the median of the paired per-round
differences B - A (robust to load that comes and goes).

    .venv/bin/python -m tests.bench.recall_ab --a /path/to/main-checkout --b . --rounds 600
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from contracts.subjects import RECALL
from shared.runtime.time import utcnow
from tests.bench import measure
from tests.bench.recall import TOP_K, _copy, _dsn, _rows
from tests.support.servers import nats_server

STRATEGIES = ("last_k", "importance")


@asynccontextmanager
async def recall_service(checkout: Path, nats_url: str, db_url: str, data_dir: Path) -> AsyncIterator[None]:
    """``engram serve recall`` of ``checkout`` (its own .venv), until the block ends."""
    env = {
        **os.environ,
        "ENGRAM_NATS_URL": nats_url,
        "ENGRAM_DATABASE_URL": db_url,
        "ENGRAM_TOKEN_KEYS": f"{measure.KID}={measure.SECRET}",
        "ENGRAM_EMBEDDER": "hashing-384",
        "ENGRAM_VECTOR_STORE": "none",
        "ENGRAM_REDIS_URL": "",
        "ENGRAM_DATA_DIR": str(data_dir),
    }
    proc = subprocess.Popen(
        [str(checkout / ".venv" / "bin" / "engram"), "serve", "recall"],
        cwd=checkout,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(data_dir / "stderr.log", "w"),  # noqa: SIM115 (closed with the process)
    )
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def _ready(nc: Client, body: bytes, headers: dict[str, str]) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            reply = json.loads((await nc.request(RECALL, body, headers=headers, timeout=2)).data)
        except Exception:  # not subscribed yet: no responders / timeout
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
            continue
        if "error" in reply:
            raise RuntimeError(f"recall answered {reply['error']}")
        return


def _body(agent: UUID, strategy: str) -> bytes:
    return json.dumps(
        {"agent_config_id": str(agent), "principal": {"kind": "none"}, "strategy": strategy, "top_k": TOP_K}
    ).encode()


async def _timed(nc: Client, subject: str, body: bytes, headers: dict[str, str] | None) -> float:
    started = time.perf_counter()
    await nc.request(subject, body, headers=headers, timeout=30)
    return (time.perf_counter() - started) * 1000


async def main(args: argparse.Namespace) -> dict[str, Any]:
    sides = {"A": args.a.resolve(), "B": args.b.resolve()}
    async with measure.running_stack() as stack:
        db_url, tmp = stack.settings.database_url, stack.settings.data_dir.parent
        org = uuid4()
        agents = {size: uuid4() for size in args.sizes}
        conn = await asyncpg.connect(_dsn(db_url))
        rng, now, serial = random.Random(42), utcnow(), 0
        for size, agent in agents.items():
            await _copy(conn, _rows(rng, org, agent, size, serial, now, args.shared_share))
            serial += size
        for i in range(args.other_configs):
            await _copy(
                conn, _rows(rng, uuid4() if i % 5 else org, uuid4(), args.per_other, serial, now, 0.8)
            )
            serial += args.per_other
        await conn.execute("ANALYZE memory_entries")
        await conn.close()
        headers = {"Authorization": f"Bearer {measure.bench_token(org)}"}
        async with nats_server(tmp / "nats-b") as server_b:
            urls = {"A": stack.nats.url, "B": server_b.url}
            for name in sides:
                (tmp / name).mkdir(parents=True)
            async with (
                recall_service(sides["A"], urls["A"], db_url, tmp / "A"),
                recall_service(sides["B"], urls["B"], db_url, tmp / "B"),
            ):
                ncs = {name: await nats.connect(url) for name, url in urls.items()}

                async def echo(msg: Msg) -> None:
                    await msg.respond(msg.data)

                for nc in ncs.values():
                    await nc.subscribe("bench.echo", cb=echo)
                    await _ready(nc, _body(agents[args.sizes[0]], "last_k"), headers)
                cells = [(str(size), strategy) for size in args.sizes for strategy in args.strategies]
                samples: dict[tuple[str, str], list[float]] = {}
                order = random.Random(7)
                for round_no in range(args.warmup + args.rounds):
                    for size, strategy in [("rtt", "echo"), *cells]:
                        for name in order.sample(["A", "B"], 2):
                            if size == "rtt":
                                ms = await _timed(ncs[name], "bench.echo", b"x" * 256, None)
                            else:
                                ms = await _timed(
                                    ncs[name], RECALL, _body(agents[int(size)], strategy), headers
                                )
                            if round_no >= args.warmup:
                                samples.setdefault((name, f"{size}/{strategy}"), []).append(ms)
                for nc in ncs.values():
                    await nc.drain()
    results: dict[str, Any] = {
        "sides": {k: str(v) for k, v in sides.items()},
        "rounds": args.rounds,
        "machine": {**measure.machine(), "load_avg_after": measure.load_average()},
        "cells": {},
    }
    for key in sorted({cell for _, cell in samples}):
        a, b = samples[("A", key)], samples[("B", key)]
        results["cells"][key] = {
            "A": measure.summary(a),
            "B": measure.summary(b),
            "paired_median_b_minus_a_ms": round(
                statistics.median(y - x for x, y in zip(a, b, strict=True)), 3
            ),
        }
    return results


def render(results: dict[str, Any]) -> str:
    rtt, machine = results["cells"]["rtt/echo"], results["machine"]
    rows = [
        f"A = {results['sides']['A']}, B = {results['sides']['B']}; {results['rounds']} interleaved rounds; "
        f"{machine['cpus']} CPUs, 1/5/15-min load average after: {machine['load_avg_after']}",
        "",
        "| cell | A p50 | A p99 | A p50/RTT | B p50 | B p99 | B p50/RTT | paired median B−A ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, cell in results["cells"].items():
        a, b = cell["A"], cell["B"]
        rows.append(
            f"| {key} | {a['p50_ms']} | {a['p99_ms']} | {a['p50_ms'] / rtt['A']['p50_ms']:.1f}× | "
            f"{b['p50_ms']} | {b['p99_ms']} | {b['p50_ms'] / rtt['B']['p50_ms']:.1f}× | "
            f"{cell['paired_median_b_minus_a_ms']} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    parser = measure.bench_parser(__doc__, "bench-results/recall_ab.json")
    parser.add_argument("--a", type=Path, required=True, help="checkout A (with its .venv)")
    parser.add_argument("--b", type=Path, default=Path("."), help="checkout B (with its .venv)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    parser.add_argument("--other-configs", type=int, default=50)
    parser.add_argument("--per-other", type=int, default=1_000)
    parser.add_argument("--shared-share", type=float, default=0.9)
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=50)
    measure.run_bench(parser, main, render)
