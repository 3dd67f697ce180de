"""Noisy neighbour (``make bench``): does one organization's flood become another's latency?

Organization B works at a normal rate (recalls and sessions) in three phases of ``--seconds``
each, on one stack (a fresh nats-server, a throwaway database, the services in-process as
``engram up`` runs them), with ``ENGRAM_QUOTAS`` giving every organization a ``read`` and a
``sessions`` budget:

1. **alone** — B only;
2. **flood, no budget** — organization A0, whose override budget is practically unlimited, at ten
   times the default budget of recalls and sessions (what happened before quotas);
3. **flood, over budget** — organization A at the same ten times, held to the default budget.

The flooder runs in a process of its own (``tests/bench/flooder.py``): its client work is not the
services'. ``--phases`` runs only some of the floods.

Per phase: B's recall p50/p99 and publish → first ``memory.written`` p50/p99, and the ratios to
phase 1 (goal: recall p99 within 1.5x, sessions within 2x); what the flooder got (answers,
``RATE_LIMITED``, timeouts); and the count of lost sessions — every published session of B must
produce its lessons, every one of A's is taken or dead-lettered ``RATE_LIMITED`` (0 lost). The bare
NATS round trip is measured in the same run. Results: ``bench-results/noisy-neighbour.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable
from typing import Any
from uuid import UUID, uuid4

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.runtime import running_services
from shared.runtime.process_memory import settle_heap
from shared.runtime.quotas import QuotaSettings
from tests.bench import measure
from tests.bench.flooder import paced as _paced
from tests.bench.flooder import recall as _recall
from tests.bench.overload import backlog
from tests.bench.write_path import WrittenWatcher, _publish, _sessions, uncapped


async def _flood_elsewhere(spec: dict[str, Any], started: asyncio.Event, out: dict[str, Any]) -> None:
    """The flooder (``tests.bench.flooder``) in a child process; ``started`` is set once it is
    connected and flooding (B's phase starts then, not while it imports)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    try:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.bench.flooder", f.name, stdout=asyncio.subprocess.PIPE
        )
        assert child.stdout is not None
        ready = await asyncio.wait_for(child.stdout.readline(), 120)
        if ready.strip() != b"ready":
            raise RuntimeError("the flooder did not start")
        started.set()
        last = b""
        async with asyncio.timeout(spec["seconds"] + spec["timeout"] + 60):
            async for line in child.stdout:
                last = line
            await child.wait()
    finally:
        os.unlink(f.name)
    if child.returncode != 0:
        raise RuntimeError(f"the flooder exited {child.returncode}")
    out.update(json.loads(last))


class Letters:
    """Dead letters per organization and code (core subscription on ``engram.dlq.>``; a letter the
    outbox relay published twice — JetStream keeps one — is counted once, by its event id)."""

    def __init__(self) -> None:
        self.by_org: Counter[tuple[str, str]] = Counter()
        self._seen: set[str] = set()

    async def on_message(self, msg: Msg) -> None:
        letter = json.loads(msg.data)
        if letter["event_id"] in self._seen:
            return
        self._seen.add(letter["event_id"])
        self.by_org[(str(letter.get("org_id")), str(letter.get("code")))] += 1


async def phase(
    nc: Client,
    args: argparse.Namespace,
    b: dict[str, Any],
    watcher: WrittenWatcher,
    flooder: dict[str, Any] | None,
) -> dict[str, Any]:
    tag = uuid4().hex[:6]
    b_sessions = _sessions(b["org"], b["agent"], int(args.b_sessions * args.seconds), f"b{tag}")
    sent: dict[str, float] = {}

    async def b_session(i: int) -> None:
        s = b_sessions[i]
        sent[s["session_id"]] = await _publish(nc, b["token"], s)

    async def b_recall(i: int) -> tuple[str, float]:
        return await _recall(
            nc, b["token"], str(b["agent"]), f"upstream shard {i % 13}", args.timeout, args.strategy
        )

    flood: dict[str, Any] = {}
    flooding: asyncio.Future[None] | None = None
    if flooder is not None:
        a_sessions = _sessions(
            flooder["org"], flooder["agent"], int(10 * args.sessions_quota * args.seconds), f"a{tag}"
        )
        spec = {
            "nats_url": args.nats_url,
            "token": flooder["token"],
            "agent": str(flooder["agent"]),
            "sessions": a_sessions,
            "recall_rate": 10 * args.read_quota,
            "seconds": args.seconds,
            "timeout": args.timeout,
            "strategy": args.strategy,
        }
        started = asyncio.Event()
        flooding = asyncio.ensure_future(_flood_elsewhere(spec, started, flood))
        await asyncio.wait([flooding, asyncio.ensure_future(started.wait())], return_when="FIRST_COMPLETED")
        if flooding.done():
            flooding.result()  # the flooder failed to start: say why
    jobs: list[Awaitable[Any]] = [
        _paced(args.b_recalls, args.seconds, b_recall),
        _paced(args.b_sessions, args.seconds, b_session),
    ]
    if flooding is not None:
        jobs.append(flooding)
    results = await asyncio.gather(*jobs)
    recalls: list[tuple[str, float]] = results[0]
    # Every one of B's sessions must produce its lessons (lost = those that never do).
    deadline = time.perf_counter() + args.drain_s
    while time.perf_counter() < deadline and not all(s in watcher.first for s in sent):
        await asyncio.sleep(0.05)
    latency = [(watcher.first[s] - t) * 1000 for s, t in sent.items() if s in watcher.first]
    out: dict[str, Any] = {
        "b_recall": measure.summary([ms for code, ms in recalls if code == "OK"]),
        "b_recall_errors": dict(Counter(code for code, _ in recalls if code != "OK")),
        "b_publish_to_written": measure.summary(latency),
        "b_sessions": len(sent),
        "b_sessions_lost": sum(1 for s in sent if s not in watcher.first),
    }
    if flooder is not None:
        out["flood"] = {
            "recalls": flood["recalls"],
            "sessions_published": flood["sessions_published"],
            "recall_rate_per_s": 10 * args.read_quota,
            "session_rate_per_s": 10 * args.sessions_quota,
        }
        out["flood_sessions"] = a_sessions
    return out


async def _drained(nc: Client, limit_s: float) -> None:
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        if await backlog(nc) == 0:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the write path did not drain within {limit_s} s")


def _flood_accounting(result: dict[str, Any], org: UUID, watcher: WrittenWatcher, letters: Letters) -> None:
    sessions = result.pop("flood_sessions")
    taken = sum(1 for s in sessions if s["session_id"] in watcher.first)
    limited = letters.by_org[(str(org), "RATE_LIMITED")]
    flood = result["flood"]
    flood["sessions_taken"] = taken
    flood["sessions_dead_lettered_rate_limited"] = limited
    flood["sessions_lost"] = flood["sessions_published"] - taken - limited


async def main(args: argparse.Namespace) -> dict[str, Any]:
    limited_org, unlimited_org = uuid4(), uuid4()
    quotas = QuotaSettings.model_validate(
        {
            "org": {
                "read": {"rate": args.read_quota, "burst": args.read_quota},
                "sessions": {"rate": args.sessions_quota, "burst": args.sessions_quota},
            },
            "orgs": {
                str(unlimited_org): {
                    "read": {"rate": 1_000_000, "burst": 1_000_000},
                    "sessions": {"rate": 1_000_000, "burst": 1_000_000},
                }
            },
        }
    )
    results: dict[str, Any] = {"machine": measure.machine(), "load_avg_before": measure.load_average()}
    async with measure.running_stack(embedder=args.embedder, quotas=quotas) as stack:
        args.nats_url = stack.nats.url
        nc = await nats.connect(stack.nats.url)
        results["nats_request_reply"] = await measure.nats_round_trip(nc, 500)
        async with running_services(stack.settings):
            settle_heap()
            watcher, letters = WrittenWatcher(), Letters()
            await nc.subscribe("engram.memory.written", cb=watcher.on_message)
            await nc.subscribe("engram.dlq.>", cb=letters.on_message)
            orgs = {"b": uuid4(), "a0": unlimited_org, "a": limited_org}
            who: dict[str, dict[str, Any]] = {
                name: {"org": org, "agent": uuid4(), "token": measure.bench_token(org, f"service:{name}")}
                for name, org in orgs.items()
            }
            for w in who.values():
                await uncapped(nc, w["token"], w["agent"], timeout=10)
            # Something to recall for everyone (inside the budgets: a few sessions each).
            for w in who.values():
                for s in _sessions(w["org"], w["agent"], int(args.sessions_quota), f"seed{uuid4().hex[:4]}"):
                    await _publish(nc, w["token"], s)
            await _drained(nc, args.drain_s)
            # Each bucket refills before the phase that spends it.
            await asyncio.sleep(2)
            results["alone"] = await phase(nc, args, who["b"], watcher, None)
            await _drained(nc, args.drain_s)
            if "flood_no_budget" in args.phases:
                results["flood_no_budget"] = await phase(nc, args, who["b"], watcher, who["a0"])
                await _drained(nc, args.drain_s)
                await asyncio.sleep(1)  # the dead letters' core messages arrive
                _flood_accounting(results["flood_no_budget"], unlimited_org, watcher, letters)
            results["flood_over_budget"] = await phase(nc, args, who["b"], watcher, who["a"])
            await _drained(nc, args.drain_s)
            await asyncio.sleep(1)
            _flood_accounting(results["flood_over_budget"], limited_org, watcher, letters)
        await nc.drain()
    alone = results["alone"]
    for name in ("flood_no_budget", "flood_over_budget"):
        if name not in results:
            continue
        r = results[name]
        r["b_recall_p99_x_alone"] = round(r["b_recall"]["p99_ms"] / alone["b_recall"]["p99_ms"], 2)
        r["b_written_p99_x_alone"] = round(
            r["b_publish_to_written"]["p99_ms"] / alone["b_publish_to_written"]["p99_ms"], 2
        )
    results["b_dead_letters"] = {
        code: n for (org, code), n in letters.by_org.items() if org == str(orgs["b"])
    }
    results["load_avg_after"] = measure.load_average()
    results["settings"] = {k: v for k, v in vars(args).items() if k not in ("out", "nats_url")}
    return results


def render(r: dict[str, Any]) -> str:
    rtt = r["nats_request_reply"]
    rows = [
        f"Noisy neighbour — {r['machine']['cpus']} CPUs, load {r['load_avg_before']} → {r['load_avg_after']};"
        f" bare NATS request-reply p50/p99 {rtt['p50_ms']}/{rtt['p99_ms']} ms",
        "",
        "| phase | B recall p50 / p99 ms | × alone | B publish→written p50 / p99 ms | × alone | B lost | "
        "flooder recalls | flooder sessions (taken / rate-limited / lost) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in ("alone", "flood_no_budget", "flood_over_budget"):
        if name not in r:
            continue
        p = r[name]
        flood = p.get("flood")
        recalls, sessions = "—", "—"
        if flood:
            recalls = ", ".join(f"{k} {v}" for k, v in sorted(flood["recalls"].items()))
            limited = flood["sessions_dead_lettered_rate_limited"]
            sessions = f"{flood['sessions_taken']} / {limited} / {flood['sessions_lost']}"
        recall, written = p["b_recall"], p["b_publish_to_written"]
        rows.append(
            f"| {name} | {recall['p50_ms']} / {recall['p99_ms']} | {p.get('b_recall_p99_x_alone', 1.0)} | "
            f"{written['p50_ms']} / {written['p99_ms']} | {p.get('b_written_p99_x_alone', 1.0)} | "
            f"{p['b_sessions_lost']} | {recalls} | {sessions} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    parser = measure.bench_parser(__doc__, "bench-results/noisy-neighbour.json")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument(
        "--read-quota", type=float, default=20.0, help="every organization's recalls a second"
    )
    parser.add_argument(
        "--sessions-quota", type=float, default=2.0, help="every organization's sessions a second"
    )
    parser.add_argument("--b-recalls", type=float, default=10.0, help="B's recalls a second")
    parser.add_argument("--b-sessions", type=float, default=1.0, help="B's sessions a second")
    parser.add_argument("--timeout", type=float, default=5.0, help="a recall's timeout (s)")
    parser.add_argument(
        "--drain-s", type=float, default=180.0, help="how long the write path may take to drain"
    )
    parser.add_argument("--embedder", default="hashing-384", help="ENGRAM_EMBEDDER for the stack")
    parser.add_argument(
        "--phases",
        default="alone,flood_no_budget,flood_over_budget",
        help="the flood phases to run, comma-separated (alone always runs)",
    )
    parser.add_argument("--strategy", default="last_k", help="the recall strategy both organizations use")
    measure.run_bench(parser, main, render)
