"""embed's part of a process: the pipeline worker and its router, when there is a vector store."""

from __future__ import annotations

from services.embed.router import EmbedPipeline, build_router
from shared.service.component import Component, Ports
from shared.service.infra import Infra

__all__ = ["build"]


def build(infra: Infra, ports: Ports) -> Component:
    if ports.vector_index is None or ports.embedder is None:
        # ENGRAM_VECTOR_STORE=none: nothing to index, but embed is still there, so a gateway's
        # /readyz may count it.
        return Component("embed")
    pipeline = EmbedPipeline(infra, ports.embedder, ports.vector_index)
    return Component("embed", routers=[build_router(infra, pipeline, ports.vector_index)], workers=[pipeline])
