"""Saved → searchable (``python -m tests.bench.saved_searchable``, in ``make bench``): how fast
elective saves become searchable on ``engram up``, against what the embedder does alone.

One stack as ``engram up`` runs it (a fresh nats-server, a throwaway Postgres, every service
in-process, the default embedder and Qdrant Edge), and in the same run:

- the yardstick: the bare NATS request-reply round trip;
- the embedder alone: texts/s over the same texts in batches of the embed consumer's size, on
  the services' own embedder instance, before and after the saves (the better of the two: the
  ratio is never flattered by a slow baseline);
- ``--saves`` single-entry saves (``engram.memory.save``, as a platform saves conversation turns)
  with ``--window`` requests in flight, each timed per stage: accepted (ingest's 202), stored
  (distill's entry row), ``memory.written`` (the relay's publish, as a subscriber sees it) and
  searchable (its vector upserted into the index);
- recall p50/p99 (``semantic``, distinct cues at ``--recall-rate``) alone before the saves and
  while they run.

Goal (issue 27 §2): saved → searchable ≥ 85% of the embedder alone, recall p99 not raised.
Results go to ``bench-results/saved_searchable.json`` and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from typing import Any
from uuid import UUID, uuid4

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from sqlalchemy import text

from contracts.operations import EMBED_WRITTEN
from services.runtime import build_embedder, build_vector_index, edge_store_path, running_services
from shared.adapters.vectors.edge_lock import exclusive_edge_store
from shared.ports import Embedder, VectorPoint
from shared.runtime.process_memory import settle_heap
from shared.storage.db.engine import Database
from tests.bench import measure
from tests.bench.embedder_throughput import make_cues, make_texts
from tests.bench.write_path import uncapped

GOAL = 0.85


def _say(what: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


SAVE = "engram.memory.save"
RECALL = "engram.recall"
SHARED = {"kind": "none"}


async def embedder_alone(embedder: Embedder, texts: Sequence[str], batch: int) -> dict[str, Any]:
    """Texts/s embedding ``texts`` in batches of ``batch``, as the embed service calls it."""
    started = time.perf_counter()
    for start in range(0, len(texts), batch):
        await embedder.embed(list(texts[start : start + batch]))
    elapsed = time.perf_counter() - started
    return {
        "texts": len(texts),
        "batch": batch,
        "s": round(elapsed, 3),
        "texts_per_s": round(len(texts) / elapsed, 1),
    }


class Stages:
    """Per save (keyed by its session id): wall-clock seconds at each stage."""

    def __init__(self) -> None:
        self.sent: dict[str, float] = {}
        self.accepted: dict[str, float] = {}
        self.written: dict[str, float] = {}
        self.searchable: dict[str, float] = {}
        self.batches: list[int] = []
        self.retries = 0

    async def on_written(self, msg: Msg) -> None:
        session_id = json.loads(msg.data).get("session_id")
        if session_id is not None:
            self.written.setdefault(session_id, time.time())

    def indexed(self, points: Sequence[VectorPoint]) -> None:
        now = time.time()
        self.batches.append(len(points))
        for point in points:
            if point.session_id is not None:
                self.searchable.setdefault(point.session_id, now)


async def _recall(nc: Client, token: str, agent: UUID, cue: str) -> float | None:
    """One recall's milliseconds; None when it was not answered within the edge's 10 s."""
    body = json.dumps(
        {"agent_config_id": str(agent), "strategy": "semantic", "cue": cue, "principal": SHARED}
    ).encode()
    started = time.perf_counter()
    try:
        reply = await nc.request(RECALL, body, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    except TimeoutError:
        return None
    if "error" in json.loads(reply.data):
        raise RuntimeError(f"recall failed: {reply.data[:300]!r}")
    return (time.perf_counter() - started) * 1000


async def recalls(
    nc: Client, token: str, agent: UUID, cues: list[str], rate: float, until: asyncio.Event
) -> list[float | None]:
    """Open-loop recalls at ``rate`` a second until ``until`` is set; each one's latency (None:
    not answered)."""
    tasks: list[asyncio.Task[float | None]] = []
    start = time.perf_counter()
    i = 0
    while not until.is_set():
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            try:
                await asyncio.wait_for(until.wait(), delay)
                break
            except TimeoutError:
                pass
        tasks.append(asyncio.ensure_future(_recall(nc, token, agent, cues[i % len(cues)])))
        i += 1
    return list(await asyncio.gather(*tasks))


async def save_all(
    nc: Client, token: str, agent: UUID, texts: Sequence[str], tag: str, window: int, stages: Stages
) -> None:
    """One single-entry save per text, ``window`` requests in flight."""
    gate = asyncio.Semaphore(window)

    async def one(i: int, content: str) -> None:
        session_id = f"{tag}-{i}"
        request = {
            "agent_config_id": str(agent),
            "session_id": session_id,
            "content": content,
            "principal": SHARED,
            "request_id": str(uuid4()),  # a retry after a timeout takes effect once
        }
        body = json.dumps(request).encode()
        async with gate:
            stages.sent[session_id] = time.time()
            for attempt in range(5):
                try:
                    reply = await nc.request(
                        SAVE, body, headers={"Authorization": f"Bearer {token}"}, timeout=15
                    )
                    break
                except TimeoutError:
                    stages.retries += 1
                    if attempt == 4:
                        raise
            stages.accepted[session_id] = time.time()
        if json.loads(reply.data).get("status") != 202:
            raise RuntimeError(f"save refused: {reply.data[:300]!r}")

    await asyncio.gather(*(one(i, t) for i, t in enumerate(texts)))


async def stored_at(db: Database, org: UUID, tag: str) -> dict[str, float]:
    """When distill stored each save's entry (its row's ``created_at``)."""
    async with db.read() as session:
        rows = await session.execute(
            text(
                "SELECT session_id, created_at FROM memory_entries"
                " WHERE org_id = :org AND session_id LIKE :tag"
            ),
            {"org": org, "tag": f"{tag}-%"},
        )
        return {session_id: created.timestamp() for session_id, created in rows}


def _recall_summary(ms: list[float | None]) -> dict[str, float]:
    answered = [m for m in ms if m is not None]
    return {**(measure.summary(answered) if answered else {}), "timeouts": len(ms) - len(answered)}


def _stage(ms: list[float]) -> dict[str, float]:
    return measure.summary(ms) if ms else {}


def profile(stages: Stages, stored: dict[str, float], ids: list[str]) -> dict[str, Any]:
    """Each stage's latency per save, and the time from the first send until its last save passed."""
    first = min(stages.sent[s] for s in ids)
    steps = [
        ("accepted", stages.sent, stages.accepted),
        ("stored", stages.accepted, stored),
        ("written", stored, stages.written),
        ("searchable", stages.written, stages.searchable),
    ]
    out: dict[str, Any] = {}
    for name, start, end in steps:
        out[name] = {
            "latency": _stage([(end[s] - start[s]) * 1000 for s in ids if s in start and s in end]),
            "last_s": round(max(end[s] for s in ids if s in end) - first, 3),
            "per_s": round(len(ids) / (max(end[s] for s in ids if s in end) - first), 1),
        }
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": {**measure.machine(), "load_avg_before": measure.load_average()}}
    async with measure.running_stack() as stack:
        settings = stack.settings
        nc = await nats.connect(settings.nats_url)
        results["yardstick"] = {"nats_request_reply": await measure.nats_round_trip(nc, args.rtt_samples)}
        embedder = build_embedder(settings)
        await asyncio.to_thread(embedder.load)
        stages = Stages()
        with exclusive_edge_store(edge_store_path(settings, embedder)):
            index = build_vector_index(settings, embedder)
            assert index is not None
            upsert = index.upsert

            async def timed_upsert(points: Sequence[VectorPoint]) -> None:
                await upsert(points)
                stages.indexed(points)

            index.upsert = timed_upsert  # type: ignore[method-assign]
            try:
                async with running_services(settings, embedder=embedder, vector_index=index) as infra:
                    settle_heap()
                    results |= await _run(args, nc, infra.db, embedder, stages)
            finally:
                await index.close()
                await embedder.aclose()
        await nc.drain()
    results["machine"]["load_avg_after"] = measure.load_average()
    return results


async def _run(
    args: argparse.Namespace, nc: Client, db: Database, embedder: Embedder, stages: Stages
) -> dict[str, Any]:
    org, agent = uuid4(), uuid4()
    token = measure.bench_token(org, "service:bench")
    texts = make_texts(args.saves + args.seed_entries, seed=11)
    seed_texts, save_texts = texts[: args.seed_entries], texts[args.seed_entries :]
    cues = make_cues(4000, seed=5)
    batch = EMBED_WRITTEN.batch_size
    await nc.subscribe("engram.memory.written", cb=stages.on_written)
    await uncapped(nc, token, agent, timeout=30)  # no pruning while counting
    # Something to find, and everything warm: the seed goes through the same path.
    _say("seed saves")
    await save_all(nc, token, agent, seed_texts, "seed", args.window, stages)
    await _until_searchable(stages, [f"seed-{i}" for i in range(len(seed_texts))], timeout=600)
    _say("embedder alone")
    alone_before = await embedder_alone(embedder, save_texts, batch)
    _say("recall alone")
    idle = asyncio.Event()
    recall_task = asyncio.ensure_future(recalls(nc, token, agent, cues[:2000], args.recall_rate, idle))
    await asyncio.sleep(args.recall_alone_s)
    idle.set()
    recall_alone = await recall_task
    # The saves, with recalls going on until the last is searchable.
    tag = f"s{uuid4().hex[:6]}"
    ids = [f"{tag}-{i}" for i in range(len(save_texts))]
    done = asyncio.Event()
    recall_task = asyncio.ensure_future(recalls(nc, token, agent, cues[2000:], args.recall_rate, done))
    _say("saves")
    first_batch = len(stages.batches)
    started = time.time()
    progress = asyncio.ensure_future(_progress(stages, ids))
    await save_all(nc, token, agent, save_texts, tag, args.window, stages)
    await _until_searchable(stages, ids, timeout=1200)
    progress.cancel()
    done.set()
    recall_during = await recall_task
    elapsed = max(stages.searchable[s] for s in ids) - started
    _say("embedder alone again")
    alone_after = await embedder_alone(embedder, save_texts, batch)
    alone = max(alone_before["texts_per_s"], alone_after["texts_per_s"])
    searchable_per_s = round(len(ids) / elapsed, 1)
    stored = await stored_at(db, org, tag)
    batches = stages.batches[first_batch:]
    return {
        "saves": len(ids),
        "window": args.window,
        "save_retries": stages.retries,
        "embedder_alone": {"before": alone_before, "after": alone_after, "texts_per_s": alone},
        "saved_to_searchable": {"elapsed_s": round(elapsed, 3), "per_s": searchable_per_s},
        "ratio": round(searchable_per_s / alone, 3),
        "stages": profile(stages, stored, ids),
        "upsert_batches": {
            "count": len(batches),
            "mean_points": round(sum(batches) / max(1, len(batches)), 1),
        },
        "recall_alone": _recall_summary(recall_alone),
        "recall_during": _recall_summary(recall_during),
    }


async def _progress(stages: Stages, ids: list[str]) -> None:
    while True:
        await asyncio.sleep(10)
        counts = [
            sum(1 for s in ids if s in seen) for seen in (stages.accepted, stages.written, stages.searchable)
        ]
        _say("accepted {} / written {} / searchable {} of {}".format(*counts, len(ids)))


async def _until_searchable(stages: Stages, ids: list[str], timeout: float) -> None:
    deadline = time.perf_counter() + timeout
    while missing := sum(1 for s in ids if s not in stages.searchable):
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{missing} of {len(ids)} saves not searchable within {timeout}s")
        await asyncio.sleep(0.05)


def _recall_row(r: dict[str, Any]) -> str:
    asked = r.get("n", 0) + r["timeouts"]
    return f"{r.get('p50_ms')} / {r.get('p99_ms')} ms ({r['timeouts']} unanswered of {asked})"


def render(results: dict[str, Any]) -> str:
    y = results["yardstick"]["nats_request_reply"]
    alone, flow = results["embedder_alone"], results["saved_to_searchable"]
    verdict = "met" if results["ratio"] >= GOAL else "MISSED"
    rows = [
        "| measurement | value |",
        "|---|---|",
        f"| bare NATS request-reply p50 / p99 | {y['p50_ms']} / {y['p99_ms']} ms |",
        f"| embedder alone (batches of {alone['before']['batch']}) | {alone['texts_per_s']} texts/s "
        f"(before {alone['before']['texts_per_s']}, after {alone['after']['texts_per_s']}) |",
        f"| saved → searchable | {flow['per_s']} /s ({results['saves']} saves in {flow['elapsed_s']} s) |",
        f"| ratio (goal ≥ {GOAL:.0%}) | {results['ratio']:.0%}: {verdict} |",
        f"| recall p50 / p99 alone | {_recall_row(results['recall_alone'])} |",
        f"| recall p50 / p99 while saving | {_recall_row(results['recall_during'])} |",
        f"| save requests retried after a timeout | {results['save_retries']} |",
        f"| vector upserts | {results['upsert_batches']['count']} of "
        f"{results['upsert_batches']['mean_points']} points on average |",
        "",
        "| stage (from the previous) | p50 / p99 ms | last one after | throughput |",
        "|---|---|---|---|",
    ]
    for name, stage in results["stages"].items():
        lat = stage["latency"]
        rows.append(
            f"| {name} | {lat.get('p50_ms')} / {lat.get('p99_ms')} | {stage['last_s']} s "
            f"| {stage['per_s']} /s |"
        )
    rows.append("")
    rows.append(measure.machine_note(results["machine"]))
    return "\n".join(rows)


if __name__ == "__main__":
    parser = measure.bench_parser(__doc__, "bench-results/saved_searchable.json")
    parser.add_argument("--saves", type=int, default=3000)
    parser.add_argument("--seed-entries", type=int, default=300, help="saved and indexed first")
    parser.add_argument("--window", type=int, default=64, help="save requests in flight")
    parser.add_argument("--recall-rate", type=float, default=2.0, help="recalls per second")
    parser.add_argument("--recall-alone-s", type=float, default=15.0)
    parser.add_argument("--rtt-samples", type=int, default=2000)
    measure.run_bench(parser, main, render)
