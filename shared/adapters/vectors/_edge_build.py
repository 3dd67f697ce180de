"""The builder process of :class:`~shared.adapters.vectors.qdrant_edge.QdrantEdgeIndex`:
``python -m shared.adapters.vectors._edge_build BUILD_DIR``.

Reads the points exported into ``BUILD_DIR``, writes them into a new shard at ``BUILD_DIR/shard``,
builds its HNSW graph and exits 0. It is a separate process because Qdrant Edge holds the GIL for
the whole of ``optimize()`` (minutes at 100k points): in a thread it would freeze the event loop
of the process serving queries.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from qdrant_edge import UpdateOperation

from shared.adapters.vectors._edge_shards import BuildSpec, create_shard, read_points, sealed_config

SHARD_DIR = "shard"
_BATCH = 1_000


def build(build_dir: Path) -> int:
    """Build the sealed shard; how many points it holds."""
    spec = BuildSpec.load(build_dir)
    shard = create_shard(build_dir / SHARD_DIR, sealed_config(spec))
    count = 0
    try:
        for points in read_points(build_dir, spec.dimension, _BATCH):
            shard.update(UpdateOperation.upsert_points(points))
            count += len(points)
        shard.optimize()
        shard.flush()
    finally:
        shard.close()
    return count


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} BUILD_DIR", file=sys.stderr)
        return 2
    # The serving process shares these cores; it comes first.
    os.nice(10)
    build(Path(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
