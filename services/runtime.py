"""The composition root: settings → adapters → routers on one broker. ``engram up`` runs every
service here on one event loop; ``engram serve <name>`` runs one. Same code paths either way."""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractContextManager, AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, cast

from faststream.nats import NatsBroker
from faststream.nats.security import NatsNKey, NatsSecurity

from contracts.operations import JETSTREAMS, consumers_of
from shared.adapters.vectors.edge_lock import exclusive_edge_store
from shared.messaging.bus import configured_streams, ensure_streams, record_consumer_lag, record_stream_usage
from shared.messaging.pull import patch_pull_loops
from shared.observability.liveness import LivenessResponder
from shared.observability.metrics import refreshing
from shared.observability.telemetry import broker_middleware, setup_telemetry
from shared.ports import Distiller, Embedder, VectorIndex
from shared.runtime.background import Worker
from shared.runtime.settings import EngramSettings
from shared.security.nats_auth.permissions import ALL_IN_ONE, process_name, service_inbox
from shared.security.oidc import build_verifier
from shared.security.provenance import MessageSigner
from shared.security.tls import client_tls_context
from shared.service import revocations
from shared.service.component import Build, Ports
from shared.service.infra import Infra
from shared.storage.cache import ResultCache
from shared.storage.db.engine import Database
from shared.storage.outbox import OutboxRelay

__all__ = [
    "SERVICES",
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


def build_embedder(settings: EngramSettings) -> Embedder:
    from shared.adapters.embedders import build_embedder as choose

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

        from shared.adapters.vectors.qdrant_server import QdrantServerIndex

        return QdrantServerIndex(AsyncQdrantClient(url=settings.vector_store), collection, embedder.dimension)
    from shared.adapters.vectors.qdrant_edge import QdrantEdgeIndex

    return QdrantEdgeIndex(edge_store_path(settings, embedder), embedder.dimension)


def nats_security(settings: EngramSettings) -> NatsSecurity | None:
    """This process's NATS identity (an nkey seed) and TLS context, as FastStream takes them."""
    tls = client_tls_context(
        settings.nats_tls_ca_file, settings.nats_tls_cert_file, settings.nats_tls_key_file
    )
    if seed := settings.nats_nkey_seed.get_secret_value():
        return NatsNKey.from_seed(seed, ssl_context=tls)
    return NatsSecurity(ssl_context=tls) if tls is not None else None


#: Each service's ``build`` (shared/service/component.py), imported only when that service runs here.
_COMPONENTS = {name: f"services.{name.replace('-', '_')}.component" for name in SERVICES}


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
    the settings (and closed here); those passed in stay the caller's."""
    if not settings.nats_url or not settings.database_url:
        raise ValueError("set ENGRAM_NATS_URL and ENGRAM_DATABASE_URL (or use `engram up`)")
    async with AsyncExitStack() as stack:
        infra, provider = await _connect(settings, process_name(names), stack)
        ports = await _open_ports(settings, names, stack, distiller, embedder, vector_index)
        components = [
            cast(Build, importlib.import_module(_COMPONENTS[name]).build)(infra, ports)
            for name in SERVICES
            if name in names
        ]
        for component in components:
            for close in component.closers:
                stack.push_async_callback(close)
            for router in component.routers:
                infra.broker.include_router(router)
        await infra.broker.start()
        await infra.edge.start(infra.nc, tracer_provider=provider)
        liveness = LivenessResponder([component.name for component in components])
        await liveness.start(infra.nc)
        # Wait until the server has our subscriptions: a client told "ready" right after this
        # must not meet "no responders".
        await infra.nc.flush()
        # The relay first: the others' work may enqueue events. Stopped last, in reverse.
        workers: list[Worker] = [infra.relay, *(w for component in components for w in component.workers)]
        for worker in workers:
            stack.push_async_callback(worker.stop)
            await worker.start()
        stack.enter_context(_gauges(infra, names))
        log.info("services running: %s", ", ".join(names))
        try:
            yield infra
        finally:
            # No longer counted as running (a /readyz stops routing here), then the subscribers,
            # the edge's and the streams' (in-flight handlers finish and commit); the exit stack
            # then stops the workers (they finish what the subscribers handed them, the relay
            # flushes last while the connection is open), closes the ports, the connection and
            # the database.
            await liveness.stop()
            await asyncio.gather(
                infra.edge.stop(GRACEFUL_S),
                *(sub.stop() for sub in infra.broker.subscribers),
                return_exceptions=True,
            )


def _gauges(infra: Infra, names: Sequence[str]) -> AbstractContextManager[None]:
    """What /metrics reads when scraped: the lag of this process's own durables (its NATS
    identity may read no other consumer's info), how full each stream is (its bytes against
    JetStream's storage limit: a full disk) and the outbox backlog."""
    durables = [(c.stream.jetstream, c.durable) for name in names for c in consumers_of(name)]
    return refreshing(
        partial(record_consumer_lag, infra.js, durables),
        partial(record_stream_usage, infra.js, [d.name for d in JETSTREAMS]),
        infra.relay.refresh_backlog,
    )


async def _connect(settings: EngramSettings, process: str, stack: AsyncExitStack) -> tuple[Infra, Any]:
    """The process's broker (connected, its streams ensured), database and outbox relay."""
    patch_pull_loops()
    service_label = ALL_IN_ONE if process == ALL_IN_ONE else f"engram-{process}"
    # The process's NATS identity and inbox follow from what it runs
    # (shared/security/nats_auth/permissions.py).
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
        # This process's NATS identity (least privilege: shared/security/nats_auth/permissions.py) and TLS.
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
    stack.push_async_callback(db.close)
    tokens = build_verifier(settings)  # a bad issuer list stops the start here
    stack.push_async_callback(tokens.aclose)
    await broker.connect()
    # Revoked tokens and disabled organizations: followed first, then read, so none is missed.
    revoked = await revocations.follow(broker.connection, tokens.revocations)
    await revocations.load(db, tokens.revocations)
    # Closed last but the database, also when start-up is cut short (Ctrl-C): before whoever
    # started NATS stops it, so the connection never outlives its server.
    stack.push_async_callback(_disconnect, broker)
    stack.push_async_callback(revoked.unsubscribe)
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
    infra = Infra(
        settings=settings,
        db=db,
        tokens=tokens,
        broker=broker,
        relay=OutboxRelay(db, js, signer=signer),
        signer=signer,
        inbox_prefix=f"{inbox}.".encode(),
    )
    return infra, provider


async def _open_ports(
    settings: EngramSettings,
    names: Sequence[str],
    stack: AsyncExitStack,
    distiller: Distiller | None,
    embedder: Embedder | None,
    vector_index: VectorIndex | None,
) -> Ports:
    """The adapters the named services share; what is built here is closed by ``stack``."""
    # Governance erases vectors itself when the vector store is reachable from this process
    # (Edge shares the process with embed/recall, or a Qdrant server); else embed does.
    needs_vectors = bool({"embed", "recall"} & set(names)) or (
        "governance-audit" in names and settings.vector_store not in ("", "none")
    )
    if needs_vectors and embedder is None:
        embedder = build_embedder(settings)
        stack.push_async_callback(embedder.aclose)
        # Read and check the model's files now: a damaged install fails the start, and the
        # first write or recall does not wait for the load.
        await asyncio.to_thread(embedder.load)
    if needs_vectors and vector_index is None and embedder is not None:
        if not settings.vector_store:  # Qdrant Edge: this process must be its only user
            stack.enter_context(exclusive_edge_store(edge_store_path(settings, embedder)))
        vector_index = build_vector_index(settings, embedder)
        if vector_index is not None:
            stack.push_async_callback(vector_index.close)
    results = None
    if settings.redis_url and settings.result_cache_s > 0 and {"recall", "governance-audit"} & set(names):
        results = ResultCache(settings.redis_url, ttl_s=settings.result_cache_s)
        stack.push_async_callback(results.close)
    return Ports(embedder=embedder, vector_index=vector_index, results=results, distiller=distiller)


async def _disconnect(broker: NatsBroker) -> None:
    """Drain and close the broker's connection (what was published is flushed)."""
    try:
        await broker.stop()
    except Exception as exc:  # NATS away at shutdown: nothing left to drain; leave anyway
        log.warning("NATS connection could not be drained at shutdown (%r)", exc)
