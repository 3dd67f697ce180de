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
import json
import os
import platform
import random
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from uuid import uuid4

import asyncpg
import httpx
import nats
from pydantic import SecretStr

from contracts.common import Principal
from contracts.subjects import RECALL
from services.gateway.server import running_gateway
from services.runtime import running_services
from shared.auth import ALL_PERMISSIONS, TokenService
from shared.embedders.hashing import HashingEmbedder
from shared.settings import EngramSettings
from shared.testing.servers import nats_server, throwaway_database
from shared.time import utcnow
from tests.bench.measure import nats_round_trip, summary
from tests.bench.recall import KID, SECRET, _body, _copy, _dsn, _rows

STRATEGIES = ("last_k", "importance")
TARGET_ADDED_MS = 1.0

Call = Callable[[], Awaitable[bytes]]


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


async def interleaved(calls: dict[str, Call], rounds: int, warmup: int) -> dict[str, dict[str, Any]]:
    """Each call once per round, in a rotating order (no call always goes first)."""
    names = list(calls)
    for _ in range(warmup):
        for name in names:
            await calls[name]()
    timings: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            started = time.perf_counter()
            reply = await calls[name]()
            timings[name].append((time.perf_counter() - started) * 1000)
            if b'"error"' in reply[:20]:
                raise RuntimeError(f"{name} answered {reply[:200]!r}")
    return {name: summary(ms) for name, ms in timings.items()}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "setup": {"entries": args.entries, "top_k": 10, "rounds": args.rounds, "strategies": STRATEGIES},
    }
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
                vector_store="none",
                http_port=0,
                _env_file=None,
            )  # type: ignore[call-arg]
            org, agent = uuid4(), uuid4()
            token = TokenService({KID: SECRET}).mint(
                org_id=org, principal=Principal(kind="service", id="bench"), permissions=ALL_PERMISSIONS
            )
            conn = await asyncpg.connect(_dsn(db_url))
            await _copy(conn, _rows(random.Random(42), org, agent, args.entries, 0, utcnow(), 0.9))
            await conn.execute("ANALYZE memory_entries")
            await conn.close()
            nc = await nats.connect(server.url)
            async with (
                running_services(settings, embedder=HashingEmbedder(384)),
                running_gateway(settings, "") as gateway,
                httpx.AsyncClient(base_url=gateway.url) as client,
            ):
                raw = await RawHttp.connect(gateway.host, gateway.port)
                headers = {"Authorization": f"Bearer {token}"}
                results["machine"]["load_avg_before"] = [round(x, 2) for x in os.getloadavg()]
                results["yardstick"] = {"nats_request_reply": await nats_round_trip(nc, args.rtt_samples)}

                async def healthz_raw() -> bytes:
                    return await raw.request("GET", "/healthz")

                results["http_stack"] = await interleaved({"healthz (raw client)": healthz_raw}, 500, 50)
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

                    results["recall"][strategy] = await interleaved(
                        {"nats": over_nats, "http (raw client)": over_raw_http, "http (httpx)": over_httpx},
                        args.rounds,
                        args.warmup,
                    )
                results["machine"]["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
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
    machine = results["machine"]
    rows.append("")
    rows.append(
        f"- {machine['cpus']} CPUs; load average before / after: {machine['load_avg_before']} / "
        f"{machine['load_avg_after']}. Clients, gateway and services share one process and event loop."
    )
    return "\n".join(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=1_000, help="timed requests per transport and strategy")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--rtt-samples", type=int, default=2_000)
    parser.add_argument("--out", type=Path, default=Path("bench-results/gateway.json"))
    args = parser.parse_args()
    results = asyncio.run(main(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(render(results))
    print(f"\n(full results: {args.out})")
