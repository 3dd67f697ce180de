"""ingest's part of a process: its router (no workers, no ports of its own)."""

from __future__ import annotations

from services.ingest.router import build_router
from shared.service.component import Component, Ports
from shared.service.infra import Infra

__all__ = ["build"]


def build(infra: Infra, ports: Ports) -> Component:
    return Component("ingest", routers=[build_router(infra)])
