"""What the agent interfaces cost (``make bench``): recall through ``EngramClient``, through an MCP
tool in-process (the stdio shape) and over streamable HTTP, beside the bare NATS round trip of the
same run; and ``EngramStore`` get/search at a few store sizes (``--store-sizes``; namespaces of
50 items each, so a read of one namespace has the same work at every size — docs/benchmarks.md,
"2026-12-01 — memory.list's metadata filter").

Everything on this machine: a fresh nats-server from the wheel, a throwaway Postgres database,
every service in-process with the hashing embedder. One request at a time, an end-user token;
recall is ``last_k``, ``top_k=10`` over ``--memories`` saved memories.

Results go to ``bench-results/agents.json`` and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
from typing import Any
from uuid import UUID, uuid4

import nats
from nats.aio.client import Client
from sqlalchemy import and_, func, select

from contracts.client import EngramClient
from contracts.langgraph_store import EngramStore, item_entry
from services.mcp import Caller, streamable_http_app
from services.runtime import running_services
from shared.runtime.process_memory import settle_heap
from shared.security.auth import TokenService
from shared.storage.db.engine import Database
from shared.storage.db.models import ENTRIES
from tests.bench import measure
from tests.mcp_clients import in_process, over_http, serving

#: Items per namespace in the store benchmark: namespaces grow in number with the store, not in size
#: (an agent's threads or topics), so a read of one namespace has the same work at every size.
PER_NAMESPACE = 50
#: Items with ``{"tag": "rare"}`` in their value, whatever the size (a filtered search's answer).
RARE = 5


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"setup": {"memories": args.memories, "queries": args.queries}, "rows": {}}
    rows: dict[str, Any] = results["rows"]
    async with measure.running_stack(embedder="hashing-384") as stack, running_services(stack.settings):
        settle_heap()  # start-up is done, as `engram up` settles it (shared/runtime/process_memory.py)
        org = uuid4()
        token = measure.bench_token(org, "end_user:alice", {"memory.read", "memory.write"})
        nc = await nats.connect(stack.nats.url)
        client = EngramClient(nc, token, timeout=30)
        rows["bare NATS round trip"] = await measure.nats_round_trip(nc, args.queries)
        if not args.store_only:
            rows |= await agent_rows(nc, client, token, args)
        if args.store_sizes:
            rows |= await store_rows(
                nc, client, stack.settings.database_url, org, args.store_sizes, args.queries
            )
        await nc.drain()
    base = rows["bare NATS round trip"]["p50_ms"]
    for row in rows.values():
        row["x_nats_p50"] = round(row["p50_ms"] / base, 1)
    return results


async def agent_rows(
    nc: Client, client: EngramClient, token: str, args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    """Recall through the client, an MCP tool in-process and over streamable HTTP, taking turns."""
    agent = uuid4()
    for start in range(0, args.memories, 100):
        texts = [f"lesson {i}: step {i % 17} needs check {i % 5}" for i in range(start, start + 100)]
        await client.save(agent, [{"text": t} for t in texts], wait=True)
    caller = Caller(token=token, agent_config_id=agent)
    recall_args = {"strategy": "last_k", "top_k": 10}
    async with (
        in_process(nc, caller) as mcp,
        serving(streamable_http_app(nc, TokenService({measure.KID: measure.SECRET}))) as url,
        over_http(url, caller) as mcp_http,
    ):
        recalls = {
            "EngramClient.recall": lambda: client.recall(agent, strategy="last_k", top_k=10),
            "MCP recall tool, in-process": lambda: mcp.call_tool("recall", recall_args),
            "MCP recall tool, streamable HTTP": lambda: mcp_http.call_tool("recall", recall_args),
        }
        return await measure.interleaved(recalls, args.queries, min(20, args.queries))


async def store_rows(
    nc: Client, client: EngramClient, database_url: str, org: UUID, sizes: list[int], queries: int
) -> dict[str, dict[str, float]]:
    """``EngramStore`` get and search at each size: one owner's items, loaded in batches of 100
    (through ``item_entry``, what ``put`` saves) and indexed before anything is timed."""
    operator = EngramClient(nc, measure.bench_token(org, "actor:bench-admin"), timeout=60)
    rows: dict[str, dict[str, float]] = {}
    for size in sizes:
        agent = uuid4()
        await operator.put_config(agent, {"retention": {"max_entries": max(1000, 2 * size)}})
        store = EngramStore(client, agent)
        for start in range(0, size, 100):
            entries = [
                item_entry(
                    ("users", "alice", f"topic{i // PER_NAMESPACE}"),
                    f"k{i}",
                    {"text": f"note {i} about step {i % 17}", "tag": "rare" if i < RARE else "common"},
                )
                for i in range(start, min(size, start + 100))
            ]
            await client.save(agent, entries, wait=True)
        await _indexed(database_url, agent)
        n = max(10, queries // 10)
        ns = ("users", "alice", "topic0")
        reads = {
            f"EngramStore.aget, {size} items": functools.partial(store.aget, ns, "k7"),
            f"EngramStore.asearch namespace, {size} items": functools.partial(store.asearch, ns, limit=10),
            f"EngramStore.asearch namespace+query, {size} items": functools.partial(
                store.asearch, ns, query="note 7", limit=5
            ),
            f"EngramStore.asearch owner+filter, {size} items": functools.partial(
                store.asearch, ("users", "alice"), filter={"tag": "rare"}, limit=10
            ),
        }
        rows |= await measure.interleaved(reads, n, min(20, n))
    return rows


async def _indexed(database_url: str, agent: UUID) -> None:
    """Wait until every entry of ``agent`` has its vector (hybrid ranks indexed entries)."""
    db = Database(database_url, pool_size=1)
    pending_only = and_(ENTRIES.c.agent_config_id == agent, ENTRIES.c.embedding_status != "indexed")
    try:
        while True:
            async with db.read() as session:
                pending = (
                    await session.execute(select(func.count()).select_from(ENTRIES).where(pending_only))
                ).scalar_one()
            if pending == 0:
                return
            await asyncio.sleep(0.2)
    finally:
        await db.close()


def render(results: dict[str, Any]) -> str:
    lines = ["| path | p50 ms | p99 ms | × NATS p50 |", "|---|---|---|---|"]
    for name, r in results["rows"].items():
        lines.append(f"| {name} | {r['p50_ms']} | {r['p99_ms']} | {r['x_nats_p50']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = measure.bench_parser(__doc__, "bench-results/agents.json")
    parser.add_argument("--store-only", action="store_true", help="only the EngramStore rows")
    parser.add_argument("--memories", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--store-sizes", type=int, nargs="+", default=[100, 1000, 5000])
    measure.run_bench(parser, main, render)
