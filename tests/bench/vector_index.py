"""Vector index micro-benchmark: ``python -m tests.bench.vector_index``.

Qdrant Edge with 100k vectors in one agent config plus 50 other agent configs x 1k (filtered
top-10, p50/p99): searched exactly before indexing, while the builder process indexes (with the
longest event-loop stall seen meanwhile), and after indexing, directly and through
``asyncio.to_thread``. Then qdrant-client's local mode at 20k (it is slow beyond that). Recall@10
is measured against a brute-force search of the same tenant. Prints a markdown table.

``--data random`` (the default) draws i.i.d. Gaussian vectors: no neighbourhood structure, the
hardest case for an HNSW graph (slowest to build, lowest recall). ``--data clustered`` draws them
around 1,000 centres, closer to what text embeddings look like.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from uuid import UUID, uuid4

import numpy as np
from qdrant_client import AsyncQdrantClient

from shared.adapters.vectors._tenancy import tenant_conditions
from shared.adapters.vectors.qdrant_edge import QdrantEdgeIndex
from shared.adapters.vectors.qdrant_server import QdrantServerIndex
from shared.ports import TenantFilter, VectorHit, VectorIndex, VectorPoint

Search = Callable[[list[float]], Awaitable[list[VectorHit]]]
Row = tuple[str, int, str, int, float, float, str]


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _vectors(rng: np.random.Generator, count: int, dimension: int, centres: np.ndarray | None) -> np.ndarray:
    """Unit vectors: i.i.d. Gaussian, or around ``centres`` (data and queries share them)."""
    raw = rng.standard_normal((count, dimension))
    if centres is not None:
        raw = centres[rng.integers(0, len(centres), count)] + 0.5 * raw
    return (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(np.float32)


class Corpus:
    """One big agent config (owners ``""`` and ``u1``) and many small ones, in one org."""

    def __init__(self, big: int, others: int, per_other: int, dimension: int, data: str) -> None:
        rng = np.random.default_rng(42)
        centres = rng.standard_normal((1_000, dimension)) if data == "clustered" else None
        self.org = uuid4()
        self.big_agent = uuid4()
        self.big = _vectors(rng, big, dimension, centres)
        self.big_ids = [uuid4() for _ in range(big)]
        self.others = [(uuid4(), _vectors(rng, per_other, dimension, centres)) for _ in range(others)]
        self.queries = _vectors(rng, 1_000, dimension, centres)
        self.tenant = TenantFilter(self.org, self.big_agent, ("", "u1"))

    def __len__(self) -> int:
        return len(self.big) + sum(len(vectors) for _, vectors in self.others)

    def batches(self, size: int = 1_000) -> Iterator[list[VectorPoint]]:
        """All points, ``size`` at a time (as lists of floats they would take gigabytes at once)."""
        now = time.time()
        rows = [(point_id, self.big_agent, "" if i % 2 else "u1") for i, point_id in enumerate(self.big_ids)]
        vectors = [self.big]
        for agent, others in self.others:
            rows.extend((uuid4(), agent, "") for _ in range(len(others)))
            vectors.append(others)
        matrix = np.concatenate(vectors)
        for start in range(0, len(rows), size):
            chunk = rows[start : start + size]
            yield [
                self._point(point_id, vector, agent, owner, now)
                for (point_id, agent, owner), vector in zip(chunk, matrix[start : start + size], strict=True)
            ]

    def _point(self, point_id: UUID, vector: np.ndarray, agent: UUID, owner: str, now: float) -> VectorPoint:
        return VectorPoint(point_id, vector.tolist(), self.org, agent, owner, "semantic", "lesson", None, now)

    def exact_top10(self, query: np.ndarray) -> set[UUID]:
        scores = self.big @ query
        return {self.big_ids[i] for i in np.argpartition(-scores, 10)[:10]}


async def _load(index: VectorIndex, corpus: Corpus) -> float:
    """Upsert the whole corpus in batches of 1,000; points per second."""
    started = time.perf_counter()
    for batch in corpus.batches():
        await index.upsert(batch)
    return len(corpus) / (time.perf_counter() - started)


async def _measure(search: Search, corpus: Corpus, n: int, warmup: int = 20) -> tuple[list[float], float]:
    """Latencies in ms of ``n`` searches, and their recall@10 against brute force."""
    latencies, recalls = [], []
    for i in range(n + warmup):
        query = corpus.queries[i % len(corpus.queries)]
        started = time.perf_counter()
        hits = await search(query.tolist())
        elapsed = (time.perf_counter() - started) * 1000
        if i >= warmup:
            latencies.append(elapsed)
            recalls.append(len({hit.id for hit in hits} & corpus.exact_top10(query)) / 10)
    return latencies, statistics.fmean(recalls)


async def _stall_watch(stop: asyncio.Event) -> float:
    """The longest the event loop was away while ``stop`` was unset, in ms."""
    worst, last = 0.0, time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    return worst * 1000


async def bench_edge(corpus: Corpus, dimension: int, queries: int, rows: list[Row], notes: list[str]) -> None:
    n = len(corpus)
    with tempfile.TemporaryDirectory() as root:
        # Sealing is left to the explicit build below, so the table shows one build of everything.
        index = QdrantEdgeIndex(Path(root) / "edge", dimension, seal_threshold=n + 1)
        rate = await _load(index, corpus)
        notes.append(f"Edge upserts: {rate:,.0f} points/s ({n:,} points, batches of 1,000)")

        async def direct(query: list[float]) -> list[VectorHit]:
            return await index.search(query, corpus.tenant, 10)

        conditions = tenant_conditions(corpus.tenant)
        assert conditions is not None

        async def threaded(query: list[float]) -> list[VectorHit]:
            return await asyncio.to_thread(index._search_now, query, conditions, 10)

        latencies, recall = await _measure(direct, corpus, max(20, queries // 20))
        rows.append(
            ("Qdrant Edge", n, "before indexing (exact)", len(latencies), *_p(latencies), f"{recall:.3f}")
        )

        stop = asyncio.Event()
        watch = asyncio.create_task(_stall_watch(stop))
        started = time.perf_counter()
        build = asyncio.create_task(index.build_index())
        during: list[float] = []
        while not build.done():
            lat, _ = await _measure(direct, corpus, 1, warmup=0)
            during.extend(lat)
            await asyncio.sleep(0.25)  # leave the builder most of the CPU
        await build
        built_s = time.perf_counter() - started
        stop.set()
        stall = await watch
        rows.append(("Qdrant Edge", n, "during the background build", len(during), *_p(during), "-"))
        stats = await index.stats()
        notes.append(
            f"Edge build (export, HNSW in a child process, swap): {built_s:.1f} s; longest event-loop "
            f"stall meanwhile: {stall:.0f} ms; {stats.indexed_vectors:,} vectors in HNSW graphs"
        )

        # Direct call or asyncio.to_thread, alternating query by query so drift hits both alike.
        timings: dict[str, list[float]] = {"direct call": [], "to_thread": []}
        recalls = []
        for i in range(queries + 20):
            query = corpus.queries[i % len(corpus.queries)].tolist()
            order = (("direct call", direct), ("to_thread", threaded))
            for label, search in order if i % 2 else order[::-1]:
                started = time.perf_counter()
                hits = await search(query)
                if i >= 20:
                    timings[label].append((time.perf_counter() - started) * 1000)
            if i >= 20:
                found = {hit.id for hit in hits}
                recalls.append(len(found & corpus.exact_top10(corpus.queries[i % len(corpus.queries)])) / 10)
        for label, latencies in timings.items():
            recall = f"{statistics.fmean(recalls):.3f}"
            rows.append(
                ("Qdrant Edge", n, f"after indexing, {label}", len(latencies), *_p(latencies), recall)
            )
        await index.close()


async def bench_server_local(corpus: Corpus, dimension: int, queries: int, rows: list[Row]) -> None:
    client = AsyncQdrantClient(":memory:")
    index = QdrantServerIndex(client, "bench", dimension)
    await _load(index, corpus)

    async def search(query: list[float]) -> list[VectorHit]:
        return await index.search(query, corpus.tenant, 10)

    latencies, recall = await _measure(search, corpus, queries, warmup=3)
    rows.append(
        (
            "qdrant-client local mode",
            len(corpus),
            "exact (no index)",
            len(latencies),
            *_p(latencies),
            f"{recall:.3f}",
        )
    )
    await client.close()


def _p(latencies: Sequence[float]) -> tuple[float, float]:
    return _pct(latencies, 0.50), _pct(latencies, 0.99)


def render(rows: list[Row], notes: list[str]) -> str:
    lines = [
        "| adapter | points | state | searches | p50 ms | p99 ms | recall@10 |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {a} | {n:,} | {s} | {q} | {p50:.3f} | {p99:.3f} | {r} |" for a, n, s, q, p50, p99, r in rows
    ]
    return "\n".join([*lines, "", *(f"- {note}" for note in notes)])


async def main(args: argparse.Namespace) -> str:
    import logging
    import warnings

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    logging.getLogger("shared.adapters.vectors").setLevel(logging.INFO)  # the build's timings, on stderr
    warnings.filterwarnings("ignore", message="Payload indexes have no effect in the local Qdrant")
    warnings.filterwarnings("ignore", message="Local mode is not recommended")
    rows: list[Row] = []
    notes = [
        f"data: {args.data} unit vectors, {args.dimension} dimensions; filter: org, agent config, 2 owners"
    ]
    edge_corpus = Corpus(args.points, args.others, args.per_other, args.dimension, args.data)
    await bench_edge(edge_corpus, args.dimension, args.queries, rows, notes)
    local_corpus = Corpus(args.local_points, 10, args.per_other, args.dimension, args.data)
    await bench_server_local(local_corpus, args.dimension, args.local_queries, rows)
    return render(rows, notes)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", choices=["random", "clustered"], default="random")
    parser.add_argument("--dimension", type=int, default=384)
    parser.add_argument("--points", type=int, default=100_000, help="in the agent config searched")
    parser.add_argument("--others", type=int, default=50, help="other agent configs")
    parser.add_argument("--per-other", type=int, default=1_000)
    parser.add_argument("--queries", type=int, default=1_000)
    parser.add_argument("--local-points", type=int, default=20_000)
    parser.add_argument("--local-queries", type=int, default=100)
    print(asyncio.run(main(parser.parse_args())))
