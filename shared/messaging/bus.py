"""JetStream plumbing: streams as code and the durables' consumer settings. Consuming them is
``shared.service.consumer``'s."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace

from faststream.nats import ConsumerConfig
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from contracts.operations import JETSTREAMS, StreamDef
from shared.observability.metrics import (
    CONSUMER_ACK_PENDING,
    CONSUMER_NUM_PENDING,
    STREAM_BYTES,
    STREAM_MESSAGES,
)

__all__ = [
    "configured_streams",
    "durable_config",
    "ensure_streams",
    "record_consumer_lag",
    "record_stream_usage",
    "stream_config",
]

log = logging.getLogger(__name__)


def stream_config(definition: StreamDef, *, replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=definition.name,
        subjects=list(definition.subjects),
        description=definition.description,
        retention=RetentionPolicy.WORK_QUEUE if definition.work_queue else RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=float(definition.max_age_seconds),
        duplicate_window=float(definition.duplicate_window_seconds),
        # A little above the payload limit ingest enforces, so oversize sessions still reach
        # ingest and are dead-lettered with a reason instead of vanishing at publish time.
        max_msg_size=definition.max_msg_bytes,
        num_replicas=replicas,
    )


def configured_streams(*, session_retention_s: int, dead_letter_retention_s: int) -> list[StreamDef]:
    """The contract's streams with the deployment's retention settings applied."""
    overrides = {"ENGRAM_SESSIONS": session_retention_s, "ENGRAM_DLQ": dead_letter_retention_s}
    return [replace(d, max_age_seconds=overrides.get(d.name, d.max_age_seconds)) for d in JETSTREAMS]


async def ensure_streams(
    js: JetStreamContext, definitions: Iterable[StreamDef] = JETSTREAMS, *, replicas: int = 1
) -> None:
    """Create the streams, or bring an existing one's config up to date (idempotent; a stream's
    replica count follows ``replicas`` too, which JetStream changes in place on a cluster)."""
    for definition in definitions:
        config = stream_config(definition, replicas=replicas)
        try:
            info = await js.stream_info(definition.name)
        except NotFoundError:
            await js.add_stream(config)
            continue
        if info.config.retention != config.retention:
            # JetStream cannot change a stream's retention in place; an empty stream is recreated,
            # one still holding messages is left as it is until an operator drains it.
            if info.state.messages == 0:
                await js.delete_stream(definition.name)
                await js.add_stream(config)
            else:
                log.error(
                    "stream %s has retention %s, the contract says %s; drain it and restart to switch",
                    definition.name,
                    info.config.retention,
                    config.retention,
                )
                config.retention = info.config.retention
                await js.update_stream(config)
            continue
        await js.update_stream(config)


def durable_config(ack_wait_s: float) -> ConsumerConfig:
    """Every durable's settings (ingest, distill, embed): redelivered ``ack_wait_s`` after a
    delivery nobody acknowledged — the time a crashed worker's messages wait before another takes
    them, so it is short; a live worker holds its messages longer with a heartbeat
    (``shared.service.consumer.Batch``). ``max_deliver=-1``: outages are retried without limit (model
    failures are counted in code)."""
    return ConsumerConfig(ack_wait=ack_wait_s, max_deliver=-1)


async def record_consumer_lag(js: JetStreamContext, durables: Iterable[tuple[str, str]]) -> None:
    """Set the lag gauges of each ``(stream, durable)`` from its consumer info (a metrics
    refresher: read when scraped, so the figure is current and nothing polls between scrapes)."""
    for stream, durable in durables:
        try:
            info = await js.consumer_info(stream, durable)
        except NotFoundError:  # not created yet (its service has not started): no figure
            continue
        CONSUMER_NUM_PENDING.labels(stream, durable).set(info.num_pending or 0)
        CONSUMER_ACK_PENDING.labels(stream, durable).set(info.num_ack_pending or 0)


async def record_stream_usage(js: JetStreamContext, streams: Iterable[str]) -> None:
    """Set the usage gauges of each stream from its info (a metrics refresher, like the lag's):
    with ``engram_jetstream_max_storage_bytes`` they show JetStream filling up before publishes
    are refused (infra/prometheus/alerts.yml: EngramJetStreamStorageNearLimit)."""
    for stream in streams:
        try:
            info = await js.stream_info(stream)
        except NotFoundError:  # not created yet
            continue
        STREAM_BYTES.labels(stream).set(info.state.bytes or 0)
        STREAM_MESSAGES.labels(stream).set(info.state.messages or 0)
