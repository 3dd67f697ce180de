"""The :class:`~shared.ports.VectorIndex` in-process on Qdrant Edge: the embedded default.

Layout under ``path``::

    manifest.json     which directories below are the index (replaced atomically)
    live-NNNNNN/      the appendable shard: takes every write, never indexed, searched exactly
    sealed-NNNNNN/    HNSW-indexed shards made by the builder process, plus former live shards
                      waiting for their build (searched exactly until it lands)
    build-NNNNNN/     a build in progress (removed on open if a crash left it)

Why not ``optimize()`` on a thread: qdrant-edge-py 0.9 holds the GIL for every call, and
``optimize()`` runs for minutes at 100k points (145 s for 150k x 384 on 2 cores), so the event loop
would freeze for all of it. Instead, when the live shard holds ``seal_threshold`` points a
background task seals it (a new live shard takes the writes), exports the sealed points, lets a
child process (:mod:`shared.adapters.vectors._edge_build`) build an indexed shard from them, and swaps it
in. Builds are size-tiered: each merges the new points with the newest indexed shards no bigger
than ``merge_ratio`` times what it merges already, so there are few shards to search and each
point is rebuilt a few times, not once per seal.

A background build left with fewer than ``absorb_below`` points (churn under a cap: prune and
expiry delete about as fast as sessions write) makes no shard: its points go back into the live
shard. Such a shard would get no HNSW graph (it is under Edge's indexing threshold) and be searched
exactly, as the live shard is, yet every loaded shard costs a fixed ~30-60 MiB of resident memory
whatever it holds (Edge pre-faults the mapped files of its appendable segment on load: 5 MiB per
keyword index, a 32 MiB vector chunk) and a search thread pool. ``make soak`` measured it: each
such build raised ``engram up``'s RSS by 60 MiB until the next one (docs/benchmarks.md,
"2026-12-01 — Resident size under make soak"; docs/adr/0044-edge-sealed-shards.md).

Every id lives in exactly one shard: a write or delete first removes the id from the sealed
shards (and remembers it while a build runs, to remove it from the build's result too).
Searches ask every shard with the same tenant filter and merge by score.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from uuid import UUID

from qdrant_edge import EdgeShard, Point, Query, QueryRequest, ScoredPoint, UpdateOperation

from contracts.errors import EmbeddingDimensionMismatch
from shared.adapters.vectors._edge_build import SHARD_DIR
from shared.adapters.vectors._edge_shards import (
    BUILD_PREFIX,
    LIVE_PREFIX,
    MANIFEST,
    SEALED_PREFIX,
    BuildInterrupted,
    BuildSpec,
    Generation,
    Manifest,
    best_hits,
    create_shard,
    edge_filter,
    edge_point,
    export_points,
    live_config,
    read_points,
    sparse_query,
)
from shared.adapters.vectors._tenancy import (
    Condition,
    TenantGatedSearch,
    check_dimension,
    payload_of,
)
from shared.ports import VectorHit, VectorPoint
from shared.runtime.background import PeriodicWorker
from shared.text.lexical import LEXICAL_VECTOR

__all__ = ["EdgeIndexStats", "QdrantEdgeIndex"]

log = logging.getLogger(__name__)

#: Points per Edge call when writing: Edge holds the GIL inside each call, so big batches go in
#: pieces and the event loop gets a turn between them.
_WRITE_CHUNK = 256
#: Flush the live shard after this many writes: Edge's flush holds the GIL for ~6 us a point
#: written since the last one (0.9 s after 150k), so it goes in small steps.
_FLUSH_EVERY = 2_048
#: A built shard that lost this share of its points to deletes is rebuilt (vacuumed).
_VACUUM_SHARE = 0.2
#: Where ``shared`` is importable from, for the builder process.
_IMPORT_ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class EdgeIndexStats:
    """What the index holds, for health checks, tests and benchmarks."""

    points: int
    #: Points not through a build yet: in the live shard and in sealed shards awaiting theirs.
    pending_points: int
    shards: int
    #: Vectors in an HNSW graph (Edge leaves shards under its indexing threshold as plain ones).
    indexed_vectors: int
    #: Whether a builder process is making an indexed shard right now.
    building: bool


@dataclass(frozen=True)
class _Sealed:
    generation: Generation
    shard: EdgeShard


class QdrantEdgeIndex(TenantGatedSearch):
    """Entry vectors in Qdrant Edge shards under ``path`` (cosine), tenancy fields in the payload.

    Created on first use, loaded if ``path`` holds one already. The tuning knobs are for tests and
    benchmarks; the defaults suit 384-dimensional embeddings.
    """

    def __init__(
        self,
        path: Path,
        dimension: int,
        *,
        seal_threshold: int = 4_096,
        check_interval_s: float = 30.0,
        merge_ratio: float = 4.0,
        absorb_below: int | None = None,
        indexing_threshold_kb: int | None = None,
        full_scan_threshold_kb: int = 10_000,
    ) -> None:
        if dimension < 1:
            raise ValueError(f"dimension must be positive, got {dimension}")
        if seal_threshold < 1:
            raise ValueError(f"seal_threshold must be positive, got {seal_threshold}")
        if merge_ratio <= 0:
            raise ValueError(f"merge_ratio must be positive, got {merge_ratio}")
        if absorb_below is not None and not 0 <= absorb_below <= seal_threshold // 2:
            raise ValueError(f"absorb_below must be between 0 and seal_threshold / 2, got {absorb_below}")
        self.dimension = dimension
        self._path = Path(path)
        self._spec = BuildSpec(dimension, indexing_threshold_kb, full_scan_threshold_kb)
        self._seal_threshold = seal_threshold
        self._check_interval_s = check_interval_s
        self._merge_ratio = merge_ratio
        #: Below this many points a background build goes back into the live shard. A quarter of
        #: ``seal_threshold`` keeps the live shard well short of sealing again at once.
        self._absorb_below = seal_threshold // 4 if absorb_below is None else absorb_below
        self._manifest: Manifest | None = None
        self._live: EdgeShard | None = None
        self._sealed: list[_Sealed] = []
        #: Held for writes, deletes, sealing and swapping shards; never by searches.
        self._write_lock = asyncio.Lock()
        #: One build at a time (the background one, or :meth:`build_index`).
        self._build_lock = asyncio.Lock()
        self._closed = asyncio.Event()
        self._maintainer: _Maintainer | None = None
        self._builder: asyncio.subprocess.Process | None = None
        #: Ids written or deleted while a build runs: its result must not bring them back.
        self._changed_during_build: set[UUID] | None = None
        self._unflushed = 0
        #: Points written to the live shard since it was started, deleted ones included: churn
        #: under a cap (prune, expiry) keeps its live count low while its storage still grows.
        self._live_writes = 0

    # -- the port -------------------------------------------------------------------------

    async def upsert(self, points: Sequence[VectorPoint]) -> None:
        for point in points:
            check_dimension(point.vector, self.dimension)
        if not points:
            return
        await self._open()
        async with self._write_lock:
            await asyncio.to_thread(self._write, points)
        if self._live_full() and self._maintainer is not None:
            self._maintainer.wake()

    async def delete(self, ids: Sequence[UUID]) -> None:
        if not ids:
            return
        await self._open()
        async with self._write_lock:
            await asyncio.to_thread(self._delete, list(ids))

    async def _query_vector(
        self, vector: Sequence[float], conditions: Sequence[Condition], limit: int
    ) -> list[VectorHit]:
        await self._open()
        # Called directly, not through asyncio.to_thread: Edge holds the GIL while it searches,
        # so a thread buys no concurrency and only adds the hop. Measured by tests/bench/
        # vector_index.py (100k points in the agent config + 50k in 50 others, 384-d, filtered
        # top-10, after indexing, 2 shared cores): p50 0.89 ms direct vs 1.16 ms via to_thread,
        # p99 6.7 ms vs 9.0 ms.
        return self._search_now(vector, conditions, limit)

    async def _query_lexical(
        self, terms: Mapping[int, float], conditions: Sequence[Condition], limit: int
    ) -> list[VectorHit]:
        await self._open()
        # Directly, like search(): Edge holds the GIL either way.
        query = Query.Nearest(sparse_query(dict(terms)), using=LEXICAL_VECTOR)
        return self._query_now(QueryRequest(limit=limit, query=query, filter=edge_filter(conditions)), limit)

    def _search_now(
        self, vector: Sequence[float], conditions: Sequence[Condition], limit: int
    ) -> list[VectorHit]:
        request = QueryRequest(limit=limit, query=Query.Nearest(list(vector)), filter=edge_filter(conditions))
        return self._query_now(request, limit)

    def _query_now(self, request: QueryRequest, limit: int) -> list[VectorHit]:
        found: list[ScoredPoint] = []
        for shard in self._shards():
            found.extend(shard.query(request))
        return best_hits(found, limit)

    async def count(self) -> int:
        await self._open()
        return sum(shard.info().points_count for shard in self._shards())

    async def close(self) -> None:
        """Stop building (a build in progress is abandoned), flush and close every shard."""
        self._closed.set()
        builder = self._builder
        if builder is not None and builder.returncode is None:
            builder.kill()
        if self._maintainer is not None:
            await self._maintainer.stop()
        async with self._build_lock, self._write_lock:
            shards = self._shards() if self._live is not None else []
            self._live, self._sealed = None, []
            await asyncio.to_thread(_flush_and_close, shards)

    # -- beyond the port ------------------------------------------------------------------

    async def build_index(self) -> None:
        """Seal what was written so far and wait until the builder process has indexed it.

        The background task does this by itself; tests and benchmarks call it to reach the
        indexed state when they choose.
        """
        await self._open()
        await self._build(seal=True, absorb=False)

    async def stats(self) -> EdgeIndexStats:
        await self._open()
        live = self._live_shard.info().points_count
        sealed = [(entry.generation.built, entry.shard.info()) for entry in self._sealed]
        pending = sum(info.points_count for built, info in sealed if not built)
        return EdgeIndexStats(
            points=live + sum(info.points_count for _, info in sealed),
            pending_points=live + pending,
            shards=1 + len(sealed),
            indexed_vectors=sum(info.indexed_vectors_count for _, info in sealed),
            building=self._builder is not None,
        )

    # -- writes (on a worker thread, under the write lock) ----------------------------------

    def _write(self, points: Sequence[VectorPoint]) -> None:
        for start in range(0, len(points), _WRITE_CHUNK):
            chunk = points[start : start + _WRITE_CHUNK]
            self._forget_sealed([point.id for point in chunk])
            self._append(
                [
                    edge_point(point.id, list(point.vector), dict(point.lexical), payload_of(point))
                    for point in chunk
                ]
            )

    def _append(self, points: list[Point]) -> None:
        """Upsert ``points`` (one chunk) into the live shard."""
        self._live_writes += len(points)
        self._live_shard.update(UpdateOperation.upsert_points(points))
        self._flush_now_and_then(len(points))

    def _delete(self, ids: list[UUID]) -> None:
        self._forget_sealed(ids)
        self._live_shard.update(UpdateOperation.delete_points(list(ids)))
        self._flush_now_and_then(len(ids))

    def _flush_now_and_then(self, written: int) -> None:
        self._unflushed += written
        if self._unflushed >= _FLUSH_EVERY:
            _flush(self._shards())
            self._unflushed = 0

    def _forget_sealed(self, ids: list[UUID]) -> None:
        """Keep each id in one shard: drop older copies before it is written again or deleted.
        Removing the older copy first means a crash in between loses the write (which the caller
        was not told succeeded, so it comes again) rather than leaving two copies."""
        if self._changed_during_build is not None:
            self._changed_during_build.update(ids)
        for entry in self._sealed:
            entry.shard.update(UpdateOperation.delete_points(list(ids)))

    # -- opening ------------------------------------------------------------------------------

    async def _open(self) -> None:
        if self._closed.is_set():
            raise RuntimeError(f"the vector index at {self._path} is closed")
        if self._live is not None:
            return
        async with self._write_lock:
            if self._live is None:
                await asyncio.to_thread(self._load_or_create)
                # Its first pass rebuilds a sealed shard whose build a crash interrupted.
                self._maintainer = _Maintainer(
                    self._maintain, self._check_interval_s, f"qdrant-edge:{self._path}"
                )
                await self._maintainer.start()

    def _load_or_create(self) -> None:
        root = self._path
        root.mkdir(parents=True, exist_ok=True)
        manifest = Manifest.load(root)
        _remove_leftovers(root, keep=manifest.names() if manifest is not None else set())
        if manifest is None:
            foreign = sorted(child.name for child in root.iterdir())
            if foreign:
                raise ValueError(
                    f"{root} holds {foreign[:3]} but no {MANIFEST}: give the vector index an empty "
                    "directory (or one it made)"
                )
            manifest = Manifest(dimension=self.dimension, live="")
            manifest.live = manifest.new_name(LIVE_PREFIX)
            live = create_shard(root / manifest.live, live_config(self.dimension))
            manifest.save(root)
        elif manifest.dimension != self.dimension:
            raise EmbeddingDimensionMismatch(
                f"the vector index at {root} holds {manifest.dimension}-dimensional vectors, the "
                f"embedder makes {self.dimension}: point it at a new directory and reindex",
                {"expected": self.dimension, "got": manifest.dimension},
            )
        else:
            live = EdgeShard.load(str(root / manifest.live))
            try:
                for generation in manifest.generations:
                    self._sealed.append(_Sealed(generation, EdgeShard.load(str(root / generation.name))))
            except BaseException:
                _flush_and_close([live, *(entry.shard for entry in self._sealed)])
                self._sealed = []
                raise
        self._manifest, self._live = manifest, live

    # -- background indexing ----------------------------------------------------------------

    async def _maintain(self) -> None:
        """Build when the live shard is full, or when a sealed shard awaits (re)building;
        otherwise checkpoint the shards (the maintainer runs this every ``check_interval_s``)."""
        if self._closed.is_set():
            return
        try:
            full = self._live_full()
            if full or self._pick_inputs():
                await self._build(seal=full, absorb=True)
            else:
                async with self._build_lock:  # a build may be closing shards
                    await asyncio.to_thread(_flush, self._shards())
        except BuildInterrupted:
            return
        except Exception:
            log.exception("building the vector index under %s failed; trying again later", self._path)

    async def _build(self, *, seal: bool, absorb: bool) -> None:
        """Seal the live shard (if ``seal``) and build what awaits; with ``absorb``, a build of
        fewer than ``absorb_below`` points goes back into the live shard instead."""
        async with self._build_lock:
            if self._closed.is_set():
                raise BuildInterrupted(f"the vector index at {self._path} is closed")
            if seal:
                await self._seal_live()
            inputs = self._pick_inputs()
            if inputs:
                await self._rebuild(inputs, absorb_below=self._absorb_below if absorb else 1)

    def _live_full(self) -> bool:
        """Seal when the live shard holds ``seal_threshold`` points, or has taken that many writes,
        or a quarter of that many of its points were deleted since: its build keeps only the
        points still there, which is how deleted ones leave storage (and memory, as the shards'
        files are mapped)."""
        points = self._live_shard.info().points_count
        return (
            points >= self._seal_threshold
            or self._live_writes >= self._seal_threshold
            or self._live_writes - points >= self._seal_threshold // 4
        )

    async def _seal_live(self) -> None:
        """Start a new live shard; the old one becomes a sealed shard waiting for its build (or,
        when everything in it was deleted, goes away at once)."""
        async with self._write_lock:
            manifest, old = self._manifest_now, self._live_shard
            points = old.info().points_count
            name = manifest.new_name(LIVE_PREFIX)
            new = await asyncio.to_thread(create_shard, self._path / name, live_config(self.dimension))
            self._live_writes = 0
            if points == 0:
                emptied = _Sealed(Generation(manifest.live, built=False, points=0), old)
                await self._commit(replace(manifest, live=name), self._sealed)
                self._live = new
                await asyncio.to_thread(_close_and_remove, [emptied], self._path)
                return
            generation = Generation(manifest.live, built=False, points=points)
            await self._commit(
                replace(manifest, live=name, generations=[*manifest.generations, generation]),
                [*self._sealed, _Sealed(generation, old)],
            )
            self._live = new

    def _pick_inputs(self) -> list[_Sealed]:
        """What the next build merges: every sealed shard not built yet or that lost a fifth of
        its points to deletes, then, newest first, each built one no bigger than ``merge_ratio``
        times the points merged so far."""
        sizes = {entry.generation.name: entry.shard.info().points_count for entry in self._sealed}
        chosen = [
            entry
            for entry in self._sealed
            if not entry.generation.built
            or sizes[entry.generation.name] < (1 - _VACUUM_SHARE) * entry.generation.points
        ]
        if not chosen:
            return []
        total = sum(sizes[entry.generation.name] for entry in chosen)
        for entry in reversed(self._sealed):
            if entry in chosen:
                continue
            if sizes[entry.generation.name] > self._merge_ratio * total:
                break
            chosen.append(entry)
            total += sizes[entry.generation.name]
        return chosen

    async def _rebuild(self, inputs: list[_Sealed], *, absorb_below: int) -> None:
        """Export ``inputs``, build one indexed shard from them in a child process, swap it in;
        or, when fewer than ``absorb_below`` points were exported, move them into the live shard."""
        manifest = self._manifest_now
        build_dir = self._path / manifest.new_name(BUILD_PREFIX)
        async with self._write_lock:  # no write is half done: each is recorded or exported whole
            self._changed_during_build = set()
        built: EdgeShard | None = None
        clock = _Stopwatch()
        try:
            build_dir.mkdir()
            self._spec.save(build_dir)
            exported = await export_points([entry.shard for entry in inputs], build_dir, self._closed.is_set)
            clock.lap("export")
            if exported < absorb_below:
                await self._absorb(inputs, build_dir)
                clock.lap("absorb")
                log.info(
                    "moved %d points of %d shard(s) into the live shard in %s",
                    exported,
                    len(inputs),
                    clock,
                    extra={"points": exported},
                )
                return
            name = manifest.new_name(SEALED_PREFIX)
            if exported:
                await self._run_builder(build_dir)
                clock.lap("build")
                await asyncio.to_thread(os.replace, build_dir / SHARD_DIR, self._path / name)
                built = await asyncio.to_thread(EdgeShard.load, str(self._path / name))
                clock.lap("load")
            await self._swap(inputs, name, built)
            clock.lap("swap")
            log.info(
                "built %s from %d points of %d shard(s) in %s",
                name,
                exported,
                len(inputs),
                clock,
                extra={"vector_shard": name, "points": exported},
            )
        except BaseException:
            if built is not None:
                await asyncio.to_thread(_flush_and_close, [built])
            raise
        finally:
            self._changed_during_build = None
            await asyncio.to_thread(shutil.rmtree, build_dir, True)

    async def _run_builder(self, build_dir: Path) -> None:
        path = os.pathsep.join(filter(None, [str(_IMPORT_ROOT), os.environ.get("PYTHONPATH")]))
        builder = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shared.adapters.vectors._edge_build",
            str(build_dir),
            env={**os.environ, "PYTHONPATH": path},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        self._builder = builder
        if self._closed.is_set():  # close() came while it started
            builder.kill()
        try:
            _, stderr = await builder.communicate()
        finally:
            self._builder = None
        if self._closed.is_set():
            raise BuildInterrupted(f"the vector index at {self._path} closed during a build")
        if builder.returncode != 0:
            tail = stderr.decode(errors="replace")[-2000:]
            raise RuntimeError(f"the index builder for {build_dir} exited with {builder.returncode}: {tail}")

    async def _absorb(self, inputs: list[_Sealed], build_dir: Path) -> None:
        """Replace ``inputs`` by their exported points in the live shard, minus what changed
        meanwhile (written again or deleted: the live shard has the newer state already).

        The live shard takes the points (flushed) before the manifest drops ``inputs``: a crash in
        between leaves an id in two shards with the same vector, which searches return once
        (``best_hits`` keeps each id once) and the next write or delete of that id settles; the
        other order could lose it."""
        async with self._write_lock:
            changed = self._changed_during_build or set()
            for chunk in read_points(build_dir, self.dimension, _WRITE_CHUNK, skip=changed):
                await asyncio.to_thread(self._append, chunk)
            await asyncio.to_thread(self._live_shard.flush)  # on disk before the manifest says so
            sealed = [entry for entry in self._sealed if entry not in inputs]
            manifest = self._manifest_now
            await self._commit(replace(manifest, generations=[entry.generation for entry in sealed]), sealed)
        await asyncio.to_thread(_close_and_remove, inputs, self._path)

    async def _swap(self, inputs: list[_Sealed], name: str, built: EdgeShard | None) -> None:
        """Replace ``inputs`` by ``built`` (if any point survived), minus what changed meanwhile."""
        async with self._write_lock:
            changed = self._changed_during_build
            if built is not None and changed:
                await asyncio.to_thread(built.update, UpdateOperation.delete_points(list(changed)))
            sealed = [entry for entry in self._sealed if entry not in inputs]
            if built is not None:
                # where the oldest input was: sizes stay roughly oldest (largest) first
                position = min(self._sealed.index(entry) for entry in inputs)
                generation = Generation(name, built=True, points=built.info().points_count)
                sealed.insert(position, _Sealed(generation, built))
            manifest = self._manifest_now
            await self._commit(replace(manifest, generations=[entry.generation for entry in sealed]), sealed)
        await asyncio.to_thread(_close_and_remove, inputs, self._path)

    async def _commit(self, manifest: Manifest, sealed: list[_Sealed]) -> None:
        """Make ``manifest`` durable, then the in-memory state (under the write lock)."""
        await asyncio.to_thread(manifest.save, self._path)
        self._manifest, self._sealed = manifest, sealed

    # -- helpers ------------------------------------------------------------------------------

    @property
    def _live_shard(self) -> EdgeShard:
        if self._live is None:
            raise RuntimeError(f"the vector index at {self._path} is not open")
        return self._live

    @property
    def _manifest_now(self) -> Manifest:
        if self._manifest is None:
            raise RuntimeError(f"the vector index at {self._path} is not open")
        return self._manifest

    def _shards(self) -> list[EdgeShard]:
        """Every shard, newest first."""
        return [self._live_shard, *(entry.shard for entry in reversed(self._sealed))]


class _Stopwatch:
    """Named laps, rendered as ``export 1.20 s, build 30.10 s, ...`` for the build log line."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self._laps: list[tuple[str, float]] = []

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self._laps.append((name, now - self._last))
        self._last = now

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self._laps)


def _remove_leftovers(root: Path, keep: set[str]) -> None:
    for child in root.iterdir():
        ours = child.name.startswith((LIVE_PREFIX, SEALED_PREFIX, BUILD_PREFIX))
        if ours and child.is_dir() and child.name not in keep:
            shutil.rmtree(child)


def _flush(shards: Iterable[EdgeShard]) -> None:
    for shard in shards:
        shard.flush()


def _flush_and_close(shards: Iterable[EdgeShard]) -> None:
    for shard in shards:
        shard.flush()
        shard.close()


def _close_and_remove(entries: Iterable[_Sealed], root: Path) -> None:
    for entry in entries:
        entry.shard.close()
        shutil.rmtree(root / entry.generation.name, ignore_errors=True)


class _Maintainer(PeriodicWorker):
    """The index's background task: runs ``maintain`` every ``interval_s``, at once when woken
    (the live shard filled up). ``maintain`` logs its own failures and waits for the next round."""

    def __init__(self, maintain: Callable[[], Awaitable[None]], interval_s: float, name: str) -> None:
        super().__init__(interval_s)
        self.name = name
        self._maintain = maintain

    async def tick(self) -> None:
        await self._maintain()
