"""Soak (``make soak``): does a service's resident size stay flat under steady load?
(ARCHITECTURE 7: ±10% over a 10-minute soak.)

``engram up`` runs as its own process (every service, as ``make run`` starts them) against a
fresh nats-server from the wheel and a throwaway Postgres database. This process is only the
load: sessions published at ``--session-rate`` per second (the write path, with distill and
embed) and recalls at ``--recall-rate`` per second (a mix of ``last_k``, ``semantic`` and
``hybrid``, over NATS with the development token). The service process's RSS is read from
``/proc`` every ``--sample-s`` seconds. The first ``--warmup-s`` seconds fill caches, pools and
the embedder, so the drift is measured from the end of warm-up to the end of the run.

Before the load, an idle phase (``--idle-s``, record 0089): with nothing sent, the CPU that
``engram up`` and its nats-server use (``/proc/<pid>/stat``) and their context switches (every
thread's, ``/proc/<pid>/task/*/status``: about the wake-ups) over that time, then the latency of
the first recall after it (``--idle-only`` stops there).

Results go to ``bench-results/soak.json`` and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import nats
from nats.aio.client import Client

from tests.bench.measure import summary
from tests.bench.write_path import _sessions
from tests.support.servers import nats_server, throwaway_database

ENGRAM = Path(sys.executable).parent / "engram"
CUES = ["upstream shard error", "Lyon warehouse", "ticket topic", "retry the items API", "order ships"]


def memory_mib(pid: int) -> dict[str, float]:
    """The process's resident size and its parts: anonymous (heap, allocator arenas), file-backed
    (mapped files: Qdrant Edge's shards, libraries) and shared memory, in MiB."""
    fields = {
        "VmRSS:": "rss",
        "RssAnon:": "anon",
        "RssFile:": "file",
        "RssShmem:": "shmem",
        "Threads:": "threads",
    }
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(maxsplit=1)[0] if line else ""
        if key in fields:
            value = int(line.split()[1])
            out[fields[key]] = value if key == "Threads:" else round(value / 1024, 1)
    if "rss" not in out:
        raise RuntimeError(f"no VmRSS for {pid}")
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU the process used so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def context_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of all the process's threads so far."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            text = status.read_text()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        for line in text.splitlines():
            if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                total += int(line.split()[1])
    return total


async def idle_usage(pids: dict[str, int], seconds: float) -> dict[str, dict[str, float]]:
    """Each process's share of one core (%) and context switches per second over ``seconds``
    with nothing sent to it."""
    before = {name: (cpu_seconds(pid), context_switches(pid)) for name, pid in pids.items()}
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - started
    out: dict[str, dict[str, float]] = {}
    for name, pid in pids.items():
        cpu, switches = cpu_seconds(pid) - before[name][0], context_switches(pid) - before[name][1]
        out[name] = {
            "cpu_pct": round(cpu / elapsed * 100, 2),
            "switches_per_s": round(switches / elapsed, 1),
        }
    return out


async def first_recall_ms(nc: Client, info: dict[str, Any]) -> float:
    """The latency of one ``last_k`` recall (the first request after the idle phase)."""
    body = {"agent_config_id": info["agent_config_id"], "strategy": "last_k", "top_k": 10}
    headers = {"Authorization": f"Bearer {info['token']}"}
    t0 = time.perf_counter()
    reply = await nc.request("engram.recall", json.dumps(body).encode(), headers=headers, timeout=5)
    ms = (time.perf_counter() - t0) * 1000
    if "error" in json.loads(reply.data):
        raise RuntimeError(f"the first recall after idle failed: {reply.data[:200]!r}")
    return round(ms, 2)


def rss_mib(pid: int) -> float:
    return memory_mib(pid)["rss"]


def shard_count(data_dir: Path) -> int:
    """Qdrant Edge shard directories under the data dir (live, sealed and being built)."""
    return sum(1 for path in data_dir.glob("vectors/*/*") if path.is_dir())


async def _connection(data_dir: Path, proc: subprocess.Popen[bytes], timeout: float = 120) -> dict[str, Any]:
    path = data_dir / "connection.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"engram up exited with {proc.returncode}")
        if path.exists():
            data: dict[str, Any] = json.loads(path.read_text())
            return data
        await asyncio.sleep(0.2)
    raise RuntimeError("engram up did not become ready")


async def load(
    nc: Client, info: dict[str, Any], args: argparse.Namespace, stop: asyncio.Event, out: dict[str, Any]
) -> None:
    token, org, agent = info["token"], UUID(info["org_id"]), UUID(info["agent_config_id"])
    headers = {"Authorization": f"Bearer {token}"}
    js = nc.jetstream()
    rng = random.Random(7)
    recalls: list[float] = []
    errors = 0
    sent = 0

    async def sessions() -> None:
        nonlocal sent
        batch = 0
        start = time.perf_counter()
        while not stop.is_set():
            for payload in _sessions(org, agent, int(args.session_rate), f"soak{batch}"):
                await js.publish(
                    "engram.session.ended",
                    json.dumps(payload).encode(),
                    headers={**headers, "Nats-Msg-Id": payload["event_id"]},
                )
                sent += 1
            batch += 1
            await asyncio.sleep(max(0.0, start + batch - time.perf_counter()))

    async def recall_loop() -> None:
        nonlocal errors
        interval = 1.0 / args.recall_rate
        next_at = time.perf_counter()
        while not stop.is_set():
            strategy = rng.choice(args.strategies)
            body = {"agent_config_id": str(agent), "strategy": strategy, "top_k": 10}
            if strategy != "last_k":
                body["cue"] = rng.choice(CUES)
            t0 = time.perf_counter()
            try:
                reply = await nc.request(
                    "engram.recall", json.dumps(body).encode(), headers=headers, timeout=5
                )
                if "error" in json.loads(reply.data):
                    errors += 1
                recalls.append((time.perf_counter() - t0) * 1000)
            except Exception:
                errors += 1
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))

    await asyncio.gather(sessions(), recall_loop())
    out.update(
        sessions_published=sent, recalls=len(recalls), recall_errors=errors, recall_ms=summary(recalls)
    )


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="engram-soak-") as tmp:
        async with (
            nats_server(Path(tmp) / "nats") as server,
            throwaway_database(os.environ.get("ENGRAM_TEST_DATABASE_URL"), Path(tmp)) as db_url,
        ):
            data_dir = Path(tmp) / "data"
            log_path = Path(tmp) / "engram.log"
            env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
            env.update(dict(pair.split("=", 1) for pair in args.env))
            proc = subprocess.Popen(
                [
                    str(ENGRAM),
                    "up",
                    "--data-dir",
                    str(data_dir),
                    "--nats-url",
                    server.url,
                    "--database-url",
                    db_url,
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(log_path, "wb"),  # noqa: SIM115 (closed with the process)
            )
            try:
                info = await _connection(data_dir, proc)
                nc = await nats.connect(server.url)
                out: dict[str, Any] = {}
                # Start-up's own work (the model's load, the first checkpoints) is not idling; one
                # recall before the idle phase warms what a first recall would (its queries).
                await asyncio.sleep(args.settle_s)
                warm_ms = await first_recall_ms(nc, info)
                assert server.pid is not None
                pids = {"engram": proc.pid, "nats": server.pid}
                out["idle"] = {"seconds": args.idle_s, **await idle_usage(pids, args.idle_s)}
                out["idle"]["recall_before_ms"] = warm_ms
                out["idle"]["first_recall_ms"] = await first_recall_ms(nc, info)
                print(f"[soak] idle: {out['idle']}", file=sys.stderr, flush=True)
                if args.idle_only:
                    await nc.drain()
                    return out
                stop = asyncio.Event()
                task = asyncio.create_task(load(nc, info, args, stop, out))
                samples: list[dict[str, float]] = []
                builds: list[tuple[float, str]] = []
                log_seen = 0
                started = time.perf_counter()
                while True:
                    elapsed = time.perf_counter() - started
                    samples.append(
                        {"t": round(elapsed, 1), **memory_mib(proc.pid), "shards": shard_count(data_dir)}
                    )
                    # The vector store's background builds, to line up with the RSS samples.
                    text = log_path.read_text(errors="replace")
                    for line in text[log_seen:].splitlines():
                        # A build swaps in a sealed shard, or moves a small one into the live shard.
                        if "built sealed-" in line or "into the live shard" in line:
                            builds.append((round(elapsed, 1), line.split("qdrant_edge: ", 1)[-1][:200]))
                            print(f"[soak] t={elapsed:6.0f}s {builds[-1][1]}", file=sys.stderr, flush=True)
                    log_seen = len(text)
                    m = samples[-1]
                    print(
                        f"[soak] t={elapsed:6.0f}s rss={m['rss']:.1f} MiB (anon {m['anon']:.1f}, "
                        f"file {m['file']:.1f}, shmem {m['shmem']:.1f}) threads={m['threads']} "
                        f"shards={m['shards']}",
                        file=sys.stderr,
                        flush=True,
                    )
                    if elapsed >= args.seconds:
                        break
                    await asyncio.sleep(
                        min(args.sample_s, max(0.0, started + args.seconds - time.perf_counter()))
                    )
                stop.set()
                await task
                await nc.drain()
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    after_warmup = [m for m in samples if m["t"] >= args.warmup_s]
    base, end = after_warmup[0], after_warmup[-1]
    return {
        "seconds": args.seconds,
        "warmup_s": args.warmup_s,
        "session_rate": args.session_rate,
        "recall_rate": args.recall_rate,
        "rss_mib": {
            "start": samples[0]["rss"],
            "after_warmup": base["rss"],
            "end": end["rss"],
            "max_after_warmup": max(m["rss"] for m in after_warmup),
            "drift_pct": round((end["rss"] - base["rss"]) / base["rss"] * 100, 1),
        },
        "anon_mib": {"after_warmup": base["anon"], "end": end["anon"]},
        "file_mib": {"after_warmup": base["file"], "end": end["file"]},
        "samples": samples,
        "builds": builds,
        **out,
    }


def render_idle(idle: dict[str, Any]) -> str:
    engram, server = idle["engram"], idle["nats"]
    total = round(engram["cpu_pct"] + server["cpu_pct"], 2)
    return "\n".join(
        [
            "| idle (nothing sent) | value |",
            "|---|---|",
            f"| engram up / nats-server CPU over {idle['seconds']:.0f} s (target together ≤ 1% of a core) "
            f"| {engram['cpu_pct']}% / {server['cpu_pct']}% ({total}%) |",
            f"| engram up / nats-server context switches per second | {engram['switches_per_s']} / "
            f"{server['switches_per_s']} |",
            f"| a recall before the idle phase / the first after it | {idle['recall_before_ms']} / "
            f"{idle['first_recall_ms']} ms |",
        ]
    )


def render(r: dict[str, Any]) -> str:
    rss, anon, file = r["rss_mib"], r["anon_mib"], r["file_mib"]
    verdict = "met" if abs(rss["drift_pct"]) <= 10 else "MISSED"
    return "\n".join(
        [
            "| measurement | value |",
            "|---|---|",
            f"| load | {r['session_rate']} sessions/s + {r['recall_rate']} recalls/s "
            f"for {r['seconds']:.0f} s |",
            f"| sessions published / recalls answered (errors) | {r['sessions_published']} / "
            f"{r['recalls']} ({r['recall_errors']}) |",
            f"| recall p50 / p99 under load | {r['recall_ms']['p50_ms']} / {r['recall_ms']['p99_ms']} ms |",
            f"| engram up RSS: start / after {r['warmup_s']:.0f} s warm-up / end / max | {rss['start']} / "
            f"{rss['after_warmup']} / {rss['end']} / {rss['max_after_warmup']} MiB |",
            f"| drift after warm-up (target ±10%) | {rss['drift_pct']}%: {verdict} |",
            f"| of which anonymous / file-backed, after warm-up → end | {anon['after_warmup']} → "
            f"{anon['end']} / {file['after_warmup']} → {file['end']} MiB |",
            f"| Edge shards at the end (background builds during the run) | {r['samples'][-1]['shards']} "
            f"({len(r['builds'])}) |",
        ]
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--warmup-s", type=float, default=60)
    parser.add_argument("--sample-s", type=float, default=10)
    parser.add_argument("--session-rate", type=float, default=10)
    parser.add_argument("--recall-rate", type=float, default=30)
    parser.add_argument("--idle-s", type=float, default=30, help="the idle phase before the load")
    parser.add_argument("--settle-s", type=float, default=10, help="after start-up, before the idle phase")
    parser.add_argument("--idle-only", action="store_true", help="measure the idle phase only")
    parser.add_argument("--out", type=Path, default=Path("bench-results/soak.json"))
    parser.add_argument(
        "--strategies", nargs="+", default=["last_k", "last_k", "semantic", "hybrid"], help="recall mix"
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="ENGRAM_X=value", help="settings for engram up"
    )
    arguments = parser.parse_args()
    results = asyncio.run(main(arguments))
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    arguments.out.write_text(json.dumps(results, indent=2))
    print(render_idle(results["idle"]))
    if not arguments.idle_only:
        print()
        print(render(results))
    print(f"\n(full results: {arguments.out})")
