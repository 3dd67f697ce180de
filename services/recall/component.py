"""recall's part of a process: its router, the side-effect writer and the cue-vector cache."""

from __future__ import annotations

from services.recall.router import build_router
from services.recall.service import Recall
from services.recall.side_effects import SideEffects
from shared.adapters.vectors.coverage import VectorCoverage
from shared.service.component import Component, Ports
from shared.service.infra import Infra
from shared.storage.cache import CueVectorCache

__all__ = ["build"]


def build(infra: Infra, ports: Ports) -> Component:
    settings, embedder = infra.settings, ports.embedder
    effects = SideEffects(infra.db)
    cue_vectors = CueVectorCache(embedder.name if embedder else "none", redis_url=settings.redis_url)
    recall = Recall(
        infra.db,
        effects,
        embedder=embedder,
        index=ports.vector_index,
        cue_vectors=cue_vectors,
        config_cache_s=settings.config_cache_s,
        results=ports.results,
        coverage=VectorCoverage(infra.db, embedder) if embedder is not None else None,
    )
    return Component(
        "recall",
        routers=[build_router(infra, recall, ports.results)],
        workers=[effects],
        closers=[cue_vectors.close],
    )
