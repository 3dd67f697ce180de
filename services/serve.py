"""``engram serve <service>…``: one process as an orchestrator runs it.

Health probes first (liveness answers while the services start; readiness once they consume),
then the services; on SIGTERM (or SIGINT) readiness fails at once, the subscribers stop fetching,
in-flight messages finish and are acked, background work and the outbox are flushed, and the
process exits 0 — within ``ENGRAM_SHUTDOWN_TIMEOUT_S``, else 1. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Sequence
from contextlib import AsyncExitStack

from services.runtime import running_services
from shared.adapters.vectors.edge_lock import EdgeStoreInUse
from shared.observability.health import HealthServer
from shared.runtime.process_memory import settle_heap
from shared.runtime.settings import EngramSettings

__all__ = ["EXIT_DRAIN_TIMEOUT", "EXIT_REFUSED", "serve"]

log = logging.getLogger("engram.serve")

#: The services did not finish their in-flight work within the shutdown bound.
EXIT_DRAIN_TIMEOUT = 1
#: The process refused to start (another process holds the Qdrant Edge store).
EXIT_REFUSED = 2


async def serve(settings: EngramSettings, names: Sequence[str]) -> int:
    """Run ``names`` in this process until SIGTERM/SIGINT; returns the exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():  # a second signal: the operator does not want to wait for the drain
            os._exit(EXIT_DRAIN_TIMEOUT)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    started = asyncio.Event()
    health = HealthServer(settings.health_host, settings.health_port) if settings.health_port else None
    if health is not None:

        async def is_started() -> bool:
            return started.is_set()

        health.add_check("started", is_started)
        await health.start()
        log.info("health probes on http://%s:%d/healthz and /readyz", settings.health_host, health.port)
    stack = AsyncExitStack()
    draining = False
    try:
        # Start-up waits for NATS and Postgres; a SIGTERM meanwhile stops it (what was opened is
        # closed by the cancellation) instead of waiting for dependencies that may never come.
        starting = asyncio.ensure_future(stack.enter_async_context(running_services(settings, names)))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            log.info("stopped before start-up finished")
            return 0
        try:
            infra = starting.result()
        except EdgeStoreInUse as refused:
            log.error("engram serve %s refused to start: %s", " ".join(names), refused)
            return EXIT_REFUSED
        if health is not None:

            async def nats_connected() -> bool:
                return bool(infra.nc.is_connected)

            async def postgres_answers() -> bool:
                await infra.db.ping()
                return True

            health.add_check("nats", nats_connected)
            health.add_check("postgres", postgres_answers)
        started.set()
        settle_heap()  # start-up is done: what it made lives as long as the process
        await stop.wait()
        if health is not None:
            health.draining = True
        log.info("draining: no new work; finishing what is in flight")
        draining = True
        try:
            async with asyncio.timeout(settings.shutdown_timeout_s):
                await stack.aclose()
        except TimeoutError:
            log.error(
                "in-flight work did not finish within %.0f s; exiting anyway", settings.shutdown_timeout_s
            )
            return EXIT_DRAIN_TIMEOUT
        log.info("drained; exiting")
        return 0
    finally:
        if not draining:  # startup failed or was cancelled: close what was opened
            await stack.aclose()
        if health is not None:
            await health.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
