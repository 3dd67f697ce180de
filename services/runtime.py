"""The composition root: settings → adapters → routers on one broker. ``engram up`` runs every
service here on one event loop; ``engram serve <name>`` runs one. Same code paths either way."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from faststream.nats import NatsBroker
from faststream.nats.security import NatsNKey, NatsSecurity

from shared.auth import TokenService
from shared.bus import configured_streams, ensure_streams, patch_pull_timeout, record_consumer_lag
from shared.db.engine import Database
from shared.distillers.builtin import BuiltinDistiller
from shared.distillers.openai_compat import OpenAICompatDistiller
from shared.infra import Infra
from shared.liveness import LivenessResponder
from shared.metrics import refreshing
from shared.nats_auth.permissions import ALL_IN_ONE, CONSUMERS, process_name, service_inbox
from shared.outbox import OutboxRelay
from shared.ports import Distiller, Embedder, VectorIndex
from shared.provenance import MessageSigner
from shared.settings import EngramSettings
from shared.telemetry import broker_middleware, setup_telemetry
from shared.tls import client_tls_context
from shared.vectors.edge_lock import exclusive_edge_store

__all__ = [
    "SERVICES",
    "build_distiller",
    "build_embedder",
    "build_vector_index",
    "edge_store_path",
    "nats_security",
    "running_services",
]

SERVICES = ("ingest", "distill", "embed", "recall", "governance-audit")
log = logging.getLogger(__name__)

#: How long a stopping subscriber (the edge's, the streams') may take to finish what it holds.
GRACEFUL_S = 10.0


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


def build_embedder(settings: EngramSettings) -> Embedder:
    from shared.embedders import build_embedder as choose

    return choose(
        settings.embedder,
        url=settings.embedder_url,
        api_key=settings.embedder_api_key.get_secret_value(),
        dimension=settings.embedder_dimension,
    )


def _collection(embedder: Embedder) -> str:
    return f"engram_{embedder.name}".replace("-", "_").replace(".", "_").lower()


def edge_store_path(settings: EngramSettings, embedder: Embedder) -> Path:
    """Where Qdrant Edge keeps ``embedder``'s vectors under the data dir."""
    return settings.data_dir.resolve() / "vectors" / _collection(embedder)


def build_vector_index(settings: EngramSettings, embedder: Embedder) -> VectorIndex | None:
    """A Qdrant server when ``ENGRAM_VECTOR_STORE`` is a URL, Qdrant Edge in-process under the
    data dir otherwise (one process only: separate processes need a server), none for ``none``."""
    if settings.vector_store == "none":
        return None
    collection = _collection(embedder)
    if settings.vector_store:
        from qdrant_client import AsyncQdrantClient

        from shared.vectors.qdrant_server import QdrantServerIndex

        return QdrantServerIndex(AsyncQdrantClient(url=settings.vector_store), collection, embedder.dimension)
    from shared.vectors.qdrant_edge import QdrantEdgeIndex

    return QdrantEdgeIndex(edge_store_path(settings, embedder), embedder.dimension)


def nats_security(settings: EngramSettings) -> NatsSecurity | None:
    """This process's NATS identity (an nkey seed) and TLS context, as FastStream takes them."""
    tls = client_tls_context(
        settings.nats_tls_ca_file, settings.nats_tls_cert_file, settings.nats_tls_key_file
    )
    if seed := settings.nats_nkey_seed.get_secret_value():
        return NatsNKey.from_seed(seed, ssl_context=tls)
    return NatsSecurity(ssl_context=tls) if tls is not None else None


@asynccontextmanager
async def running_services(
    settings: EngramSettings,
    names: Sequence[str] = SERVICES,
    *,
    distiller: Distiller | None = None,
    embedder: Embedder | None = None,
    vector_index: VectorIndex | None = None,
) -> AsyncIterator[Infra]:
    """Start the named services against ``settings.nats_url`` / ``settings.database_url`` and
    yield once they consume; stops them cleanly on exit. Adapters not passed in are built from
    the settings."""
    # The process's NATS identity and inbox follow from what it runs (shared/nats_auth/permissions.py).
    process = process_name(names)
    if not settings.nats_url or not settings.database_url:
        raise ValueError("set ENGRAM_NATS_URL and ENGRAM_DATABASE_URL (or use `engram up`)")
    patch_pull_timeout()
    service_label = ALL_IN_ONE if process == ALL_IN_ONE else f"engram-{process}"
    inbox = service_inbox(process)
    provider = setup_telemetry(
        service_label, exporter=settings.otel_exporter, endpoint=settings.otel_endpoint
    )
    broker = NatsBroker(
        settings.nats_servers(),
        name=service_label,
        # Spans where they are exported; otherwise only the caller's trace context is carried.
        middlewares=[broker_middleware(provider)],
        max_reconnect_attempts=-1,
        # Replies to this process's own requests (JetStream API, acks, pulled messages) arrive
        # under its own prefix, so least-privilege NATS users can keep each service to its own.
        inbox_prefix=inbox,
        # This process's NATS identity (least privilege: shared/nats_auth/permissions.py) and TLS.
        security=nats_security(settings),
        logger=logging.getLogger("engram.broker"),
        # FastStream logs each message twice ("Received", "Processed") and each subscriber's start
        # at this level: per-message lines bury what matters and cost recall latency under load.
        log_level=logging.DEBUG,
        graceful_timeout=GRACEFUL_S,
    )
    db = Database(
        settings.database_url,
        tls=client_tls_context(
            settings.database_tls_ca_file, settings.database_tls_cert_file, settings.database_tls_key_file
        ),
    )
    async with AsyncExitStack() as stack:
        stack.push_async_callback(db.close)
        await broker.connect()
        # Closed last but the database, also when start-up is cut short (Ctrl-C): before whoever
        # started NATS stops it, so the connection never outlives its server.
        stack.push_async_callback(_disconnect, broker)
        js = broker.connection.jetstream()
        await ensure_streams(
            js,
            configured_streams(
                session_retention_s=settings.session_retention_s,
                dead_letter_retention_s=settings.dead_letter_retention_s,
            ),
            replicas=settings.stream_replicas,
        )
        signer = MessageSigner(settings.signing_keys())
        relay = OutboxRelay(db, js, signer=signer)
        #: background tasks with start()/stop(): started with the subscribers, stopped after them.
        workers: list[Any] = []
        infra = Infra(
            settings=settings,
            db=db,
            tokens=TokenService(settings.signing_keys(), settings.token_issuer),
            broker=broker,
            relay=relay,
            signer=signer,
            inbox_prefix=f"{inbox}.".encode(),
        )
        # Governance erases vectors itself when the vector store is reachable from this process
        # (Edge shares the process with embed/recall, or a Qdrant server); else embed does.
        needs_vectors = bool({"embed", "recall"} & set(names)) or (
            "governance-audit" in names and settings.vector_store not in ("", "none")
        )
        if needs_vectors and embedder is None:
            embedder = build_embedder(settings)
            # Read and check the model's files now: a damaged install fails the start, and the
            # first write or recall does not wait for the load.
            load = getattr(embedder, "load", None)
            if load is not None:
                await asyncio.to_thread(load)
        if needs_vectors and vector_index is None and embedder is not None:
            if not settings.vector_store:  # Qdrant Edge: this process must be its only user
                stack.enter_context(exclusive_edge_store(edge_store_path(settings, embedder)))
            vector_index = build_vector_index(settings, embedder)
            if vector_index is not None:
                stack.push_async_callback(vector_index.close)
        #: The services whose parts run here: they answer their liveness probes (shared/liveness.py).
        serving: list[str] = []
        # Imported here: each service's code is only loaded when that service runs.
        if "ingest" in names:
            from services.ingest.router import build_router as ingest_router

            broker.include_router(ingest_router(infra))
            serving.append("ingest")
        if "distill" in names:
            from services.distill.router import build_router as distill_router

            distiller = distiller or build_distiller(settings)
            close = getattr(distiller, "aclose", None)
            if close is not None:
                stack.push_async_callback(close)
            broker.include_router(distill_router(infra, distiller))
            serving.append("distill")
        if "embed" in names and vector_index is not None and embedder is not None:
            from services.embed.router import EmbedPipeline
            from services.embed.router import build_router as embed_router

            pipeline = EmbedPipeline(infra, embedder, vector_index)
            workers.append(pipeline)
            broker.include_router(embed_router(infra, pipeline, vector_index))
        if "embed" in names:
            # Without a vector store (ENGRAM_VECTOR_STORE=none) embed runs with nothing to index;
            # it is still there, so a gateway's /readyz may count it.
            serving.append("embed")
        results = None
        if settings.redis_url and settings.result_cache_s > 0 and {"recall", "governance-audit"} & set(names):
            from shared.cache import ResultCache

            results = ResultCache(settings.redis_url, ttl_s=settings.result_cache_s)
            stack.push_async_callback(results.close)
        if "recall" in names:
            from services.recall.router import build_router as recall_router
            from services.recall.service import Recall
            from services.recall.side_effects import SideEffects
            from shared.cache import CueVectorCache

            effects = SideEffects(db)
            await effects.start()
            stack.push_async_callback(effects.stop)
            from shared.vectors.coverage import VectorCoverage

            cue_vectors = CueVectorCache(embedder.name if embedder else "none", redis_url=settings.redis_url)
            stack.push_async_callback(cue_vectors.close)
            recall = Recall(
                db,
                effects,
                embedder=embedder,
                index=vector_index,
                cue_vectors=cue_vectors,
                config_cache_s=settings.config_cache_s,
                results=results,
                coverage=VectorCoverage(db, embedder) if embedder is not None else None,
            )
            broker.include_router(recall_router(infra, recall, results))
            serving.append("recall")
        if "governance-audit" in names:
            from services.governance_audit.erasure_api import Erasures
            from services.governance_audit.retention import RetentionSweeper
            from services.governance_audit.router import build_router as governance_router
            from shared.purge_ledger import PurgeLedger

            ledger = PurgeLedger(settings.purge_ledger_path())
            ledger.create()
            erasures = Erasures(db, index=vector_index, results=results, ledger=ledger)
            broker.include_router(governance_router(infra, erasures, results))
            workers.append(RetentionSweeper(db, erasures.after_commit, interval_s=settings.retention_sweep_s))
            serving.append("governance-audit")
        await broker.start()
        await infra.edge.start(broker.connection, tracer_provider=provider)
        liveness = LivenessResponder(serving)
        await liveness.start(broker.connection)
        # Wait until the server has our subscriptions: a client told "ready" right after this
        # must not meet "no responders".
        await broker.connection.flush()
        await relay.start()
        for worker in workers:
            await worker.start()
        # /metrics reads the lag of this process's own durables (its NATS identity may read no
        # other consumer's info) and the outbox backlog when scraped.
        durables = [(stream, durable) for name in names for stream, durable, _ in CONSUMERS[name]]
        stack.enter_context(refreshing(lambda: record_consumer_lag(js, durables), relay.refresh_backlog))
        log.info("services running: %s", ", ".join(names))
        try:
            yield infra
        finally:
            # No longer counted as running (a /readyz stops routing here), then the subscribers,
            # the edge's and the streams' (in-flight handlers finish and commit), then the relay's
            # last flush while the connection is still open; the exit stack then closes side
            # effects and adapters, the connection, and the database.
            await liveness.stop()
            await asyncio.gather(
                infra.edge.stop(GRACEFUL_S),
                *(sub.stop() for sub in broker.subscribers),
                return_exceptions=True,
            )
            # Then the background workers finish what the subscribers handed them (acks included).
            for worker in reversed(workers):
                await worker.stop()
            await relay.stop()


async def _disconnect(broker: NatsBroker) -> None:
    """Drain and close the broker's connection (what was published is flushed)."""
    try:
        await broker.stop()
    except Exception as exc:  # NATS away at shutdown: nothing left to drain; leave anyway
        log.warning("NATS connection could not be drained at shutdown (%r)", exc)
