"""What every benchmark shares: the stack it runs on (a fresh nats-server from the wheel and a
throwaway Postgres database, with the settings and a token for them), timed loops and their
percentile summaries, the yardstick — the bare NATS request-reply round trip, measured on the same
server in the same run — and writing the results (JSON file, markdown table on stdout)."""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from itertools import cycle, islice
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

from nats.aio.client import Client
from nats.aio.msg import Msg
from pydantic import SecretStr

from contracts.common import Principal
from shared.embedded.nats_server import NatsServerProcess
from shared.runtime.process_memory import limit_malloc_arenas
from shared.runtime.settings import EngramSettings
from shared.security.auth import ALL_PERMISSIONS, TokenService
from tests.support.servers import nats_server, throwaway_database

__all__ = [
    "KID",
    "SECRET",
    "Stack",
    "bench_parser",
    "bench_token",
    "interleaved",
    "load_average",
    "machine",
    "machine_note",
    "nats_round_trip",
    "run_bench",
    "running_stack",
    "summary",
    "time_each",
    "write_results",
]

#: The signing key of every benchmark's tokens.
KID, SECRET = "bench", "b" * 48

I = TypeVar("I")  # noqa: E741
R = TypeVar("R")


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(ms: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(ms),
        "p50_ms": round(_pct(ms, 0.50), 3),
        "p99_ms": round(_pct(ms, 0.99), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


async def time_each(
    items: Iterable[I],
    call: Callable[[I], Awaitable[R]],
    *,
    warmup: int = 0,
    warmup_max_s: float = float("inf"),
    max_seconds: float = float("inf"),
) -> tuple[list[float], list[R]]:
    """``call`` on each item, one at a time: the milliseconds each took and what each returned.
    First ``warmup`` untimed calls (on the first items, over again if there are fewer), which stop
    early after ``warmup_max_s``; the timed loop stops early, with fewer samples, once
    ``max_seconds`` have gone by, so a slow call cannot stretch the run."""
    items = list(items)
    warm_until = time.perf_counter() + warmup_max_s
    for item in islice(cycle(items), warmup if items else 0):
        await call(item)
        if time.perf_counter() > warm_until:
            break
    ms: list[float] = []
    results: list[R] = []
    deadline = time.perf_counter() + max_seconds
    for item in items:
        started = time.perf_counter()
        results.append(await call(item))
        ms.append((time.perf_counter() - started) * 1000)
        if started > deadline:
            break
    return ms, results


async def interleaved(
    calls: Mapping[str, Callable[[], Awaitable[R]]],
    rounds: int,
    warmup: int,
    check: Callable[[str, R], None] | None = None,
) -> dict[str, dict[str, float]]:
    """Each call once per round, in a rotating order (no call always goes first), so drift in the
    machine's load falls on all alike; ``check(name, reply)`` may refuse a reply (raise)."""
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
            if check is not None:
                check(name, reply)
    return {name: summary(ms) for name, ms in timings.items()}


async def nats_round_trip(nc: Client, n: int) -> dict[str, float]:
    """Core-NATS request-reply to an echo responder on the same server (after a warm-up)."""

    async def echo(msg: Msg) -> None:
        await msg.respond(msg.data)

    sub = await nc.subscribe("bench.echo", cb=echo)
    payload = b"x" * 256
    ms, _ = await time_each(range(n), lambda _: nc.request("bench.echo", payload, timeout=2), warmup=200)
    await sub.unsubscribe()
    return summary(ms)


def bench_token(org: UUID, ref: str = "service:bench", perms: Iterable[str] = ALL_PERMISSIONS) -> str:
    """A bearer token of ``org`` for ``ref`` (``kind:id``), signed with the benchmark key."""
    return TokenService({KID: SECRET}).mint(
        org_id=org, principal=Principal.parse_ref(ref), permissions=set(perms)
    )


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version()}


def load_average() -> list[float]:
    """The 1/5/15-minute load average: the machine is shared, so each result says how busy it was."""
    return [round(x, 2) for x in os.getloadavg()]


def machine_note(machine: Mapping[str, Any], *, suffix: str = "", of: str = "") -> str:
    """One line for a results table: the CPUs and the load average before and after (``of``: the
    part of the run they bracket, when the keys are ``load_avg_before_<suffix>``)."""
    keys = [f"load_avg_{when}{'_' + suffix if suffix else ''}" for when in ("before", "after")]
    during = f" {of}" if of else ""
    return (
        f"{machine['cpus']} CPUs; 1/5/15-min load average before / after{during}: "
        f"{machine.get(keys[0])} / {machine.get(keys[1])}"
    )


@dataclass(frozen=True)
class Stack:
    """What a benchmark runs Engram on: the NATS server and the settings for it and the database."""

    nats: NatsServerProcess
    settings: EngramSettings


@asynccontextmanager
async def running_stack(**settings: Any) -> AsyncIterator[Stack]:
    """A fresh nats-server and a throwaway, migrated database in a temporary directory, and the
    settings for them (the bench key; ``settings`` add to them, e.g. the embedder)."""
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            nats_server(Path(tmp) / "nats") as server,
            throwaway_database(os.environ.get("ENGRAM_TEST_DATABASE_URL"), Path(tmp)) as db_url,
        ):
            options: dict[str, Any] = {
                "nats_url": server.url,
                "database_url": db_url,
                "data_dir": Path(tmp) / "data",
                "token_keys": SecretStr(f"{KID}={SECRET}"),
                "_env_file": None,
            }
            yield Stack(server, EngramSettings(**(options | settings)))


def write_results(results: dict[str, Any], out: Path, render: Callable[[dict[str, Any]], str]) -> None:
    """``results`` as JSON to ``out``, and ``render(results)`` (a markdown table) on stdout."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(render(results))
    print(f"\n(full results: {out})")


def bench_parser(doc: str | None, out: str) -> argparse.ArgumentParser:
    """A benchmark's command line: its module docstring as the help, ``--out`` for the results."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(out), help="where the JSON results go")
    return parser


def run_bench(
    parser: argparse.ArgumentParser,
    main: Callable[[argparse.Namespace], Any],
    render: Callable[[dict[str, Any]], str],
) -> None:
    """Parse the command line, run ``main(args)`` (a coroutine function, or a plain one) and write
    what it returns with :func:`write_results`. The process caps its malloc arenas first, as
    `engram up` does (shared/runtime/process_memory.py); a bench that starts services in-process settles
    its heap once they are up (``settle_heap``), as `engram up` does after start-up."""
    limit_malloc_arenas()
    args = parser.parse_args()
    results = main(args)
    if inspect.isawaitable(results):
        results = asyncio.run(results)
    write_results(results, args.out, render)
