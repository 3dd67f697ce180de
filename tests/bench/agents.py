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
import asyncio
import functools
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from uuid import uuid4

import nats
from pydantic import SecretStr

from contracts.client import EngramClient
from contracts.common import Principal
from contracts.langgraph_store import EngramStore
from services.mcp import Caller, streamable_http_app
from services.runtime import running_services
from shared.auth import TokenService
from shared.settings import EngramSettings
from shared.testing.servers import nats_server, throwaway_database
from tests.bench.measure import nats_round_trip, summary
from tests.mcp_clients import in_process, over_http, serving

KID, SECRET = "bench", "b" * 48
RESULTS = Path("bench-results") / "agents.json"


async def timed(n: int, call: Callable[[], Awaitable[Any]]) -> dict[str, float]:
    return (await interleaved(n, {"": call}))[""]


async def interleaved(n: int, calls: dict[str, Callable[[], Awaitable[Any]]]) -> dict[str, dict[str, float]]:
    """Each call ``n`` times, taking turns, so drift in the machine's load falls on all alike."""
    for call in calls.values():
        for _ in range(min(20, n)):
            await call()
    ms: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(n):
        for name, call in calls.items():
            started = time.perf_counter()
            await call()
            ms[name].append((time.perf_counter() - started) * 1000)
    return {name: summary(values) for name, values in ms.items()}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"setup": {"memories": args.memories, "queries": args.queries}, "rows": {}}
    rows: dict[str, Any] = results["rows"]
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            nats_server(Path(tmp) / "nats") as server,
            throwaway_database(os.environ.get("ENGRAM_TEST_DATABASE_URL"), Path(tmp)) as db_url,
        ):
            settings = EngramSettings(
                nats_url=server.url,
                database_url=db_url,
                data_dir=Path(tmp) / "data",
                token_keys=SecretStr(f"{KID}={SECRET}"),
                embedder="hashing-384",
                _env_file=None,
            )  # type: ignore[call-arg]
            org, agent = uuid4(), uuid4()
            token = TokenService({KID: SECRET}).mint(
                org_id=org,
                principal=Principal(kind="end_user", id="alice"),
                permissions={"memory.read", "memory.write"},
            )
            async with running_services(settings):
                nc = await nats.connect(server.url)
                client = EngramClient(nc, token, timeout=30)
                for start in range(0, args.memories, 100):
                    texts = [
                        f"lesson {i}: step {i % 17} needs check {i % 5}" for i in range(start, start + 100)
                    ]
                    await client.save(agent, [{"text": t} for t in texts], wait=True)
                rows["bare NATS round trip"] = await nats_round_trip(nc, args.queries)
                caller = Caller(token=token, agent_config_id=agent)
                recall_args = {"strategy": "last_k", "top_k": 10}
                async with (
                    in_process(nc, caller) as mcp,
                    serving(streamable_http_app(nc)) as url,
                    over_http(url, caller) as mcp_http,
                ):
                    rows |= await interleaved(
                        args.queries,
                        {
                            "EngramClient.recall": lambda: client.recall(agent, strategy="last_k", top_k=10),
                            "MCP recall tool, in-process": lambda: mcp.call_tool("recall", recall_args),
                            "MCP recall tool, streamable HTTP": lambda: mcp_http.call_tool(
                                "recall", recall_args
                            ),
                        },
                    )
                for size in args.store_sizes:
                    store = EngramStore(client, uuid4())
                    for i in range(size):
                        await store.aput(("users", "alice", "notes"), f"k{i}", {"text": f"note {i}"})
                    n = max(10, args.queries // 10)
                    rows[f"EngramStore.aget, {size} items"] = await timed(
                        n, functools.partial(store.aget, ("users", "alice", "notes"), "k0")
                    )
                    rows[f"EngramStore.asearch query, {size} items"] = await timed(
                        n, functools.partial(store.asearch, ("users", "alice"), query="note 7", limit=5)
                    )
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--store-sizes", type=int, nargs="+", default=[10, 100, 500])
    parsed = parser.parse_args()
    out = asyncio.run(main(parsed))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(render(out))
