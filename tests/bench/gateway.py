"""Gateway benchmark (``make bench``): the same recall over NATS and over the HTTP gateway, in one
run, interleaved request by request (so both see the same load), with the bare NATS request-reply
round trip as the yardstick; the difference of the p50s is what the gateway adds (ARCHITECTURE 7:
at most 1 ms).

Everything runs in this process, as ``engram up`` runs it: a fresh nats-server from the wheel, a
throwaway Postgres database, every service and the gateway. The target agent config is seeded
directly (``--entries``, default 10k, as in ``tests/bench/recall.py``); recall is ``last_k`` and
``importance``, top_k=10, by a service token acting for the shared pool — the strategies whose own
cost is smallest, so the gateway's share is the most visible.

HTTP is measured with two clients: a minimal keep-alive HTTP/1.1 client on asyncio streams (the
floor: what the gateway itself adds) and ``httpx`` (what a Python caller typically uses; its own
client cost is in the figure). ``GET /healthz`` times the HTTP stack without NATS.

Results go to ``bench-results/gateway.json`` and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from typing import Any
from uuid import uuid4

import asyncpg
import httpx
import nats

from contracts.subjects import RECALL
from services.gateway.server import running_gateway
from services.runtime import running_services
from shared.adapters.embedders.hashing import HashingEmbedder
from shared.runtime.process_memory import settle_heap
from shared.runtime.time import utcnow
from tests.bench import measure
from tests.bench.recall import _body, _copy, _dsn, _rows

STRATEGIES = ("last_k", "importance")
TARGET_ADDED_MS = 1.0


class RawHttp:
    """One keep-alive HTTP/1.1 connection, one request at a time: no client library in the way."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self._reader, self._writer, self._host = reader, writer, host

    @classmethod
    async def connect(cls, host: str, port: int) -> RawHttp:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer, f"{host}:{port}")

    async def request(self, method: str, path: str, body: bytes = b"", token: str = "") -> bytes:
        head = f"{method} {path} HTTP/1.1\r\nHost: {self._host}\r\n"
        if token:
            head += f"Authorization: Bearer {token}\r\n"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self._writer.write(head.encode() + b"\r\n" + body)
        status_and_headers = await self._reader.readuntil(b"\r\n\r\n")
        status = int(status_and_headers.split(b" ", 2)[1])
        length = next(
            int(line.split(b":", 1)[1])
            for line in status_and_headers.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        data = await self._reader.readexactly(length)
        if status != 200:
            raise RuntimeError(f"{method} {path} answered {status}: {data[:200]!r}")
        return data

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()


def _no_error(name: str, reply: bytes) -> None:
    if b'"error"' in reply[:20]:
        raise RuntimeError(f"{name} answered {reply[:200]!r}")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "machine": measure.machine(),
        "setup": {"entries": args.entries, "top_k": 10, "rounds": args.rounds, "strategies": STRATEGIES},
    }
    async with measure.running_stack(embedder="hashing-384", vector_store="none", http_port=0) as stack:
        org, agent = uuid4(), uuid4()
        token = measure.bench_token(org)
        conn = await asyncpg.connect(_dsn(stack.settings.database_url))
        await _copy(conn, _rows(random.Random(42), org, agent, args.entries, 0, utcnow(), 0.9))
        await conn.execute("ANALYZE memory_entries")
        await conn.close()
        nc = await nats.connect(stack.nats.url)
        async with (
            running_services(stack.settings, embedder=HashingEmbedder(384)),
            running_gateway(stack.settings, "") as gateway,
            httpx.AsyncClient(base_url=gateway.url) as client,
        ):
            settle_heap()  # start-up is done, as `engram up` settles it (shared/runtime/process_memory.py)
            raw = await RawHttp.connect(gateway.host, gateway.port)
            headers = {"Authorization": f"Bearer {token}"}
            results["machine"]["load_avg_before"] = measure.load_average()
            results["yardstick"] = {"nats_request_reply": await measure.nats_round_trip(nc, args.rtt_samples)}

            async def healthz_raw() -> bytes:
                return await raw.request("GET", "/healthz")

            results["http_stack"] = await measure.interleaved({"healthz (raw client)": healthz_raw}, 500, 50)
            results["recall"] = {}
            for strategy in STRATEGIES:
                body = _body(agent, strategy, None)

                async def over_nats(body: bytes = body) -> bytes:
                    return bytes((await nc.request(RECALL, body, headers=headers, timeout=30)).data)

                async def over_raw_http(body: bytes = body) -> bytes:
                    return await raw.request("POST", "/v1/recall", body, token)

                async def over_httpx(body: bytes = body) -> bytes:
                    reply = await client.post("/v1/recall", content=body, headers=headers)
                    return reply.content

                results["recall"][strategy] = await measure.interleaved(
                    {"nats": over_nats, "http (raw client)": over_raw_http, "http (httpx)": over_httpx},
                    args.rounds,
                    args.warmup,
                    _no_error,
                )
            results["machine"]["load_avg_after"] = measure.load_average()
            await raw.close()
        await nc.drain()
    return results


def render(results: dict[str, Any]) -> str:
    rtt = results["yardstick"]["nats_request_reply"]
    rows = [
        f"Recall over NATS and over HTTP at {results['setup']['entries']:,} entries, interleaved "
        f"({results['setup']['rounds']} rounds), top_k=10:",
        "",
        "| measurement | n | p50 ms | p99 ms | added p50 ms vs NATS | target |",
        "|---|---:|---:|---:|---:|---|",
        f"| bare NATS request-reply (yardstick) | {rtt['n']} | {rtt['p50_ms']} | {rtt['p99_ms']} | - | - |",
    ]
    for name, s in results["http_stack"].items():
        rows.append(f"| GET /healthz, {name} | {s['n']} | {s['p50_ms']} | {s['p99_ms']} | - | - |")
    for strategy, by_transport in results["recall"].items():
        base = by_transport["nats"]["p50_ms"]
        for transport, s in by_transport.items():
            added = round(s["p50_ms"] - base, 3)
            target = "-"
            if transport == "http (raw client)":
                met = added <= TARGET_ADDED_MS
                target = f"≤ {TARGET_ADDED_MS:g} ms added: {'met' if met else 'MISSED'}"
            rows.append(
                f"| recall {strategy} over {transport} | {s['n']} | {s['p50_ms']} | {s['p99_ms']} | "
                f"{'-' if transport == 'nats' else added} | {target} |"
            )
    rows.append("")
    rows.append(
        f"- {measure.machine_note(results['machine'])}. Clients, gateway and services share one "
        "process and event loop."
    )
    return "\n".join(rows)


if __name__ == "__main__":
    parser = measure.bench_parser(__doc__, "bench-results/gateway.json")
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=1_000, help="timed requests per transport and strategy")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--rtt-samples", type=int, default=2_000)
    measure.run_bench(parser, main, render)
