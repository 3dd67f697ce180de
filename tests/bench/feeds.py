"""Tenant feed benchmark: how long after a save an organization's SSE client and webhook receiver
have its ``memory.written`` event (docs/adr/0102-tenant-feeds.md).

One stack on this machine (a fresh nats-server, a throwaway database, the services and the HTTP
gateway in-process, hashing embedder). One organization saves one entry at a time at ``--rate``
per second over NATS (``wait``: answered after the commit); the clock runs from the request to
the event's arrival at an SSE client of ``GET /v1/events`` and at a webhook receiver on 127.0.0.1
that verifies each delivery's signature with ``standardwebhooks``. The bare NATS round trip of the
same run is the yardstick. Results go to ``bench-results/feeds.json`` and a table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from typing import Any
from uuid import uuid4

import httpx
import nats

from services.gateway.server import running_gateway
from services.runtime import running_services
from shared.runtime.process_memory import settle_heap
from tests.bench import measure
from tests.support.webhook_receiver import webhook_receiver


async def main(args: argparse.Namespace) -> dict[str, Any]:
    stack_settings = {"embedder": "hashing-384", "webhook_allow_private_networks": True, "http_port": 0}
    async with measure.running_stack(**stack_settings) as stack, webhook_receiver() as receiver:
        nc = await nats.connect(stack.nats.url)
        results: dict[str, Any] = {"machine": measure.machine()}
        results["yardstick"] = {"nats_request_reply": await measure.nats_round_trip(nc, args.rtt_samples)}
        async with running_services(stack.settings), running_gateway(stack.settings, "") as gateway:
            settle_heap()
            org, agent = uuid4(), uuid4()
            token = measure.bench_token(org, "service:b")
            auth = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
                hook = (
                    await http.post("/v1/webhooks", json={"url": receiver.url("/b")}, headers=auth)
                ).json()
                receiver.endpoints["/b"].secret = hook["secret"]
                sse_seen: dict[str, float] = {}
                opened = asyncio.Event()
                reader = asyncio.create_task(_read_sse(http, auth, sse_seen, opened))
                await asyncio.wait_for(opened.wait(), 30)  # its consumer exists before the first save
                results["machine"]["load_avg_before"] = measure.load_average()
                sent: dict[str, float] = {}
                replied: dict[str, float] = {}
                for i in range(args.saves):
                    started = time.perf_counter()
                    reply = await nc.request(
                        "engram.memory.save",
                        json.dumps(
                            {
                                "agent_config_id": str(agent),
                                "entries": [{"text": f"lesson {i} {uuid4().hex}"}],
                                "wait": True,
                            }
                        ).encode(),
                        timeout=10,
                        headers=auth,
                    )
                    entry = json.loads(reply.data)["ids"][0]
                    sent[entry] = started
                    replied[entry] = time.perf_counter()
                    await asyncio.sleep(max(0.0, 1 / args.rate - (time.perf_counter() - started)))
                endpoint = receiver.endpoints["/b"]
                deadline = time.perf_counter() + 60
                while time.perf_counter() < deadline and not (
                    set(sent) <= set(sse_seen)
                    and set(sent) <= {e["data"].get("entry_id") for e in endpoint.received}
                ):
                    await asyncio.sleep(0.05)
                results["machine"]["load_avg_after"] = measure.load_average()
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
        hooked = {e["data"]["entry_id"]: e["_at"] for e in endpoint.received if "entry_id" in e["data"]}
        results["saves"] = len(sent)
        results["rate_per_s"] = args.rate
        results["save_reply"] = measure.summary([(replied[k] - v) * 1000 for k, v in sent.items()])
        results["reply_to_sse"] = measure.summary(
            [(sse_seen[k] - v) * 1000 for k, v in replied.items() if k in sse_seen]
        )
        results["reply_to_webhook"] = measure.summary(
            [(hooked[k] - v) * 1000 for k, v in replied.items() if k in hooked]
        )
        results["save_to_sse"] = measure.summary(
            [(sse_seen[k] - v) * 1000 for k, v in sent.items() if k in sse_seen]
        )
        results["save_to_webhook"] = measure.summary(
            [(hooked[k] - v) * 1000 for k, v in sent.items() if k in hooked]
        )
        results["webhook_forged"] = endpoint.forged
        await nc.drain()
    return results


async def _read_sse(
    http: httpx.AsyncClient, auth: dict[str, str], seen: dict[str, float], opened: asyncio.Event
) -> None:
    async with http.stream("GET", "/v1/events", headers=auth, timeout=None) as reply:
        event = ""
        async for line in reply.aiter_lines():
            if line.startswith(":"):
                opened.set()
            elif line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: ") and event == "memory.written":
                seen.setdefault(json.loads(line.removeprefix("data: "))["entry_id"], time.perf_counter())


def render(results: dict[str, Any]) -> str:
    y, sse, hook = (
        results["yardstick"]["nats_request_reply"],
        results["save_to_sse"],
        results["save_to_webhook"],
    )
    return "\n".join(
        [
            "| measurement | value |",
            "|---|---|",
            f"| bare NATS request-reply p50 / p99 | {y['p50_ms']} / {y['p99_ms']} ms |",
            f"| save (wait) answered p50 / p99 | {results['save_reply']['p50_ms']} / "
            f"{results['save_reply']['p99_ms']} ms |",
            f"| save answered → SSE event / → webhook received, p50 / p99 | "
            f"{results['reply_to_sse']['p50_ms']} / {results['reply_to_sse']['p99_ms']} ms; "
            f"{results['reply_to_webhook']['p50_ms']} / {results['reply_to_webhook']['p99_ms']} ms |",
            f"| save (wait) → SSE event p50 / p99 | {sse['p50_ms']} / {sse['p99_ms']} ms (n={sse['n']}) |",
            f"| save (wait) → webhook received p50 / p99 | {hook['p50_ms']} / {hook['p99_ms']} ms "
            f"(n={hook['n']}, forged {results['webhook_forged']}) |",
            f"| {measure.machine_note(results['machine'])} | {results['saves']} saves at "
            f"{results['rate_per_s']}/s |",
        ]
    )


if __name__ == "__main__":
    parser = measure.bench_parser(__doc__, "bench-results/feeds.json")
    parser.add_argument("--saves", type=int, default=200)
    parser.add_argument("--rate", type=float, default=10.0, help="saves per second")
    parser.add_argument("--rtt-samples", type=int, default=2000)
    measure.run_bench(parser, main, render)
