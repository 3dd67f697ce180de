"""Distributed write path (``make cluster-bench``): sessions/s and lessons/s, and publish →
``memory.written`` latency, for the same services deployed four ways on this machine:

- ``single``: one NATS server (R1 streams), every service in one process — ``engram up``'s shape;
- ``cluster-1proc``: the 3-node cluster (R3 streams), every service still in one process — what
  replication alone costs;
- ``cluster-1x``: the cluster, ingest and distill each in its own process (1 replica), embed+recall
  in one (Qdrant Edge), governance-audit;
- ``cluster-2x``: the same with 2 ingest and 2 distill replicas.

Every service is its own OS process (``engram serve``) under its own NATS identity, as in
``tests/cluster``; the load comes from this process. Results: ``bench-results/cluster-throughput.json``
and a table on stdout, with the load average (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from uuid import uuid4

import nats

from shared.security.nats_auth.permissions import EDGE_VECTOR_PROCESS, SERVICES
from tests.bench.measure import KID, SECRET, bench_parser, bench_token, load_average, run_bench
from tests.bench.write_path import WrittenWatcher, steady, throughput, uncapped
from tests.cluster.harness import PLATFORM_INBOX, running_cluster

ALL = tuple(SERVICES)
SEPARATE = {("governance-audit",): 1, EDGE_VECTOR_PROCESS: 1}
SHAPES: dict[str, tuple[int, dict[tuple[str, ...], int]]] = {
    "single": (1, {ALL: 1}),
    "cluster-1proc": (3, {ALL: 1}),
    "cluster-1x": (3, {("ingest",): 1, ("distill",): 1, **SEPARATE}),
    "cluster-2x": (3, {("ingest",): 2, ("distill",): 2, **SEPARATE}),
}


async def measure(shape: str, args: argparse.Namespace) -> dict[str, Any]:
    nodes, deployment = SHAPES[shape]
    root = Path(tempfile.mkdtemp(prefix=f"engram-bench-{shape}-"))
    root.chmod(0o755)  # Postgres runs as another user when this runs as root
    async with (
        _removed_after(root),
        running_cluster(root, f"{KID}={SECRET}", deployment, nodes=nodes, ack_wait_s=30) as cluster,
    ):
        org, agent = uuid4(), uuid4()
        token = bench_token(org)
        nc = await nats.connect(**cluster.nats_options(cluster.identities.platform, PLATFORM_INBOX))
        observer = await nats.connect(**cluster.nats_options(cluster.identities.observer, "_INBOX_observer"))
        try:
            await uncapped(nc, token, agent, timeout=10)
            watcher = WrittenWatcher()
            await observer.subscribe("engram.memory.written", cb=watcher.on_message)
            await throughput(nc, token, org, agent, 100, watcher)  # warm-up
            result: dict[str, Any] = {
                "nats_nodes": nodes,
                "processes": {"+".join(k): v for k, v in deployment.items()},
                "steady": await steady(nc, token, org, agent, args.rate, args.seconds, watcher),
                "burst": await throughput(nc, token, org, agent, args.sessions, watcher),
                "load_average": load_average(),
            }
        finally:
            await nc.close()
            await observer.close()
    return result


@asynccontextmanager
async def _removed_after(root: Path) -> AsyncIterator[None]:
    try:
        yield
    finally:
        shutil.rmtree(root, ignore_errors=True)


def render(results: dict[str, Any]) -> str:
    lines = [
        "| deployment | sessions/s | lessons/s | burst p50 ms | steady p50 ms | steady p99 ms | load |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape, r in results["shapes"].items():
        lines.append(
            f"| {shape} | {r['burst']['sessions_per_s']} | {r['burst']['lessons_per_s']} "
            f"| {r['burst']['latency_under_burst']['p50_ms']} | {r['steady']['latency']['p50_ms']} "
            f"| {r['steady']['latency']['p99_ms']} | {r['load_average'][0]} |"
        )
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"cpus": os.cpu_count(), "shapes": {}}
    for shape in args.shapes:
        print(f"measuring {shape} …", flush=True)
        results["shapes"][shape] = await measure(shape, args)
    return results


if __name__ == "__main__":
    parser = bench_parser(__doc__, "bench-results/cluster-throughput.json")
    parser.add_argument("--sessions", type=int, default=1000, help="sessions in the burst")
    parser.add_argument("--rate", type=float, default=10.0, help="steady sessions per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="steady duration")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    run_bench(parser, main, render)
