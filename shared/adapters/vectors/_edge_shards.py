"""Building blocks of :class:`~shared.adapters.vectors.qdrant_edge.QdrantEdgeIndex`: the two kinds of Qdrant
Edge shard it keeps (an appendable *live* shard, HNSW-indexed *sealed* shards), the tenant filter
in Edge's types, the manifest naming the shard directories that make up the index, and the files
handed to the builder process (:mod:`shared.adapters.vectors._edge_build`).
"""

from __future__ import annotations

import asyncio
import json
import os
from array import array
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any
from uuid import UUID

from qdrant_edge import (
    Distance,
    EdgeConfig,
    EdgeOptimizersConfig,
    EdgeShard,
    EdgeSparseVectorParams,
    EdgeVectorParams,
    FieldCondition,
    Filter,
    HnswIndexConfig,
    KeywordIndexParams,
    MatchAny,
    MatchValue,
    Point,
    ScoredPoint,
    ScrollRequest,
    SparseVector,
    UpdateOperation,
)

from shared.adapters.vectors._tenancy import KEYWORD_FIELDS, TENANT_FIELD, Condition, Equals
from shared.ports import VectorHit
from shared.text.lexical import LEXICAL_VECTOR

__all__ = [
    "BUILD_PREFIX",
    "LIVE_PREFIX",
    "MANIFEST",
    "SEALED_PREFIX",
    "BuildInterrupted",
    "BuildSpec",
    "Generation",
    "Manifest",
    "best_hits",
    "create_shard",
    "edge_filter",
    "edge_point",
    "export_points",
    "live_config",
    "read_points",
    "sealed_config",
    "sparse_query",
]

LIVE_PREFIX = "live-"
SEALED_PREFIX = "sealed-"
BUILD_PREFIX = "build-"
MANIFEST = "manifest.json"
#: 2: every shard has the ``lexical`` sparse vector beside the dense one (format 1 had none).
_FORMAT = 2
_VECTORS_FILE = "vectors.f32"
_POINTS_FILE = "points.jsonl"
_SPEC_FILE = "spec.json"
#: Points per scroll while exporting: ~3 ms of the event loop's time at 384 dimensions (Edge
#: holds the GIL while it scrolls, and turning its floats into bytes is Python work).
_EXPORT_CHUNK = 64


class BuildInterrupted(RuntimeError):
    """The index is closing: a build in progress stops and leaves the index as it was."""


@dataclass(frozen=True)
class BuildSpec:
    """How the builder process configures the sealed shard it builds."""

    dimension: int
    #: Segments above this size get an HNSW graph (``None``: Qdrant's default, 10 MB of vectors).
    indexing_threshold_kb: int | None = None
    #: Filtered searches matching less than this many KB of vectors score them all (exact).
    full_scan_threshold_kb: int = 10_000

    def save(self, build_dir: Path) -> None:
        (build_dir / _SPEC_FILE).write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, build_dir: Path) -> BuildSpec:
        return cls(**json.loads((build_dir / _SPEC_FILE).read_text()))


def _vectors(dimension: int) -> EdgeVectorParams:
    return EdgeVectorParams(size=dimension, distance=Distance.Cosine)


def _sparse() -> dict[str, EdgeSparseVectorParams]:
    """The lexical sparse vector: plain dot product (the cue carries the IDF, shared/text/lexical.py),
    so scores do not depend on which shard holds a point."""
    return {LEXICAL_VECTOR: EdgeSparseVectorParams()}


def live_config(dimension: int) -> EdgeConfig:
    """The appendable shard that takes every write: never indexed here (an ``indexing_threshold``
    of 0 turns HNSW off), so searching it is exact; the builder process indexes it once sealed."""
    return EdgeConfig(
        vectors=_vectors(dimension),
        sparse_vectors=_sparse(),
        optimizers=EdgeOptimizersConfig(indexing_threshold=0),
    )


def sealed_config(spec: BuildSpec) -> EdgeConfig:
    """A shard built once by the builder process: one HNSW segment (one graph to search)."""
    return EdgeConfig(
        vectors=_vectors(spec.dimension),
        sparse_vectors=_sparse(),
        hnsw_config=HnswIndexConfig(m=16, ef_construct=100, full_scan_threshold=spec.full_scan_threshold_kb),
        optimizers=EdgeOptimizersConfig(
            default_segment_number=1, indexing_threshold=spec.indexing_threshold_kb
        ),
    )


def create_shard(path: Path, config: EdgeConfig) -> EdgeShard:
    """A new shard with keyword indexes on the tenancy fields. Only the tenant field gets extra
    HNSW links per value: every query pins it, while links for the other fields would add
    indexing time and help no query that the tenant's links do not."""
    shard = EdgeShard.create(str(path), config)
    for name in KEYWORD_FIELDS:
        tenant = name == TENANT_FIELD
        params = KeywordIndexParams(is_tenant=tenant, enable_hnsw=tenant)
        shard.update(UpdateOperation.create_field_index(name, params))
    return shard


def edge_filter(conditions: Sequence[Condition]) -> Filter:
    """The tenant conditions (:func:`~shared.adapters.vectors._tenancy.tenant_conditions`) in Edge's
    types: every one must hold."""
    return Filter(must=[_edge_condition(condition) for condition in conditions])


def _edge_condition(condition: Condition) -> FieldCondition:
    if isinstance(condition, Equals):
        return FieldCondition(condition.key, match=MatchValue(condition.value))
    return FieldCondition(condition.key, match=MatchAny(list(condition.values)))


def edge_point(
    point_id: UUID, dense: list[float], lexical: dict[int, float], payload: dict[str, Any]
) -> Point:
    """A point with its dense vector (the unnamed one) and, when it has lexemes, its lexical one."""
    if not lexical:
        return Point(point_id, dense, payload)
    indices = sorted(lexical)
    sparse = SparseVector(indices, [lexical[i] for i in indices])
    return Point(point_id, {"": dense, LEXICAL_VECTOR: sparse}, payload)


def sparse_query(terms: dict[int, float]) -> SparseVector:
    indices = sorted(terms)
    return SparseVector(indices, [terms[i] for i in indices])


def best_hits(points: Sequence[ScoredPoint], limit: int) -> list[VectorHit]:
    """The ``limit`` best of every shard's points, highest score first, each id once (an id in
    two shards after a crash has the same vector there, so either copy will do).

    Sorted before any hit is made: each shard returns up to ``limit`` points, and only ``limit``
    of them all become hits (hybrid merges a few hundred per search; making a hit and hashing
    its id for each cost more than the sort)."""
    scored = sorted(((point.score, point) for point in points), key=_first, reverse=True)
    hits: list[VectorHit] = []
    seen: set[Any] = set()
    for score, point in scored:
        point_id = point.id  # Edge makes a new UUID object on each access
        if point_id in seen:
            continue
        seen.add(point_id)
        hits.append(VectorHit(_uuid(point_id), score))
        if len(hits) == limit:
            break
    return hits


_first = itemgetter(0)


def _uuid(point_id: int | UUID | str) -> UUID:
    return point_id if isinstance(point_id, UUID) else UUID(str(point_id))


# -- the manifest ---------------------------------------------------------------------------


@dataclass
class Generation:
    """A sealed shard directory: ``built`` once the builder process made it (with an HNSW graph
    if it is above Edge's indexing threshold), not yet while it is a former live shard waiting
    for its build. ``points`` is its size when it became what it is."""

    name: str
    built: bool
    points: int


@dataclass
class Manifest:
    """Which shard directories under the index path are the index; everything else there with
    our prefixes is a leftover of an interrupted build and is removed on open."""

    dimension: int
    live: str
    generations: list[Generation] = field(default_factory=list)
    next_number: int = 1

    def new_name(self, prefix: str) -> str:
        name = f"{prefix}{self.next_number:06d}"
        self.next_number += 1
        return name

    def names(self) -> set[str]:
        return {self.live, *(generation.name for generation in self.generations)}

    @classmethod
    def load(cls, root: Path) -> Manifest | None:
        try:
            raw: dict[str, Any] = json.loads((root / MANIFEST).read_text())
        except FileNotFoundError:
            return None
        if raw.get("format") != _FORMAT:
            raise ValueError(
                f"{root / MANIFEST} has format {raw.get('format')!r}, this Engram reads {_FORMAT} "
                "(format 2 added the lexical vectors): point the index at a new directory and run "
                "`engram reindex`"
            )
        return cls(
            dimension=raw["dimension"],
            live=raw["live"],
            generations=[Generation(**generation) for generation in raw["generations"]],
            next_number=raw["next_number"],
        )

    def save(self, root: Path) -> None:
        """Replace the manifest atomically and durably (write, fsync, rename, fsync the directory)."""
        body = {"format": _FORMAT, **asdict(self)}
        tmp = root / f"{MANIFEST}.tmp"
        with tmp.open("w") as out:
            json.dump(body, out, indent=1)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, root / MANIFEST)
        directory = os.open(root, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


# -- the builder's input files --------------------------------------------------------------


async def export_points(shards: Sequence[EdgeShard], build_dir: Path, stop: Callable[[], bool]) -> int:
    """Write every point of ``shards`` for the builder process; how many were written.

    Edge holds the GIL while it scrolls, so this goes in small chunks and lets the event loop
    run between them. Raises :class:`BuildInterrupted` as soon as ``stop()`` is true.
    """
    written = 0
    with (build_dir / _VECTORS_FILE).open("wb") as vectors, (build_dir / _POINTS_FILE).open("w") as points:
        for shard in shards:
            offset: int | UUID | str | None = None
            while True:
                if stop():
                    raise BuildInterrupted("the vector index closed while exporting a build")
                request = ScrollRequest(
                    offset=offset, limit=_EXPORT_CHUNK, with_payload=True, with_vector=True
                )
                records, offset = shard.scroll(request)
                chunk = array("f")
                for record in records:
                    dense, lexical = _split_vector(record.vector)
                    chunk.extend(dense)
                    row = {"id": str(record.id), "payload": record.payload, "lexical": lexical}
                    points.write(json.dumps(row) + "\n")
                chunk.tofile(vectors)
                written += len(records)
                if offset is None:
                    break
                await asyncio.sleep(0)
    return written


def read_points(
    build_dir: Path, dimension: int, batch: int, skip: Collection[UUID] = ()
) -> Iterator[list[Point]]:
    """The points :func:`export_points` wrote, ``batch`` at a time, leaving out the ids in ``skip``."""
    with (build_dir / _VECTORS_FILE).open("rb") as vectors, (build_dir / _POINTS_FILE).open() as lines:
        points: list[Point] = []
        for line in lines:
            row = json.loads(line)
            vector = array("f")
            vector.fromfile(vectors, dimension)
            point_id = UUID(row["id"])
            if point_id in skip:
                continue
            lexical = {int(i): float(w) for i, w in row.get("lexical", [])}
            points.append(edge_point(point_id, vector.tolist(), lexical, row["payload"]))
            if len(points) == batch:
                yield points
                points = []
        if points:
            yield points


def _split_vector(vector: object) -> tuple[list[float], list[tuple[int, float]]]:
    """A scrolled point's dense vector and its lexical (index, weight) pairs."""
    if isinstance(vector, list):
        return vector, []
    if isinstance(vector, dict) and isinstance(vector.get(""), list):
        sparse = vector.get(LEXICAL_VECTOR)
        pairs = list(zip(sparse.indices, sparse.values, strict=True)) if sparse is not None else []
        return vector[""], pairs
    raise TypeError(f"expected a dense vector and an optional lexical one, got {type(vector).__name__}")
