"""What one service adds to a process: its routers (request-reply operations and stream
consumers), its background workers and the ports it opened. Each service has one
``build(infra, ports) -> Component`` (``services/<service>/component.py``); ``services.runtime``
starts what they return in one loop and stops it in reverse."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from faststream.nats import NatsRouter

from shared.ports import Distiller, Embedder, VectorIndex
from shared.runtime.background import Worker
from shared.service.infra import Infra
from shared.storage.cache import ResultCache

__all__ = ["Component", "Ports"]


@dataclass(frozen=True)
class Ports:
    """The adapters the services of one process share (built, and closed, by the runtime).
    ``distiller`` is only set when the caller brought one; distill builds its own otherwise."""

    embedder: Embedder | None = None
    vector_index: VectorIndex | None = None
    results: ResultCache | None = None
    distiller: Distiller | None = None


@dataclass
class Component:
    #: The service, as its liveness probe names it (shared/observability/liveness.py).
    name: str
    routers: list[NatsRouter] = field(default_factory=list)
    #: Started after the subscribers, stopped after them (they finish what the handlers gave them).
    workers: list[Worker] = field(default_factory=list)
    #: What the component opened itself, closed after every worker has stopped.
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)


Build = Callable[[Infra, Ports], Component]
