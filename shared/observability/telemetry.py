"""OpenTelemetry tracing for every service: one process-wide tracer provider, the FastStream
middleware that carries ``traceparent`` through NATS headers, and helpers for code that
publishes with raw nats-py (the outbox relay) and so must inject the context itself.

Spans carry the semantic conventions' messaging attributes (``messaging.system="nats"``, the
destination subject, the consumer group) and GenAI memory attributes (``gen_ai.operation.name``
``search_memory`` / ``update_memory`` / ``delete_memory``, ``gen_ai.memory.store.id`` = the agent
config, ``gen_ai.memory.record.id`` = the entry) — ids only, never memory text."""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from faststream import BaseMiddleware
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, Tracer

from contracts import subjects as s

__all__ = [
    "TracePropagation",
    "annotate_consumer",
    "annotate_memory_operation",
    "broker_middleware",
    "extract_context",
    "inject_trace_headers",
    "nats_telemetry_middleware",
    "setup_telemetry",
    "tracer",
]

_log = logging.getLogger(__name__)

_EXPORTERS = ("console", "otlp", "none")
_OTLP_TRACES_PATH = "/v1/traces"
_TRACEPARENT = "traceparent"

# OpenTelemetry's global provider can be set once per process; we remember what we installed
# (and with which arguments) so a second call returns it instead of stacking processors.
_lock = threading.Lock()
_installed: tuple[tuple[str, str, str], TracerProvider] | None = None


def setup_telemetry(service_name: str, *, exporter: str, endpoint: str = "") -> TracerProvider | None:
    """Install the process-wide tracer provider and return it.

    ``console`` prints finished spans to stdout, ``otlp`` sends them over OTLP http/protobuf to
    ``endpoint`` (a collector base URL such as ``http://otel:4318``, or the full ``/v1/traces``
    URL), ``none`` installs nothing and returns ``None`` (the global no-op provider stays).
    Idempotent: later calls return the provider of the first one — the global can only be set
    once per process — and warn if they asked for something different.
    """
    global _installed
    if exporter not in _EXPORTERS:
        raise ValueError(f"unknown OpenTelemetry exporter {exporter!r}; use one of {', '.join(_EXPORTERS)}")
    if exporter == "none":
        return None
    wanted = (service_name, exporter, endpoint)
    with _lock:
        if _installed is not None:
            installed_with, provider = _installed
            if installed_with != wanted:
                _log.warning("telemetry already set up as %r; ignoring %r", installed_with, wanted)
            return provider
        provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
        provider.add_span_processor(BatchSpanProcessor(_span_exporter(exporter, endpoint)))
        trace.set_tracer_provider(provider)
        _installed = (wanted, provider)
        return provider


def _span_exporter(exporter: str, endpoint: str) -> SpanExporter:
    if exporter == "console":
        return ConsoleSpanExporter()
    if not endpoint:
        raise ValueError(
            "the otlp exporter needs an endpoint: set ENGRAM_OTEL_ENDPOINT (e.g. http://otel:4318)"
        )
    # Imported here: the OTLP exporter pulls in requests and protobuf, which console/none never need.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=_traces_url(endpoint))


def _traces_url(endpoint: str) -> str:
    """The collector's traces URL: a base URL gets ``/v1/traces`` like ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
    if urlsplit(endpoint).path.rstrip("/").endswith(_OTLP_TRACES_PATH):
        return endpoint
    return endpoint.rstrip("/") + _OTLP_TRACES_PATH


class TracePropagation(BaseMiddleware[Any, Any]):
    """The broker middleware of a process that exports no spans (``ENGRAM_OTEL_EXPORTER=none``):
    only carries the caller's trace context through, as FastStream's telemetry middleware does
    with the no-op tracer — a consumed message's ``traceparent`` (and ``tracestate``/``baggage``)
    becomes the current context while it is handled, and what the handler publishes (its reply
    too) carries the current context on. FastStream's middleware also makes and ends its no-op
    spans and observes no-op metrics: 0.15 ms a message on this machine (docs/benchmarks.md,
    "2026-12-02 — What FastStream costs the edge"), here spent for nothing. A batch starts no context, as
    there (its messages may belong to different traces)."""

    async def consume_scope(self, call_next: Callable[[Any], Awaitable[Any]], msg: Any) -> Any:
        headers = msg.headers
        if not headers or _TRACEPARENT not in headers or isinstance(msg.raw_message, list):
            return await call_next(msg)
        token = otel_context.attach(extract_context(headers))
        try:
            return await call_next(msg)
        finally:
            otel_context.detach(token)

    async def publish_scope(self, call_next: Callable[[Any], Awaitable[Any]], cmd: Any) -> Any:
        cmd.headers = inject_trace_headers(cmd.headers)  # unchanged without a trace context
        return await call_next(cmd)


def broker_middleware(
    provider: TracerProvider | None,
) -> type[BaseMiddleware[Any, Any]] | NatsTelemetryMiddleware:
    """The services' broker middleware: FastStream's telemetry middleware where spans are
    exported (:func:`setup_telemetry` returned a provider), else only :class:`TracePropagation`."""
    return TracePropagation if provider is None else nats_telemetry_middleware(provider)


def nats_telemetry_middleware(provider: TracerProvider | None) -> NatsTelemetryMiddleware:
    """FastStream's NATS middleware (``NatsBroker(middlewares=[...])``): a span per publish and
    per consume, with ``traceparent`` carried in the message headers. ``None`` uses the global
    provider, which is a no-op unless :func:`setup_telemetry` installed one."""
    return NatsTelemetryMiddleware(tracer_provider=provider)


def inject_trace_headers(headers: dict[str, str]) -> dict[str, str]:
    """A copy of ``headers`` plus the current trace context (``traceparent``, and ``tracestate``
    / ``baggage`` when set), for messages published with raw nats-py. Without an active span
    the copy is returned unchanged."""
    carrier = dict(headers)
    propagate.inject(carrier)
    return carrier


def extract_context(headers: Mapping[str, str] | None) -> Context:
    """The trace context carried by a message's headers, to parent a consumer's span on it
    (``tracer(...).start_as_current_span(name, context=extract_context(msg.headers))``)."""
    return propagate.extract(headers or {})


def tracer(name: str) -> Tracer:
    """A tracer from the global provider; safe to call before :func:`setup_telemetry` (the
    proxy it returns starts recording once a provider is installed)."""
    return trace.get_tracer(name)


#: The GenAI memory operation of each request-reply subject that reads or changes memories.
MEMORY_OPERATIONS = {
    s.RECALL: "search_memory",
    s.RECALL_EXPAND: "search_memory",
    s.MEMORY_LIST: "search_memory",
    s.MEMORY_GET: "search_memory",
    s.MEMORY_SAVE: "update_memory",
    s.MEMORY_MANAGE: "update_memory",
    s.MEMORY_FEEDBACK: "update_memory",
    s.SESSION_VALIDATED: "update_memory",
    s.MEMORY_DELETE: "delete_memory",
    s.MEMORY_PURGE: "delete_memory",
    s.MEMORY_PRUNE: "delete_memory",
}


def annotate_consumer(span: Span, subject: str, group: str) -> None:
    """The messaging attributes of a span that consumes ``subject`` as (queue group or durable)
    ``group``."""
    span.set_attribute("messaging.system", "nats")
    span.set_attribute("messaging.destination.name", subject)
    span.set_attribute("messaging.consumer.group.name", group)
    span.set_attribute("messaging.operation.type", "process")


def annotate_memory_operation(span: Span, subject: str, request: Any) -> None:
    """The GenAI memory attributes of a span handling ``subject`` for ``request`` (a parsed wire
    model): which operation, which store (agent config), which record (entry), when it names one."""
    operation = MEMORY_OPERATIONS.get(subject)
    if operation is None:
        return
    span.set_attribute("gen_ai.operation.name", operation)
    store = getattr(request, "agent_config_id", None)
    if store is not None:
        span.set_attribute("gen_ai.memory.store.id", str(store))
    record = getattr(request, "entry_id", None)
    if record is not None:
        span.set_attribute("gen_ai.memory.record.id", str(record))
