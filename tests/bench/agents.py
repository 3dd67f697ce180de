"""What the agent interfaces cost (``make bench``): recall through ``EngramClient``, through an MCP
tool in-process (the stdio shape) and over streamable HTTP, beside the bare NATS round trip of the
same run; and ``EngramStore`` get/search at a few store sizes (each batch lists the owner's items,
so their cost grows with the store — docs/decisions.md, "LangGraph store").

Everything on this machine: a fresh nats-server from the wheel, a throwaway Postgres database,
every service in-process with the hashing embedder. One request at a time, an end-user token;
recall is ``last_k``, ``top_k=10`` over ``--memories`` saved memories.

Results go to ``bench-results/agents.json`` and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any
from uuid import uuid4

import nats

from contracts.client import EngramClient
from contracts.langgraph_store import EngramStore
from services.mcp import Caller, streamable_http_app
from services.runtime import running_services
from tests.bench import measure
from tests.mcp_clients import in_process, over_http, serving


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"setup": {"memories": args.memories, "queries": args.queries}, "rows": {}}
    rows: dict[str, Any] = results["rows"]
    async with measure.running_stack(embedder="hashing-384") as stack, running_services(stack.settings):
        agent = uuid4()
        token = measure.bench_token(uuid4(), "end_user:alice", {"memory.read", "memory.write"})
        nc = await nats.connect(stack.nats.url)
        client = EngramClient(nc, token, timeout=30)
        for start in range(0, args.memories, 100):
            texts = [f"lesson {i}: step {i % 17} needs check {i % 5}" for i in range(start, start + 100)]
            await client.save(agent, [{"text": t} for t in texts], wait=True)
        rows["bare NATS round trip"] = await measure.nats_round_trip(nc, args.queries)
        caller = Caller(token=token, agent_config_id=agent)
        recall_args = {"strategy": "last_k", "top_k": 10}
        async with (
            in_process(nc, caller) as mcp,
            serving(streamable_http_app(nc)) as url,
            over_http(url, caller) as mcp_http,
        ):
            recalls = {
                "EngramClient.recall": lambda: client.recall(agent, strategy="last_k", top_k=10),
                "MCP recall tool, in-process": lambda: mcp.call_tool("recall", recall_args),
                "MCP recall tool, streamable HTTP": lambda: mcp_http.call_tool("recall", recall_args),
            }
            rows |= await measure.interleaved(recalls, args.queries, min(20, args.queries))
        for size in args.store_sizes:
            store = EngramStore(client, uuid4())
            for i in range(size):
                await store.aput(("users", "alice", "notes"), f"k{i}", {"text": f"note {i}"})
            n = max(10, args.queries // 10)
            reads = {
                f"EngramStore.aget, {size} items": functools.partial(
                    store.aget, ("users", "alice", "notes"), "k0"
                ),
                f"EngramStore.asearch query, {size} items": functools.partial(
                    store.asearch, ("users", "alice"), query="note 7", limit=5
                ),
            }
            rows |= await measure.interleaved(reads, n, min(20, n))
        await nc.drain()
    base = rows["bare NATS round trip"]["p50_ms"]
    for row in rows.values():
        row["x_nats_p50"] = round(row["p50_ms"] / base, 1)
    return results


def render(results: dict[str, Any]) -> str:
    lines = ["| path | p50 ms | p99 ms | × NATS p50 |", "|---|---|---|---|"]
    for name, r in results["rows"].items():
        lines.append(f"| {name} | {r['p50_ms']} | {r['p99_ms']} | {r['x_nats_p50']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = measure.bench_parser(__doc__, "bench-results/agents.json")
    parser.add_argument("--memories", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--store-sizes", type=int, nargs="+", default=[10, 100, 500])
    measure.run_bench(parser, main, render)
