"""How Edge's per-shard answers become one search's hits (``best_hits``), on real Edge shards."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID, uuid4

from qdrant_edge import Point, Query, QueryRequest, ScoredPoint, UpdateOperation

from shared.adapters.vectors._edge_shards import best_hits, create_shard, live_config


def _shard_answer(
    path: Path, points: dict[UUID, list[float]], cue: list[float], limit: int
) -> list[ScoredPoint]:
    shard = create_shard(path, live_config(2))
    shard.update(UpdateOperation.upsert_points([Point(i, v, {}) for i, v in points.items()]))
    return list(shard.query(QueryRequest(limit=limit, query=Query.Nearest(cue))))


def test_the_best_of_every_shard_highest_first_each_id_once(tmp_path: Path) -> None:
    """Merged by score across shards, cut at the limit; an id in two shards (a crash between
    absorbing a build and dropping it leaves one, with the same vector) comes back once."""
    a, b, c, d, twice = (uuid4() for _ in range(5))
    cue = [1.0, 0.0]
    first = _shard_answer(tmp_path / "one", {a: [1.0, 0.1], c: [0.2, 1.0], twice: [1.0, 0.5]}, cue, 3)
    second = _shard_answer(tmp_path / "two", {b: [1.0, 0.3], d: [0.0, 1.0], twice: [1.0, 0.5]}, cue, 3)
    found = first + second
    hits = best_hits(found, 10)
    assert [h.id for h in hits] == [a, b, twice, c, d]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert all(isinstance(h.id, UUID) for h in hits)
    assert [h.id for h in best_hits(found, 2)] == [a, b]
    assert [h.id for h in best_hits(found, 3)] == [a, b, twice]
    assert [h.id for h in best_hits(found, 4)] == [a, b, twice, c]  # the copy takes no place
    assert best_hits([], 5) == []
