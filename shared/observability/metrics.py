"""Prometheus metrics for every Engram process: the instruments, in one place, and the exposition
any HTTP server calls (the health server of ``engram serve`` and ``engram up``, and the gateway's
``/metrics``).

Names follow Prometheus conventions (``engram_*``, base units, ``_total`` on counters). Labels
stay bounded: operations, codes, strategies, consumers, sources, cache names — never an
organization, an entry or a session id, and never memory text.

Some values are read when scraped (consumer lag, the outbox backlog): a component registers an
async *refresher* with :func:`add_refresher`, and :func:`exposition` awaits them (each bounded by
a timeout, so a wedged dependency delays a scrape by at most that) before rendering.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession

__all__ = [
    "AUDIT_RECORDS",
    "AUDIT_VERIFICATIONS",
    "CACHE_REQUESTS",
    "CONSUMER_ACK_PENDING",
    "CONSUMER_NUM_PENDING",
    "CONTENT_TYPE",
    "DEAD_LETTERS",
    "EMBEDDED",
    "EMBED_BACKLOG",
    "FILESYSTEM_FREE",
    "FILESYSTEM_SIZE",
    "HTTP_REQUESTS",
    "HTTP_SECONDS",
    "JETSTREAM_MAX_STORAGE",
    "OUTBOX_BACKLOG",
    "OUTBOX_PUBLISHED",
    "RECALL_SECONDS",
    "REQUESTS",
    "REQUESTS_LEFT",
    "REQUEST_SECONDS",
    "RETENTION_SWEEPS",
    "RETENTION_SWEPT",
    "STREAM_BYTES",
    "STREAM_MESSAGES",
    "Refresher",
    "add_refresher",
    "exposition",
    "on_commit",
    "refreshing",
    "set_filesystem",
]

log = logging.getLogger(__name__)

#: The process-wide registry (prometheus-client's default: it also carries ``process_*`` and
#: ``python_*`` metrics, e.g. ``process_resident_memory_bytes``).
REGISTRY_: CollectorRegistry = REGISTRY
CONTENT_TYPE = CONTENT_TYPE_LATEST
#: A refresher that has not answered within this bound is skipped for this scrape.
REFRESH_TIMEOUT_S = 2.0

# Request latencies: a NATS round trip is ~0.5 ms here, a recall tens of ms, a purge seconds.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

REQUESTS = Counter(
    "engram_requests",
    "Request-reply operations answered, by operation (subject) and SPEC 9 code (OK on success).",
    ["operation", "code"],
)
REQUEST_SECONDS = Histogram(
    "engram_request_duration_seconds",
    "Time to answer a request-reply operation, errors included.",
    ["operation"],
    buckets=_LATENCY_BUCKETS,
)
REQUESTS_LEFT = Counter(
    "engram_requests_left",
    "Requests left unanswered because they waited longer than their callers wait (a backlog).",
    ["operation"],
)
HTTP_REQUESTS = Counter(
    "engram_http_requests",
    "HTTP requests the gateway answered, by route (the operation's name, or the path of a "
    "probe) and status code.",
    ["route", "status"],
)
HTTP_SECONDS = Histogram(
    "engram_http_request_duration_seconds",
    "Time the gateway took to answer an HTTP request (the NATS round trip included).",
    ["route"],
    buckets=_LATENCY_BUCKETS,
)
RECALL_SECONDS = Histogram(
    "engram_recall_duration_seconds",
    "Time to answer engram.recall successfully, by the strategy that ran.",
    ["strategy"],
    buckets=_LATENCY_BUCKETS,
)
CONSUMER_NUM_PENDING = Gauge(
    "engram_jetstream_consumer_num_pending",
    "Messages in the stream not yet delivered to the durable (JetStream consumer info num_pending).",
    ["stream_name", "consumer_name"],
)
CONSUMER_ACK_PENDING = Gauge(
    "engram_jetstream_consumer_num_ack_pending",
    "Messages delivered to the durable and not yet acknowledged (num_ack_pending).",
    ["stream_name", "consumer_name"],
)
STREAM_BYTES = Gauge(
    "engram_jetstream_stream_bytes",
    "Bytes a stream holds (JetStream stream info state.bytes; read when scraped).",
    ["stream_name"],
)
STREAM_MESSAGES = Gauge(
    "engram_jetstream_stream_messages",
    "Messages a stream holds (JetStream stream info state.messages; read when scraped).",
    ["stream_name"],
)
JETSTREAM_MAX_STORAGE = Gauge(
    "engram_jetstream_max_storage_bytes",
    "The file storage JetStream may use on this deployment's server (its max_file_store), where "
    "Engram configures that server (the embedded one of engram up); beyond it publishes are "
    "refused (503 'insufficient resources', answered UNAVAILABLE).",
)
FILESYSTEM_FREE = Gauge(
    "engram_filesystem_free_bytes",
    "Free space (for unprivileged writers) on the filesystem holding a store's data dir, by store "
    "(postgres, nats), where this process runs that store (engram up's embedded ones).",
    ["store"],
)
FILESYSTEM_SIZE = Gauge(
    "engram_filesystem_size_bytes",
    "Size of the filesystem holding a store's data dir, by store (see engram_filesystem_free_bytes).",
    ["store"],
)
DEAD_LETTERS = Counter(
    "engram_dead_letters",
    "Events dead-lettered (committed), by source service and reason code.",
    ["source", "reason"],
)
OUTBOX_BACKLOG = Gauge(
    "engram_outbox_backlog_messages",
    "Committed outbox rows not yet published to NATS (read when scraped).",
)
OUTBOX_PUBLISHED = Counter("engram_outbox_published", "Outbox rows published to NATS by this process.")
EMBED_BACKLOG = Gauge(
    "engram_embed_backlog_entries",
    "Entries embed has fetched and not yet indexed (JetStream's side: the embed consumer's lag).",
)
EMBEDDED = Counter("engram_embedded_entries", "Entries embedded and indexed.")
CACHE_REQUESTS = Counter(
    "engram_cache_requests",
    "Cache look-ups by cache (recall_result, cue_vector) and result (hit, miss).",
    ["cache", "result"],
)
AUDIT_RECORDS = Counter("engram_audit_records", "Audit records appended (committed).")
AUDIT_VERIFICATIONS = Counter(
    "engram_audit_verifications",
    "Audit chain verifications run, by result (ok, failed).",
    ["result"],
)
RETENTION_SWEEPS = Counter("engram_retention_sweeps", "Retention sweeps completed.")
RETENTION_SWEPT = Counter("engram_retention_swept_entries", "Expired entries erased by retention sweeps.")

#: An async callable that sets gauges from a live source just before a scrape.
Refresher = Callable[[], Awaitable[None]]
_refreshers: list[Refresher] = []


def add_refresher(refresher: Refresher) -> Callable[[], None]:
    """Run ``refresher`` before each scrape; returns the function that removes it again."""
    _refreshers.append(refresher)

    def remove() -> None:
        with contextlib.suppress(ValueError):
            _refreshers.remove(refresher)

    return remove


@contextlib.contextmanager
def refreshing(*refreshers: Refresher) -> Iterator[None]:
    """Register ``refreshers`` for the duration of the block (a service's lifetime)."""
    removers = [add_refresher(r) for r in refreshers]
    try:
        yield
    finally:
        for remove in removers:
            remove()


async def exposition() -> tuple[bytes, str]:
    """The body and content type of a ``GET /metrics`` answer, after refreshing the live values."""

    async def bounded(refresher: Refresher) -> None:
        try:
            await asyncio.wait_for(refresher(), REFRESH_TIMEOUT_S)
        except Exception:  # a dependency away: the gauge keeps its last value
            log.debug("a metrics refresher failed; serving the last value", exc_info=True)

    await asyncio.gather(*(bounded(r) for r in list(_refreshers)))
    return generate_latest(REGISTRY_), CONTENT_TYPE


def set_filesystem(store: str, path: str) -> None:
    """Set the free-space gauges of ``store`` from the filesystem holding ``path`` (``statvfs``:
    what a non-root writer such as Postgres can still use)."""
    stat = os.statvfs(path)
    FILESYSTEM_FREE.labels(store).set(stat.f_bavail * stat.f_frsize)
    FILESYSTEM_SIZE.labels(store).set(stat.f_blocks * stat.f_frsize)


def on_commit(session: AsyncSession, count: Callable[[], None]) -> None:
    """Call ``count`` once ``session``'s transaction commits (never if it rolls back): a metric
    of what was written then counts only what is really there."""
    state = {"settled": False}

    def committed(_: object) -> None:
        if not state["settled"]:
            state["settled"] = True
            count()

    def rolled_back(_: object) -> None:
        state["settled"] = True

    event.listen(session.sync_session, "after_commit", committed, once=True)
    event.listen(session.sync_session, "after_rollback", rolled_back, once=True)
