"""The composition root: settings → adapters → routers on one broker. ``engram up`` runs every
service here on one event loop; ``engram serve <name>`` runs one. Same code paths either way."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from faststream.nats import NatsBroker

from shared.auth import TokenService
from shared.bus import configured_streams, ensure_streams, patch_pull_timeout
from shared.db.engine import Database
from shared.distillers.builtin import BuiltinDistiller
from shared.distillers.openai_compat import OpenAICompatDistiller
from shared.infra import Infra
from shared.outbox import OutboxRelay
from shared.ports import Distiller
from shared.settings import EngramSettings
from shared.telemetry import nats_telemetry_middleware, setup_telemetry

__all__ = ["SERVICES", "build_distiller", "running_services"]

SERVICES = ("ingest", "distill", "governance-audit")
log = logging.getLogger(__name__)


def build_distiller(settings: EngramSettings) -> Distiller:
    if settings.distill_model_url:
        return OpenAICompatDistiller(
            base_url=settings.distill_model_url,
            model=settings.distill_model,
            api_key=settings.distill_api_key.get_secret_value() or None,
            timeout_s=settings.distill_timeout_s,
            retries=settings.distill_retries,
        )
    return BuiltinDistiller()


@asynccontextmanager
async def running_services(
    settings: EngramSettings, names: Sequence[str] = SERVICES, *, distiller: Distiller | None = None
) -> AsyncIterator[Infra]:
    """Start the named services against ``settings.nats_url`` / ``settings.database_url`` and
    yield once they consume; stops them cleanly on exit."""
    unknown = set(names) - set(SERVICES)
    if unknown:
        raise ValueError(f"unknown services {sorted(unknown)}; choose from {', '.join(SERVICES)}")
    if not settings.nats_url or not settings.database_url:
        raise ValueError("set ENGRAM_NATS_URL and ENGRAM_DATABASE_URL (or use `engram up`)")
    patch_pull_timeout()
    service_label = "engram" if len(names) > 1 else f"engram-{names[0]}"
    provider = setup_telemetry(
        service_label, exporter=settings.otel_exporter, endpoint=settings.otel_endpoint
    )
    broker = NatsBroker(
        settings.nats_url,
        name=service_label,
        middlewares=[nats_telemetry_middleware(provider)],
        max_reconnect_attempts=-1,
        logger=logging.getLogger("engram.broker"),
        graceful_timeout=10.0,
    )
    db = Database(settings.database_url)
    await broker.connect()
    js = broker.connection.jetstream()
    await ensure_streams(
        js,
        configured_streams(
            session_retention_s=settings.session_retention_s,
            dead_letter_retention_s=settings.dead_letter_retention_s,
        ),
    )
    relay = OutboxRelay(db, js)
    infra = Infra(
        settings=settings,
        db=db,
        tokens=TokenService(settings.signing_keys(), settings.token_issuer),
        broker=broker,
        relay=relay,
    )
    distiller = distiller or build_distiller(settings)
    # Imported here: each service's router is only loaded when that service runs.
    if "ingest" in names:
        from services.ingest.router import build_router as ingest_router

        broker.include_router(ingest_router(infra))
    if "distill" in names:
        from services.distill.router import build_router as distill_router

        broker.include_router(distill_router(infra, distiller))
    if "governance-audit" in names:
        from services.governance_audit.router import build_router as governance_router

        broker.include_router(governance_router(infra))
    await broker.start()
    await relay.start()
    log.info("services running: %s", ", ".join(names))
    try:
        yield infra
    finally:
        # Subscribers first (in-flight handlers finish and commit), then the relay's last flush
        # while the connection is still open, then the connection itself.
        await asyncio.gather(*(sub.stop() for sub in broker.subscribers), return_exceptions=True)
        await relay.stop()
        await broker.stop()
        close = getattr(distiller, "aclose", None)
        if close is not None:
            await close()
        await db.close()


async def serve_forever(settings: EngramSettings, names: Sequence[str] = SERVICES) -> None:
    async with running_services(settings, names):
        await asyncio.Event().wait()
